// Package awsattempt tells, for one AWS SDK request, whether it was sent
// and whether the SDK's own retries sent it more than once: what a guard
// needs to tell a request that failed before it left from one whose
// outcome is unknown, and an answer about the last try from one about
// the first. blobguard and dynamoguard share it; it needs only smithy-go,
// so a user of one AWS guard inherits no other service's client.
//
// A Tracker counts the HTTP attempts of one call: add it through the
// call's option function,
//
//	var tr awsattempt.Tracker
//	out, err := client.PutObject(ctx, in, func(o *s3.Options) { tr.Add(&o.APIOptions) })
//
// Its middleware sits at the end of the Finalize step, inside the SDK's
// retry loop and after signing: an error with no attempt counted was
// never sent, and more than one attempt means that an earlier try may
// have been applied whatever the last one was told.
package awsattempt

import (
	"context"
	"errors"
	"sync/atomic"

	"github.com/aws/smithy-go"
	"github.com/aws/smithy-go/middleware"
)

// Tracker counts the HTTP attempts of one call. The zero value is ready;
// use one Tracker per call.
type Tracker struct {
	applied  atomic.Bool // the client applied the option function
	attempts atomic.Int32
}

// Add appends the counting middleware to apiOptions, a service client's
// Options.APIOptions, from the call's option function.
func (t *Tracker) Add(apiOptions *[]func(*middleware.Stack) error) {
	t.applied.Store(true)
	*apiOptions = append(*apiOptions, func(st *middleware.Stack) error {
		return st.Finalize.Add(middleware.FinalizeMiddlewareFunc("fencekitAttempts",
			func(ctx context.Context, in middleware.FinalizeInput, next middleware.FinalizeHandler) (middleware.FinalizeOutput, middleware.Metadata, error) {
				t.attempts.Add(1)
				return next.HandleFinalize(ctx, in)
			}), middleware.After)
	})
}

// Sent returns how many HTTP attempts the call started.
func (t *Tracker) Sent() int32 { return t.attempts.Load() }

// Retried reports whether an earlier try of the call may have been
// applied, whatever the last answer said: the SDK sent it more than once,
// or the attempts could not be counted (the client ignored the option
// function).
func (t *Tracker) Retried() bool { return t.Sent() > 1 || !t.applied.Load() }

// NeverSent reports whether the call never got past signing: nothing
// reached the server.
func (t *Tracker) NeverSent() bool { return t.applied.Load() && t.Sent() == 0 }

// HTTPStatus returns the HTTP status of the response err carries, or 0
// when there was none.
func HTTPStatus(err error) int {
	var re interface{ HTTPStatusCode() int }
	if errors.As(err, &re) {
		return re.HTTPStatusCode()
	}
	return 0
}

// APICode returns the service's error code err carries
// ("PreconditionFailed", "ResourceNotFoundException"), or "".
func APICode(err error) string {
	var ae smithy.APIError
	if errors.As(err, &ae) {
		return ae.ErrorCode()
	}
	return ""
}
