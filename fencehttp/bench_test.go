package fencehttp_test

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/fencekit/fencekit/fence"
	"github.com/fencekit/fencekit/fencecheck"
	"github.com/fencekit/fencekit/fencehttp"
	"github.com/fencekit/fencekit/fencewire"
)

// Benchmarks over a real loopback server: the same request plain, with
// the token sent and read (Transport + Handler), and with it also checked
// in memory. Compare with:
//
//	go test -run '^$' -bench . -count 6 ./fencehttp/ > bench.txt
//	go run golang.org/x/perf/cmd/benchstat@latest -col /kind bench.txt
func BenchmarkRequest(b *testing.B) {
	ok := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { _, _ = io.WriteString(w, "ok") })
	for _, kind := range []string{"plain", "token", "checked"} {
		b.Run("kind="+kind, func(b *testing.B) {
			var h http.Handler = ok
			base := &http.Transport{}
			defer base.CloseIdleConnections()
			var rt http.RoundTripper = base
			switch kind {
			case "token":
				h = &fencehttp.Handler{Require: true, Next: ok}
				rt = &fencehttp.Transport{Base: base}
			case "checked":
				h = &fencehttp.Handler{Checker: fencecheck.NewMemory(), Next: ok}
				rt = &fencehttp.Transport{Base: base}
			}
			srv := httptest.NewServer(h)
			defer srv.Close()
			client := &http.Client{Transport: rt}
			tok := fence.Token(1764636000000001)
			for b.Loop() {
				tok++
				ctx := fencewire.NewContext(context.Background(), fencewire.Value{Resource: "jobs/nightly", Token: tok})
				req, _ := http.NewRequestWithContext(ctx, http.MethodGet, srv.URL, nil)
				resp, err := client.Do(req)
				if err != nil {
					b.Fatal(err)
				}
				_, _ = io.Copy(io.Discard, resp.Body)
				_ = resp.Body.Close()
				if resp.StatusCode != http.StatusOK {
					b.Fatal(resp.Status)
				}
			}
		})
	}
}

// BenchmarkField: formatting and parsing one field value.
func BenchmarkField(b *testing.B) {
	v := fencewire.Value{Resource: "jobs/nightly", Token: 1764636000000001}
	b.Run("op=format", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if _, err := fencewire.Format(v); err != nil {
				b.Fatal(err)
			}
		}
	})
	s, _ := fencewire.Format(v)
	b.Run("op=parse", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if _, err := fencewire.Parse(s); err != nil {
				b.Fatal(err)
			}
		}
	})
}
