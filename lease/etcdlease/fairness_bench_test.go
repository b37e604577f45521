package etcdlease_test

import (
	"testing"
	"time"

	"github.com/fencekit/fencekit/internal/testkit"
	"github.com/fencekit/fencekit/lease"
	"github.com/fencekit/fencekit/lease/etcdlease/etcdtest"
)

// BenchmarkFairness is bench/'s BenchmarkFairness on etcd (its harness
// lives here, so that bench/ does not pull in etcd), run by
// testkit.FairnessOffOn: 8 contenders, each a Manager over a backend and a
// client of its own, loop on one lease name for 5 s: Acquire, hold 1 ms,
// Release, Acquire again at once; with fifo=off and fifo=on
// (lease.WithFIFO). One iteration is one run (use -benchtime 1x). Metrics:
// grants/s; min-share and max-share, the smallest and largest fraction of
// the run's grants one contender got (fair: 1/8); max-wait-ns, the longest
// single Acquire (the unfinished ones included).
func BenchmarkFairness(b *testing.B) {
	const contenders, run = 8, 5 * time.Second
	cl := etcdtest.StartWith(b, 3, etcdtest.Default)
	p := prefix(b)
	testkit.FairnessOffOn(b, run, func(b *testing.B, fifo bool) []*lease.Manager {
		var opts []lease.Option
		mode := "off"
		if fifo {
			opts, mode = append(opts, lease.WithFIFO()), "on"
		}
		ms := make([]*lease.Manager, contenders)
		for i := range ms {
			ms[i] = testkit.NewManager(b, benchBackend(b, cl.Client(), p+"fair-"+mode+"/"), benchTTL, opts...)
		}
		return ms
	})
}
