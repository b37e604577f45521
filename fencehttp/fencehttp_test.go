package fencehttp_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/fencekit/fencekit/fence"
	"github.com/fencekit/fencekit/fencecheck"
	"github.com/fencekit/fencekit/fencehttp"
	"github.com/fencekit/fencekit/fencewire"
	"github.com/fencekit/fencekit/internal/testkit/faultnet"
)

// seen is what the handler behind the middleware saw.
type seen struct {
	calls  atomic.Int64
	value  atomic.Pointer[fencewire.Value]
	token  atomic.Uint64
	fields atomic.Pointer[[]string]
}

func (s *seen) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	s.calls.Add(1)
	v, _ := fencewire.FromContext(r.Context())
	s.value.Store(&v)
	tok, _ := fence.FromContext(r.Context())
	s.token.Store(uint64(tok))
	f := r.Header.Values(fencewire.HeaderName)
	s.fields.Store(&f)
	_, _ = io.WriteString(w, "ok")
}

// server starts a real HTTP server on loopback with h in front of a
// recording handler, and a client whose Transport sends tokens.
func server(t *testing.T, h *fencehttp.Handler) (*httptest.Server, *http.Client, *seen) {
	t.Helper()
	s := &seen{}
	h.Next = s
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	base := &http.Transport{}
	t.Cleanup(base.CloseIdleConnections)
	return srv, &http.Client{Transport: &fencehttp.Transport{Base: base}}, s
}

func get(t *testing.T, c *http.Client, ctx context.Context, u string) (*http.Response, error) {
	t.Helper()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := c.Do(req)
	if err == nil {
		t.Cleanup(func() { _ = resp.Body.Close() })
	}
	return resp, err
}

func TestTokenReachesTheHandler(t *testing.T) {
	srv, c, s := server(t, &fencehttp.Handler{})
	want := fencewire.Value{Resource: "jobs/café \"q\"", Token: 1<<63 + 12345}
	resp, err := get(t, c, fencewire.NewContext(t.Context(), want), srv.URL)
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("GET = %v, %v", resp, err)
	}
	if got := *s.value.Load(); got != want {
		t.Errorf("the handler's fencewire.FromContext = %+v; want %+v", got, want)
	}
	if got := fence.Token(s.token.Load()); got != want.Token {
		t.Errorf("the handler's fence.FromContext = %d; want %d", got, want.Token)
	}
	// Without a token in the context, and no Require: nothing is sent, and
	// the handler sees no token.
	if _, err := get(t, c, t.Context(), srv.URL); err != nil {
		t.Fatal(err)
	}
	if got := *s.fields.Load(); len(got) != 0 {
		t.Errorf("a request without a token carried %q", got)
	}
	if _, ok := fence.FromContext(context.Background()); ok || s.token.Load() != 0 {
		t.Errorf("the handler saw token %d for a request without one", s.token.Load())
	}
}

func TestTransportDoesNotChangeTheRequest(t *testing.T) {
	srv, c, _ := server(t, &fencehttp.Handler{Require: true})
	req, _ := http.NewRequestWithContext(fencewire.NewContext(t.Context(), fencewire.Value{Resource: "r", Token: 3}), http.MethodGet, srv.URL, nil)
	req.Header.Set("X-Other", "1")
	resp, err := c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	_ = resp.Body.Close()
	if _, has := req.Header[fencewire.HeaderName]; has || req.Header.Get("X-Other") != "1" {
		t.Errorf("the caller's request was changed: %v", req.Header)
	}
}

