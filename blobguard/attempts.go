package blobguard

import (
	"context"
	"sync/atomic"

	"github.com/aws/aws-sdk-go-v2/service/s3"
	"github.com/aws/smithy-go/middleware"
)

// attemptTracker counts how many times the SDK got a request past signing,
// that is, how many HTTP attempts (first try and SDK retries) it started.
// The middleware sits at the end of the Finalize step, inside the SDK's
// retry loop and after signing, so an error with no attempts counted was
// never sent.
type attemptTracker struct {
	applied  bool // the client applied the option function
	attempts atomic.Int32
}

func (t *attemptTracker) sent() int32 { return t.attempts.Load() }

func (t *attemptTracker) option(o *s3.Options) {
	t.applied = true
	o.APIOptions = append(o.APIOptions, func(st *middleware.Stack) error {
		return st.Finalize.Add(middleware.FinalizeMiddlewareFunc("blobguardAttempts",
			func(ctx context.Context, in middleware.FinalizeInput, next middleware.FinalizeHandler) (middleware.FinalizeOutput, middleware.Metadata, error) {
				t.attempts.Add(1)
				return next.HandleFinalize(ctx, in)
			}), middleware.After)
	})
}
