package fencehttp_test

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fencekit/fencekit/fence"
	"github.com/fencekit/fencekit/fencecheck"
	"github.com/fencekit/fencekit/fencehttp"
	"github.com/fencekit/fencekit/fencewire"
)

// errLeaseLost stands for the cause a lease's context is cancelled with.
var errLeaseLost = errors.New("lease: lost")

// losingChecker cancels the caller's context (its lease is lost) once the
// request has reached the service, then checks: the refusal is written
// after the caller's context ended.
type losingChecker struct {
	fencecheck.Checker
	lose atomic.Pointer[context.CancelCauseFunc]
}

func (c *losingChecker) Check(ctx context.Context, resource string, tok fence.Token) error {
	(*c.lose.Load())(errLeaseLost)
	return c.Checker.Check(ctx, resource, tok)
}

// A stale holder's call that the service refused reaches the caller as
// stale, with both tokens, even when the caller's lease was lost while the
// call was on its way: the service's answer says what happened to it, and
// "outcome unknown" would hide that nothing was written.
func TestStaleRefusalAfterLeaseLossIsStale(t *testing.T) {
	mem := fencecheck.NewMemory()
	if err := mem.Check(t.Context(), "inventory/settle-orders", 90); err != nil {
		t.Fatal(err)
	}
	var handled atomic.Int64
	checker := &losingChecker{Checker: mem}
	srv := httptest.NewServer(&fencehttp.Handler{Checker: checker,
		Next: http.HandlerFunc(func(http.ResponseWriter, *http.Request) { handled.Add(1) })})
	t.Cleanup(srv.Close)
	base := &http.Transport{}
	t.Cleanup(base.CloseIdleConnections)
	// The answer comes at once; a long grace keeps a loaded machine from
	// deciding the test.
	c := &http.Client{Transport: &fencehttp.Transport{Base: base, Grace: time.Minute}}
	for i := range 50 {
		ctx, lose := context.WithCancelCause(t.Context())
		checker.lose.Store(&lose)
		ctx = fencewire.NewContext(ctx, fencewire.Value{Resource: "inventory/settle-orders", Token: 77})
		req, _ := http.NewRequestWithContext(ctx, http.MethodPost, srv.URL, nil)
		resp, err := c.Do(req)
		if err == nil {
			_ = resp.Body.Close()
		}
		se, ok := fence.AsStale(err)
		if !ok || errors.Is(err, fence.ErrOutcomeUnknown) || se.Presented != 77 || se.Current != 90 || se.Resource != "inventory/settle-orders" {
			t.Fatalf("call %d, refused as stale after the caller's lease was lost: err = %v; want only a *fence.StaleError naming 77 and 90", i, err)
		}
	}
	if n := handled.Load(); n != 0 {
		t.Fatalf("the handler ran %d times", n)
	}
}