// problem sends a raw request with the given field lines and returns the
// status and decoded problem.
func problem(t *testing.T, u string, lines ...string) (int, fencewire.Problem) {
	t.Helper()
	req, _ := http.NewRequestWithContext(t.Context(), http.MethodPost, u, strings.NewReader("body"))
	for _, l := range lines {
		req.Header.Add(fencewire.HeaderName, l)
	}
	tr := &http.Transport{}
	defer tr.CloseIdleConnections()
	resp, err := tr.RoundTrip(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var p fencewire.Problem
	if resp.StatusCode != http.StatusOK {
		if ct := resp.Header.Get("Content-Type"); ct != fencewire.ProblemContentType {
			t.Errorf("status %d with Content-Type %q; want %s", resp.StatusCode, ct, fencewire.ProblemContentType)
		}
		if err := json.NewDecoder(resp.Body).Decode(&p); err != nil {
			t.Fatalf("decode the problem: %v", err)
		}
		if p.Status != resp.StatusCode {
			t.Errorf("problem status %d, response status %d", p.Status, resp.StatusCode)
		}
	}
	return resp.StatusCode, p
}

func TestBadFieldsAreRefusedBeforeTheHandler(t *testing.T) {
	for _, tc := range []struct {
		name    string
		h       fencehttp.Handler
		lines   []string
		problem string
	}{
		{"malformed", fencehttp.Handler{}, []string{`42;resource="r"`}, fencewire.ProblemMalformed},
		{"malformed even when optional", fencehttp.Handler{}, []string{`"1";resource=""`}, fencewire.ProblemMalformed},
		{"repeated lines", fencehttp.Handler{}, []string{`"1";resource="r"`, `"2";resource="r"`}, fencewire.ProblemMalformed},
		{"repeated identical lines", fencehttp.Handler{}, []string{`"1";resource="r"`, `"1";resource="r"`}, fencewire.ProblemMalformed},
		{"combined in one line", fencehttp.Handler{}, []string{`"1";resource="r", "2";resource="r"`}, fencewire.ProblemMalformed},
		{"empty line", fencehttp.Handler{Require: true}, []string{``}, fencewire.ProblemMalformed},
		{"missing, required", fencehttp.Handler{Require: true}, nil, fencewire.ProblemMissing},
		{"missing, checked", fencehttp.Handler{Checker: fencecheck.NewMemory()}, nil, fencewire.ProblemMissing},
	} {
		t.Run(tc.name, func(t *testing.T) {
			srv, _, s := server(t, &tc.h)
			status, p := problem(t, srv.URL, tc.lines...)
			if status != http.StatusBadRequest || p.Type != tc.problem {
				t.Errorf("status %d, problem %+v; want 400 and %s", status, p, tc.problem)
			}
			if p.Detail == "" {
				t.Errorf("the problem does not say what is wrong: %+v", p)
			}
			if n := s.calls.Load(); n != 0 {
				t.Errorf("the handler ran %d times for a refused request", n)
			}
		})
	}
}

func TestStaleRequestIsRejectedBeforeTheHandler(t *testing.T) {
	chk := fencecheck.NewMemory()
	srv, c, s := server(t, &fencehttp.Handler{Checker: chk})
	resource := fmt.Sprintf("jobs/%x", rand.Uint64())
	call := func(tok fence.Token) error {
		_, err := get(t, c, fencewire.NewContext(t.Context(), fencewire.Value{Resource: resource, Token: tok}), srv.URL)
		return err
	}
	for _, tok := range []fence.Token{5, 5, 9} {
		if err := call(tok); err != nil {
			t.Fatalf("token %d: %v", tok, err)
		}
	}
	before := s.calls.Load()
	err := call(5)
	se, ok := fence.AsStale(err)
	if !errors.Is(err, fence.ErrStaleToken) || !ok {
		t.Fatalf("a stale call returned %v; want a *fence.StaleError", err)
	}
	if se.Resource != resource || se.Presented != 5 || se.Current != 9 {
		t.Errorf("StaleError = %+v; want %s, presented 5, current 9", se, resource)
	}
	var ue *url.Error
	if !errors.As(err, &ue) {
		t.Errorf("http.Client's error %T is not a *url.Error", err)
	}
	if n := s.calls.Load() - before; n != 0 {
		t.Errorf("the handler ran for a stale request")
	}
	if got := chk.Current(resource); got != 9 {
		t.Errorf("the checker's token is %d after a stale call; want 9", got)
	}
	// KeepProblems: the response comes back as it is.
	keep := &http.Client{Transport: &fencehttp.Transport{Base: c.Transport.(*fencehttp.Transport).Base, KeepProblems: true}}
	resp, err := get(t, keep, fencewire.NewContext(t.Context(), fencewire.Value{Resource: resource, Token: 8}), srv.URL)
	if err != nil || resp.StatusCode != http.StatusConflict {
		t.Fatalf("with KeepProblems: %v, %v; want a 409 response", resp, err)
	}
	rerr := fencehttp.ResponseError(resp)
	if se, ok := fence.AsStale(rerr); !ok || se.Presented != 8 || se.Current != 9 {
		t.Errorf("ResponseError = %v", rerr)
	}
	if b, _ := io.ReadAll(resp.Body); !strings.Contains(string(b), fencewire.ProblemStale) {
		t.Errorf("ResponseError did not put the body back: %q", b)
	}
}

func TestTransportRefusesBeforeIO(t *testing.T) {
	var hits atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(http.ResponseWriter, *http.Request) { hits.Add(1) }))
	t.Cleanup(srv.Close)
	base := &http.Transport{}
	t.Cleanup(base.CloseIdleConnections)
	for _, tc := range []struct {
		name    string
		tr      *fencehttp.Transport
		ctx     context.Context
		preset  string // the header key the caller set the field under, if any
		wantErr error
	}{
		{"token 0", &fencehttp.Transport{}, fencewire.NewContext(t.Context(), fencewire.Value{Resource: "r"}), "", fence.ErrInvalidToken},
		{"bad resource", &fencehttp.Transport{}, fencewire.NewContext(t.Context(), fencewire.Value{Resource: "a\x00b", Token: 1}), "", fencewire.ErrInvalid},
		{"two tokens", &fencehttp.Transport{}, fencewire.NewContext(t.Context(), fencewire.Value{Resource: "r", Token: 1}), fencewire.HeaderName, fencehttp.ErrTwoTokens},
		{"two tokens, one set in lower case", &fencehttp.Transport{}, fencewire.NewContext(t.Context(), fencewire.Value{Resource: "r", Token: 1}), "fencing-token", fencehttp.ErrTwoTokens},
		{"required", &fencehttp.Transport{Require: true}, t.Context(), "", fencehttp.ErrNoToken},
		{"required, token only through fence", &fencehttp.Transport{Require: true}, fence.NewContext(t.Context(), 7), "", fencehttp.ErrNoToken},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tc.tr.Base = base
			body := &closeCounter{Reader: strings.NewReader("x")}
			req, _ := http.NewRequestWithContext(tc.ctx, http.MethodPost, srv.URL, body)
			if tc.preset != "" {
				req.Header[tc.preset] = []string{`"1";resource="r"`} // as the caller spelled it: sent as it is
			}
			resp, err := (&http.Client{Transport: tc.tr}).Do(req)
			if err == nil {
				_ = resp.Body.Close()
			}
			if !errors.Is(err, tc.wantErr) {
				t.Errorf("Do = %v; want %v", err, tc.wantErr)
			}
			if body.closed.Load() == 0 {
				t.Errorf("the request's body was not closed")
			}
		})
	}
	if n := hits.Load(); n != 0 {
		t.Errorf("%d refused requests reached the server", n)
	}
}

