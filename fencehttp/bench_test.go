package fencehttp_test

import (
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/fencekit/fencekit/fence"
	"github.com/fencekit/fencekit/fencecheck"
	"github.com/fencekit/fencekit/fencehttp"
	"github.com/fencekit/fencekit/fencewire"
	"github.com/fencekit/fencekit/internal/testkit/pairbench"
)

// BenchmarkRequest: one GET over a real loopback server, plain, with the
// token sent and read (Transport + Handler), and also checked in memory,
// interleaved call by call (internal/testkit/pairbench): token/plain and
// checked/plain are medians of per-iteration ratios.
//
//	go test -run '^$' -bench Request -count 6 ./fencehttp/ > bench.txt
//	go run golang.org/x/perf/cmd/benchstat@latest bench.txt
func BenchmarkRequest(b *testing.B) {
	ok := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { _, _ = io.WriteString(w, "ok") })
	tok := fence.Token(1764636000000001)
	op := func(name string, h http.Handler, fenced bool) pairbench.Op {
		base := &http.Transport{}
		b.Cleanup(base.CloseIdleConnections)
		var rt http.RoundTripper = base
		if fenced {
			rt = &fencehttp.Transport{Base: base}
		}
		srv := httptest.NewServer(h)
		b.Cleanup(srv.Close)
		client := &http.Client{Transport: rt}
		return pairbench.Op{Name: name, Call: func() error {
			tok++
			ctx := fencewire.NewContext(context.Background(), fencewire.Value{Resource: "jobs/nightly", Token: tok})
			req, _ := http.NewRequestWithContext(ctx, http.MethodGet, srv.URL, nil)
			resp, err := client.Do(req)
			if err != nil {
				return err
			}
			_, _ = io.Copy(io.Discard, resp.Body)
			_ = resp.Body.Close()
			if resp.StatusCode != http.StatusOK {
				return errors.New(resp.Status)
			}
			return nil
		}}
	}
	pairbench.Run(b,
		op("plain", ok, false),
		op("token", &fencehttp.Handler{Require: true, Next: ok}, true),
		op("checked", &fencehttp.Handler{Checker: fencecheck.NewMemory(), Next: ok}, true),
	)
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
