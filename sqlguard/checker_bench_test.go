package sqlguard_test

import (
	"context"
	"testing"

	"github.com/fencekit/fencekit/fence"
	"github.com/fencekit/fencekit/internal/testkit/pairbench"
	"github.com/fencekit/fencekit/sqlguard"
)

// BenchmarkChecker: one Checker.Check on the real PostgreSQL, interleaved
// call by call with a plain single-row UPDATE in autocommit (the baseline:
// a write that commits, as a check does) and the floor of one round trip
// (SELECT 1).
//
//	go test -run '^$' -bench Checker -count 6 ./sqlguard/ > bench.txt
//	go run golang.org/x/perf/cmd/benchstat@latest bench.txt
func BenchmarkChecker(b *testing.B) {
	e, _, _ := benchEnv(b)
	c, err := sqlguard.NewChecker(e.Pool)
	if err != nil {
		b.Fatal(err)
	}
	ctx := context.Background()
	tok, i := fence.Token(1), 0
	pairbench.Run(b,
		pairbench.Op{Name: "update", Call: func() error {
			i++
			_, err := e.Pool.Exec(ctx, benchUpdate, int64(i), 1)
			return err
		}},
		pairbench.Op{Name: "select1", Call: func() error {
			_, err := e.Pool.Exec(ctx, `SELECT 1`)
			return err
		}},
		pairbench.Op{Name: "check", Call: func() error {
			tok++
			return c.Check(ctx, "jobs/nightly", tok)
		}},
	)
}
