package fencehttp_test

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"

	"github.com/fencekit/fencekit/fence"
	"github.com/fencekit/fencekit/fencecheck"
	"github.com/fencekit/fencekit/fencehttp"
	"github.com/fencekit/fencekit/fencewire"
)

// A downstream service checks the callers' tokens before its handler
// runs; a stale holder's call fails with the same *fence.StaleError its
// stale SQL write would.
func Example() {
	service := &fencehttp.Handler{
		Checker: fencecheck.NewMemory(), // sqlguard.Checker or redischeck.Checker for replicas
		Next: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			tok, _ := fence.FromContext(r.Context()) // for the handler's own guarded writes
			fmt.Fprintf(w, "written with token %d", tok)
		}),
	}
	srv := httptest.NewServer(service)
	defer srv.Close()

	client := &http.Client{Transport: &fencehttp.Transport{Require: true}}
	call := func(tok fence.Token) {
		ctx := fencewire.NewContext(context.Background(), fencewire.Value{Resource: "jobs/report", Token: tok})
		req, _ := http.NewRequestWithContext(ctx, http.MethodPost, srv.URL, nil)
		resp, err := client.Do(req)
		if se, ok := fence.AsStale(err); ok {
			fmt.Printf("rejected: presented %d, current %d\n", se.Presented, se.Current)
			return
		}
		if err != nil {
			fmt.Println(err)
			return
		}
		defer resp.Body.Close()
		fmt.Println(resp.Status)
	}
	call(33) // A, holding the lease
	call(34) // B, after A's lease expired
	call(33) // A again, after a pause
	// Output:
	// 200 OK
	// 200 OK
	// rejected: presented 33, current 34
}
