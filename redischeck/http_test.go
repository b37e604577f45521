package redischeck_test

import (
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"

	"github.com/fencekit/fencekit/fence"
	"github.com/fencekit/fencekit/fencehttp"
	"github.com/fencekit/fencekit/fencewire"
	"github.com/fencekit/fencekit/lease/redislease/redistest"
)

// Two replicas of one service behind real HTTP servers on loopback share
// a Redis checker: the newer holder calls one replica, and the stale
// holder's late call to the other is rejected there before its handler
// runs, with both tokens.
func TestReplicasShareOneOrder(t *testing.T) {
	c := newChecker(t, redistest.Shared(t))
	var handled atomic.Int64
	next := http.HandlerFunc(func(http.ResponseWriter, *http.Request) { handled.Add(1) })
	replica1 := httptest.NewServer(&fencehttp.Handler{Checker: c, Next: next})
	t.Cleanup(replica1.Close)
	replica2 := httptest.NewServer(&fencehttp.Handler{Checker: c, Next: next})
	t.Cleanup(replica2.Close)
	base := &http.Transport{}
	t.Cleanup(base.CloseIdleConnections)
	client := &http.Client{Transport: &fencehttp.Transport{Base: base, Require: true}}
	call := func(url string, tok fence.Token) error {
		req, _ := http.NewRequestWithContext(fencewire.NewContext(t.Context(), fencewire.Value{Resource: "jobs/report", Token: tok}), http.MethodPost, url, nil)
		resp, err := client.Do(req)
		if err == nil {
			_ = resp.Body.Close()
		}
		return err
	}
	if err := call(replica1.URL, 1764636000000001); err != nil { // A, while it holds the lease
		t.Fatal(err)
	}
	if err := call(replica1.URL, 1764636000000950); err != nil { // B, after A's lease expired
		t.Fatal(err)
	}
	err := call(replica2.URL, 1764636000000001) // A wakes up
	se, ok := fence.AsStale(err)
	if !ok || se.Presented != 1764636000000001 || se.Current != 1764636000000950 || se.Resource != "jobs/report" {
		t.Fatalf("A's late call = %v; want a *fence.StaleError naming both tokens", err)
	}
	if n := handled.Load(); n != 2 {
		t.Fatalf("the handlers ran %d times; want 2 (A's late call never reaches one)", n)
	}
}
