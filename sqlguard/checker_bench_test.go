package sqlguard_test

import (
	"context"
	"testing"

	"github.com/fencekit/fencekit/fence"
	"github.com/fencekit/fencekit/sqlguard"
)

// BenchmarkChecker: one Checker.Check on the real PostgreSQL, beside the
// floor of one round trip (SELECT 1) and a plain single-row UPDATE.
//
//	go test -run '^$' -bench Checker -count 6 ./sqlguard/ > bench.txt
//	go run golang.org/x/perf/cmd/benchstat@latest -col /kind bench.txt
func BenchmarkChecker(b *testing.B) {
	e, _, _ := benchEnv(b)
	c, err := sqlguard.NewChecker(e.pool)
	if err != nil {
		b.Fatal(err)
	}
	ctx := context.Background()
	b.Run("kind=select1", func(b *testing.B) {
		for b.Loop() {
			if _, err := e.pool.Exec(ctx, `SELECT 1`); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("kind=update", func(b *testing.B) {
		for i := 0; b.Loop(); i++ {
			if _, err := e.pool.Exec(ctx, benchUpdate, int64(i), 1); err != nil {
				b.Fatal(err)
			}
		}
	})
	tok := fence.Token(1)
	b.Run("kind=check", func(b *testing.B) {
		for b.Loop() {
			tok++
			if err := c.Check(ctx, "jobs/nightly", tok); err != nil {
				b.Fatal(err)
			}
		}
	})
}
