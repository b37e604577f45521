package fencehttp_test

import (
	"context"
	"errors"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fencekit/fencekit/fence"
	"github.com/fencekit/fencekit/fencehttp"
	"github.com/fencekit/fencekit/fencewire"
)

// stallingService is a real HTTP server on loopback whose handler writes
// (records the call) and then stalls until the client gives up.
type stallingService struct {
	*httptest.Server
	wrote sync.Map // call id -> true, once the handler has written
	n     atomic.Int64
}

func newStallingService(t *testing.T) *stallingService {
	s := &stallingService{}
	s.Server = httptest.NewServer(&fencehttp.Handler{Require: true, Next: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		s.wrote.Store(r.Header.Get("Call"), true) // the write happens
		s.n.Add(1)
		<-r.Context().Done() // and no answer comes
	})})
	t.Cleanup(s.Close)
	return s
}

// handedTransport records the Call field of each request handed to it,
// then sends it through base.
type handedTransport struct {
	base  http.RoundTripper
	calls sync.Map // call id -> true
}

func (h *handedTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	h.calls.Store(req.Header.Get("Call"), true)
	return h.base.RoundTrip(req)
}

// callMany makes calls calls with a token from 4 goroutines through c, each
// bounded by ctxTimeout when it is not 0, and passes each call's ID and
// error to check with whether the handler had written by the time the call
// returned.
func callMany(t *testing.T, s *stallingService, c *http.Client, calls int, ctxTimeout time.Duration, check func(id string, err error, wrote bool)) {
	var next atomic.Int64
	var wg sync.WaitGroup
	for range 4 {
		wg.Go(func() {
			for {
				id := next.Add(1)
				if id > int64(calls) {
					return
				}
				ctx, cancel := context.WithCancel(t.Context())
				if ctxTimeout > 0 {
					ctx, cancel = context.WithTimeout(t.Context(), ctxTimeout)
				}
				ctx = fencewire.NewContext(ctx, fencewire.Value{Resource: "inventory/settle-orders", Token: fence.Token(id)})
				req, _ := http.NewRequestWithContext(ctx, http.MethodPost, s.URL, nil)
				req.Header.Set("Call", strconv.FormatInt(id, 10))
				resp, err := c.Do(req)
				if err == nil {
					_ = resp.Body.Close()
				}
				cancel()
				_, wrote := s.wrote.Load(req.Header.Get("Call"))
				check(req.Header.Get("Call"), err, wrote)
			}
		})
	}
	wg.Wait()
}

// A call with a token that times out is an unknown outcome, never a plain
// failure, whichever timer fires first (the Transport's, the context's,
// the handler's answer): hundreds of calls whose handler writes, then
// stalls.
func TestTimedOutCallsAreUnknown(t *testing.T) {
	const calls = 240
	for _, tc := range []struct {
		name       string
		transport  fencehttp.Transport
		ctxTimeout time.Duration
	}{
		{name: "Transport.Timeout", transport: fencehttp.Transport{Timeout: 20 * time.Millisecond}},
		{name: "context deadline", transport: fencehttp.Transport{Grace: 5 * time.Millisecond}, ctxTimeout: 20 * time.Millisecond},
		{name: "context deadline, no grace", transport: fencehttp.Transport{Grace: -1}, ctxTimeout: 20 * time.Millisecond},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := newStallingService(t)
			base := &http.Transport{}
			t.Cleanup(base.CloseIdleConnections)
			handed := &handedTransport{base: base}
			tr := tc.transport
			tr.Base = handed
			c := &http.Client{Transport: &tr}
			var plain, wrote atomic.Int64
			var first atomic.Pointer[error]
			callMany(t, s, c, calls, tc.ctxTimeout, func(id string, err error, w bool) {
				if w {
					wrote.Add(1)
				}
				unknown := errors.Is(err, fence.ErrOutcomeUnknown) && errors.Is(err, context.DeadlineExceeded)
				// Only a call never sent may say so: one whose context
				// ended before the Transport handed it on (a loaded
				// machine can take the 20 ms before that), or one cut
				// short while its connection was being made.
				_, wasHanded := handed.calls.Load(id)
				var oe *net.OpError
				neverSent := !w && !unknown && (!wasHanded || errors.As(err, &oe) && oe.Op == "dial")
				if !unknown && !neverSent {
					plain.Add(1)
					first.CompareAndSwap(nil, &err)
				}
			})
			if n := plain.Load(); n > 0 {
				t.Fatalf("%d of %d timed-out calls did not match fence.ErrOutcomeUnknown and context.DeadlineExceeded; the first: %v", n, calls, *first.Load())
			}
			if wrote.Load() == 0 {
				t.Fatalf("no handler had written before its call timed out: the test proved nothing")
			}
			t.Logf("%d calls, all unknown; the handler had written before %d of them returned", calls, wrote.Load())
		})
	}
}

