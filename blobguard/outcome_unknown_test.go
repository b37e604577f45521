package blobguard_test

import (
	"errors"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/service/s3"

	"github.com/fencekit/fencekit/blobguard"
	"github.com/fencekit/fencekit/fence"
)

// wantOutcomeUnknown checks that err says a write's outcome is unknown.
func wantOutcomeUnknown(t *testing.T, err error) {
	t.Helper()
	if !errors.Is(err, fence.ErrOutcomeUnknown) {
		t.Fatalf("err = %v; want it to match fence.ErrOutcomeUnknown", err)
	}
}

// wantOutcomeKnown checks that err does not say that the outcome is
// unknown.
func wantOutcomeKnown(t *testing.T, err error) {
	t.Helper()
	if errors.Is(err, fence.ErrOutcomeUnknown) {
		t.Fatalf("err = %v; want a known outcome (not fence.ErrOutcomeUnknown)", err)
	}
}

// TestUnknownOutcomesExhausted: every PUT is answered 500 without reaching
// the server (SDK retries off), so the guard can never tell whether one
// landed: after MaxAttempts writes it reports an unknown outcome, not
// contention, and the object was in fact never written.
func TestUnknownOutcomesExhausted(t *testing.T) {
	t.Parallel()
	key := uniqueKey(t, "obj")
	var puts atomic.Int32
	client := faultClient(t, key, func(req *http.Request, next http.RoundTripper) (*http.Response, error) {
		if req.Method == http.MethodPut {
			puts.Add(1)
			return s3Error(req, http.StatusInternalServerError, "InternalError"), nil
		}
		return next.RoundTrip(req)
	}, func(o *s3.Options) { o.RetryMaxAttempts = 1 })
	g := newGuard(t, client, func(o *blobguard.Options) {
		o.MaxAttempts = 3
		o.MinBackoff, o.MaxBackoff = time.Millisecond, 5*time.Millisecond
	})
	_, err := g.Put(t.Context(), key, 2, strings.NewReader("maybe"))
	wantOutcomeUnknown(t, err)
	if errors.Is(err, blobguard.ErrContention) {
		t.Fatalf("Put: %v; an unknown outcome is not contention", err)
	}
	if puts.Load() != 3 {
		t.Fatalf("%d PUTs; want MaxAttempts = 3", puts.Load())
	}
	if _, err := g.Get(t.Context(), key); !errors.Is(err, fence.ErrNotFound) {
		t.Fatalf("Get: %v; want ErrNotFound", err)
	}
}
