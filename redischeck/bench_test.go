package redischeck_test

import (
	"context"
	"testing"

	"github.com/fencekit/fencekit/fence"
	"github.com/fencekit/fencekit/internal/redistest"
)

// BenchmarkCheck: one check on the real Redis, beside the floor of one
// round trip (a GET of the same key).
//
//	go test -run '^$' -bench . -count 6 ./redischeck/ > bench.txt
//	go run golang.org/x/perf/cmd/benchstat@latest -col /kind bench.txt
func BenchmarkCheck(b *testing.B) {
	rdb := redistest.Shared(b)
	c := newCheckerTB(b, rdb)
	ctx := context.Background()
	tok := fence.Token(1764636000000001)
	if err := c.Check(ctx, "jobs/nightly", tok); err != nil {
		b.Fatal(err)
	}
	b.Run("kind=get", func(b *testing.B) {
		for b.Loop() {
			if err := rdb.Get(ctx, c.Key("jobs/nightly")).Err(); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("kind=check", func(b *testing.B) {
		for b.Loop() {
			tok++
			if err := c.Check(ctx, "jobs/nightly", tok); err != nil {
				b.Fatal(err)
			}
		}
	})
}