// http.Client.Timeout replaces the Transport's error with a string when
// its own timer fires first, so a call with a token made through such a
// client is refused before it is sent, naming the fix: hundreds of calls,
// none a plain failure after the handler wrote, none sent. (When the
// client's timer fires even before the refusal is returned, the client
// replaces the refusal too, and its string still names the fix.)
func TestClientTimeoutIsRefused(t *testing.T) {
	const calls = 200
	s := newStallingService(t)
	base := &http.Transport{}
	t.Cleanup(base.CloseIdleConnections)
	c := &http.Client{Timeout: 20 * time.Millisecond, Transport: &fencehttp.Transport{Base: base}}
	var bad atomic.Int64
	var first atomic.Pointer[error]
	callMany(t, s, c, calls, 0, func(_ string, err error, wrote bool) {
		refused := errors.Is(err, fencehttp.ErrClientTimeout) || err != nil && strings.Contains(err.Error(), fencehttp.ErrClientTimeout.Error())
		if wrote && !errors.Is(err, fence.ErrOutcomeUnknown) || !wrote && !refused {
			bad.Add(1)
			first.CompareAndSwap(nil, &err)
		}
	})
	if n := bad.Load(); n > 0 {
		t.Fatalf("%d of %d calls through a client with a Timeout were neither refused before sending nor an unknown outcome; the first: %v", n, calls, *first.Load())
	}
	if n := s.n.Load(); n != 0 {
		t.Fatalf("the handler ran %d times; want every call refused before it was sent", n)
	}

	// Without a token the Transport does not interfere.
	req, _ := http.NewRequestWithContext(t.Context(), http.MethodGet, s.URL, nil)
	if _, err := c.Do(req); errors.Is(err, fencehttp.ErrClientTimeout) || errors.Is(err, fence.ErrOutcomeUnknown) {
		t.Fatalf("a call without a token = %v; want the client's own error", err)
	}
}

// A call whose context has ended before it is sent is not sent: a plain
// error with the context's cause, never an unknown outcome.
func TestEndedContextIsNotSent(t *testing.T) {
	s := newStallingService(t)
	base := &http.Transport{}
	t.Cleanup(base.CloseIdleConnections)
	c := &http.Client{Transport: &fencehttp.Transport{Base: base}}
	ctx, lose := context.WithCancelCause(t.Context())
	lose(errLeaseLost)
	ctx = fencewire.NewContext(ctx, fencewire.Value{Resource: "inventory/settle-orders", Token: 5})
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, s.URL, nil)
	_, err := c.Do(req)
	if !errors.Is(err, errLeaseLost) || !errors.Is(err, context.Canceled) || errors.Is(err, fence.ErrOutcomeUnknown) {
		t.Fatalf("a call after the lease was lost = %v; want a plain error naming the loss", err)
	}
	if n := s.n.Load(); n != 0 {
		t.Fatalf("the handler ran %d times", n)
	}
}
