package zklease_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/fencekit/fencekit/internal/testkit"
	"github.com/fencekit/fencekit/internal/testkit/zktest"
	"github.com/fencekit/fencekit/lease"
	"github.com/fencekit/fencekit/lease/zklease"
)

// BenchmarkFairness is bench/'s BenchmarkFairness on ZooKeeper,
// run by testkit.FairnessOffOn on a three-node ensemble of its own: 8
// contenders, each a Manager over a backend of its own (its own client and
// session, spread over the members), loop on one lease name for 5 s:
// Acquire, hold 1 ms, Release, Acquire again at once; with fifo=off and
// fifo=on (lease.WithFIFO: the waiters keep places in the line under the
// name's line parent). Each sub-benchmark has a root of its own. One
// iteration is one run (use -benchtime 1x). Metrics: grants/s; min-share
// and max-share, the smallest and largest fraction of the run's grants one
// contender got (fair: 1/8); max-wait-ns, the longest single Acquire (the
// unfinished ones included).
func BenchmarkFairness(b *testing.B) {
	const contenders, run = 8, 5 * time.Second
	ens := zktest.Start(b, 3, zktest.Config{})
	servers := ens.Servers()
	admin := rawConn(b, servers)
	root := zktest.Root(b)
	mustCreateParent(b, admin, root, zklease.ParentPath(root, "warm-up"))
	warmUp(b, admin, zklease.ParentPath(root, "warm-up"))
	testkit.FairnessOffOn(b, run, func(b *testing.B, fifo bool) []*lease.Manager {
		var opts []lease.Option
		if fifo {
			opts = append(opts, lease.WithFIFO())
		}
		root := zktest.Root(b)
		ms := make([]*lease.Manager, contenders)
		for i := range ms {
			be := newBackend(b, []string{servers[i%len(servers)]}, zklease.WithRoot(root), zklease.WithSessionTimeout(benchTTL))
			ms[i] = testkit.NewManager(b, be, benchTTL, opts...)
			// The session's first requests, outside the measured run.
			l := testkit.TryAcquire(b, ms[i], fmt.Sprintf("warm-up-%d", i))
			if err := l.Release(context.Background()); err != nil {
				b.Fatal(err)
			}
		}
		return ms
	})
}
