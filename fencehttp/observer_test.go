package fencehttp_test

import (
	"errors"
	"net/http"
	"net/http/httptest"
	"net/url"
	"testing"
	"time"

	"github.com/fencekit/fencekit/fence"
	"github.com/fencekit/fencekit/fencecheck"
	"github.com/fencekit/fencekit/fencehttp"
	"github.com/fencekit/fencekit/fencewire"
	"github.com/fencekit/fencekit/guardtest"
)

// The Transport reports one event per call that carries a token, and the
// Handler one per call it admits or refuses, each with the outcome the
// caller (or the refusal) got, over a real HTTP server on loopback.
func TestObserversSeeEveryFencedCall(t *testing.T) {
	server, client := &guardtest.Recorder{}, &guardtest.Recorder{}
	block := make(chan struct{})
	h := &fencehttp.Handler{Checker: fencecheck.NewMemory(), Observer: server,
		Next: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if r.URL.Path == "/hang" {
				<-block // never answers: the call's answer is lost
			}
		})}
	srv := httptest.NewServer(h)
	defer srv.Close()
	defer close(block)
	base := &http.Transport{}
	defer base.CloseIdleConnections()
	tr := &fencehttp.Transport{Base: base, Observer: client, Timeout: 200 * time.Millisecond}
	c := &http.Client{Transport: tr}
	host := srv.Listener.Addr().String()
	call := func(path string, v fencewire.Value) error {
		req, err := http.NewRequestWithContext(fencewire.NewContext(t.Context(), v), http.MethodPost, srv.URL+path, nil)
		if err != nil {
			t.Fatal(err)
		}
		resp, err := c.Do(req)
		if err == nil {
			resp.Body.Close()
		}
		if ue, ok := err.(*url.Error); ok {
			return ue.Err
		}
		return err
	}
	want := func(op, res string, token fence.Token, o fence.Outcome) guardtest.Want {
		return guardtest.Want{Guard: "fencehttp", Class: host, Op: op, Resource: res, Token: token, Outcome: o}
	}

	err := call("/", fencewire.Value{Resource: "inventory/7", Token: 5})
	client.One(t, want("call", "inventory/7", 5, fence.Accepted), err)
	server.One(t, want("admit", "inventory/7", 5, fence.Accepted), nil)

	err = call("/", fencewire.Value{Resource: "inventory/7", Token: 4})
	client.One(t, want("call", "inventory/7", 4, fence.Rejected), err)
	if e := server.Take(); len(e) != 1 || e[0].Outcome != fence.Rejected || e[0].Op != "admit" || e[0].Token != 4 {
		t.Fatalf("the handler's events for a stale call: %+v", e)
	}

	// A value that cannot be sent: refused before it leaves, a failure,
	// and nothing reaches the handler.
	err = call("/", fencewire.Value{Resource: "inventory/7"})
	client.One(t, want("call", "inventory/7", fence.None, fence.Failed), err)
	if e := server.Take(); len(e) != 0 {
		t.Fatalf("the handler reported a call that never reached it: %+v", e)
	}

	// A call without a token is not fenced on the client; the handler,
	// whose Checker requires one, refuses it.
	req, _ := http.NewRequestWithContext(t.Context(), http.MethodGet, srv.URL, nil)
	_, err = c.Do(req)
	if !errors.Is(err, fencewire.ErrRejected) {
		t.Fatalf("a call without a token to a Handler with a Checker: %v", err)
	}
	if a, b := client.Take(), server.Take(); len(a) != 0 || len(b) != 1 || b[0].Outcome != fence.Failed || b[0].Op != "admit" {
		t.Fatalf("a call without a token: client events %+v, handler events %+v (want none, and one refusal)", a, b)
	}

	// A call whose answer never comes is an unknown outcome.
	err = call("/hang", fencewire.Value{Resource: "inventory/8", Token: 9})
	client.One(t, want("call", "inventory/8", 9, fence.Unknown), err)
	server.One(t, want("admit", "inventory/8", 9, fence.Accepted), nil)
}
