package dynamoguard

import (
	"context"
	"errors"
	"sync/atomic"

	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/smithy-go/middleware"
)

// attemptTracker counts how many times the SDK got a request past signing,
// that is, how many HTTP attempts (the first try and the SDK's retries) it
// started. The middleware sits at the end of the Finalize step, inside the
// SDK's retry loop and after signing, so an error with no attempt counted
// was never sent, and more than one attempt means an earlier try may have
// been applied whatever the last one was told.
type attemptTracker struct {
	applied  bool // the client applied the option function
	attempts atomic.Int32
}

func (t *attemptTracker) sent() int32 { return t.attempts.Load() }

func (t *attemptTracker) option(o *dynamodb.Options) {
	t.applied = true
	o.APIOptions = append(o.APIOptions, func(st *middleware.Stack) error {
		return st.Finalize.Add(middleware.FinalizeMiddlewareFunc("dynamoguardAttempts",
			func(ctx context.Context, in middleware.FinalizeInput, next middleware.FinalizeHandler) (middleware.FinalizeOutput, middleware.Metadata, error) {
				t.attempts.Add(1)
				return next.HandleFinalize(ctx, in)
			}), middleware.After)
	})
}

func httpStatus(err error) int {
	var re interface{ HTTPStatusCode() int }
	if errors.As(err, &re) {
		return re.HTTPStatusCode()
	}
	return 0
}