type closeCounter struct {
	io.Reader
	closed atomic.Int64
}

func (c *closeCounter) Close() error { c.closed.Add(1); return nil }

func TestHandlerWriteError(t *testing.T) {
	srv := httptest.NewServer(&fencehttp.Handler{Require: true, Next: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		v, _ := fencewire.FromContext(r.Context())
		// The handler's own guarded write was rejected.
		if !fencehttp.WriteError(w, fmt.Errorf("write: %w", fence.Stale("row 1", v.Token, v.Token+1))) {
			t.Error("WriteError did not recognize a stale error")
		}
	})})
	t.Cleanup(srv.Close)
	base := &http.Transport{}
	t.Cleanup(base.CloseIdleConnections)
	c := &http.Client{Transport: &fencehttp.Transport{Base: base}}
	_, err := get(t, c, fencewire.NewContext(t.Context(), fencewire.Value{Resource: "jobs/w", Token: 41}), srv.URL)
	if se, ok := fence.AsStale(err); !ok || se.Resource != "row 1" || se.Presented != 41 || se.Current != 42 {
		t.Fatalf("err = %v; want the handler's StaleError", err)
	}
	if fencehttp.WriteError(httptest.NewRecorder(), errors.New("other")) {
		t.Error("WriteError took a plain error for a stale one")
	}
}

// failingChecker fails every check, as a checker whose store is down does.
type failingChecker struct{}

func (failingChecker) Check(context.Context, string, fence.Token) error {
	return errors.New("connection refused")
}

func TestCheckerFailureIs503(t *testing.T) {
	srv, c, s := server(t, &fencehttp.Handler{Checker: failingChecker{}, Logger: discard()})
	_, err := get(t, c, fencewire.NewContext(t.Context(), fencewire.Value{Resource: "r", Token: 1}), srv.URL)
	if !errors.Is(err, fencewire.ErrUnavailable) || errors.Is(err, fence.ErrStaleToken) {
		t.Fatalf("err = %v; want fencewire.ErrUnavailable", err)
	}
	if s.calls.Load() != 0 {
		t.Error("the handler ran although the token was not checked")
	}
}

// A request with a token whose reply is lost after the handler ran is an
// unknown outcome, like a guard's write whose answer was lost; one that
// could not connect is a plain failure.
func TestLostReplyIsUnknown(t *testing.T) {
	var ran atomic.Int64
	srv := httptest.NewServer(&fencehttp.Handler{Require: true, Next: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ran.Add(1) // the handler's write happens
	})})
	t.Cleanup(srv.Close)
	base := &http.Transport{}
	t.Cleanup(base.CloseIdleConnections)
	lossy := &faultnet.ReplyLoser{Next: base} // and the reply is lost
	lossy.Arm()
	c := &http.Client{Transport: &fencehttp.Transport{Base: lossy}}
	ctx := fencewire.NewContext(t.Context(), fencewire.Value{Resource: "r", Token: 3})
	req, _ := http.NewRequestWithContext(ctx, http.MethodPut, srv.URL, strings.NewReader("x"))
	_, err := c.Do(req)
	if !errors.Is(err, fence.ErrOutcomeUnknown) || ran.Load() != 1 || lossy.Lost() != 1 {
		t.Fatalf("a lost reply after the handler ran (%d, %d replies lost) = %v; want fence.ErrOutcomeUnknown", ran.Load(), lossy.Lost(), err)
	}

	closed := httptest.NewServer(http.NotFoundHandler())
	u := closed.URL
	closed.Close() // nothing listens there now
	req, _ = http.NewRequestWithContext(ctx, http.MethodPut, u, strings.NewReader("x"))
	if _, err := c.Do(req); err == nil || errors.Is(err, fence.ErrOutcomeUnknown) {
		t.Fatalf("a request that could not connect = %v; want a plain error", err)
	}
}
