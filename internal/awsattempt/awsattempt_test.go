package awsattempt

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"github.com/aws/smithy-go"
	"github.com/aws/smithy-go/middleware"
)

// send runs the option functions an SDK client applies to its stack, then
// the stack n times (one attempt each, as its retry loop would).
func send(t *testing.T, tr *Tracker, apply bool, n int) {
	t.Helper()
	var opts []func(*middleware.Stack) error
	if apply {
		tr.Add(&opts)
	}
	st := middleware.NewStack("op", func() any { return nil })
	for _, o := range opts {
		if err := o(st); err != nil {
			t.Fatal(err)
		}
	}
	h := middleware.DecorateHandler(middleware.HandlerFunc(func(context.Context, any) (any, middleware.Metadata, error) {
		return nil, middleware.Metadata{}, nil
	}), st)
	for range n {
		if _, _, err := h.Handle(t.Context(), nil); err != nil {
			t.Fatal(err)
		}
	}
}

func TestTracker(t *testing.T) {
	for _, tc := range []struct {
		name             string
		apply            bool
		attempts         int
		retried, neither bool
	}{
		{"never sent", true, 0, false, true},
		{"sent once", true, 1, false, false},
		{"retried by the SDK", true, 3, true, false},
		{"option ignored by the client", false, 1, true, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var tr Tracker
			send(t, &tr, tc.apply, tc.attempts)
			if tr.Retried() != tc.retried || tr.NeverSent() != tc.neither {
				t.Fatalf("%d attempts (option applied: %v): Retried %v, NeverSent %v; want %v, %v",
					tr.Sent(), tc.apply, tr.Retried(), tr.NeverSent(), tc.retried, tc.neither)
			}
		})
	}
}

type statusErr struct{ code int }

func (e statusErr) Error() string       { return fmt.Sprint(e.code) }
func (e statusErr) HTTPStatusCode() int { return e.code }

func TestStatusAndCode(t *testing.T) {
	err := fmt.Errorf("put: %w", errors.Join(statusErr{412}, &smithy.GenericAPIError{Code: "PreconditionFailed"}))
	if HTTPStatus(err) != 412 || APICode(err) != "PreconditionFailed" {
		t.Fatalf("HTTPStatus %d, APICode %q", HTTPStatus(err), APICode(err))
	}
	if HTTPStatus(errors.New("dial")) != 0 || APICode(errors.New("dial")) != "" {
		t.Fatal("an error without a response has a status or a code")
	}
}
