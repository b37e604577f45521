package redischeck_test

import (
	"context"
	"errors"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/fencekit/fencekit/fence"
	"github.com/fencekit/fencekit/internal/testkit/pairbench"
	"github.com/fencekit/fencekit/lease/redislease/redistest"
)

// BenchmarkCheck: one check on the real Redis, interleaved call by call
// with the floor of one round trip (a GET of the same key).
//
//	go test -run '^$' -bench . -count 6 ./redischeck/ > bench.txt
//	go run golang.org/x/perf/cmd/benchstat@latest bench.txt
func BenchmarkCheck(b *testing.B) {
	rdb := redistest.Shared(b)
	c := newCheckerTB(b, rdb)
	ctx := context.Background()
	tok := fence.Token(1764636000000001)
	pairbench.Run(b,
		pairbench.Op{Name: "get", Call: func() error {
			err := rdb.Get(ctx, c.Key("jobs/nightly")).Err()
			if errors.Is(err, redis.Nil) {
				return nil
			}
			return err
		}},
		pairbench.Op{Name: "check", Call: func() error {
			tok++
			return c.Check(ctx, "jobs/nightly", tok)
		}},
	)
}
