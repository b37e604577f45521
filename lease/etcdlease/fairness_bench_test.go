package etcdlease_test

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/fencekit/fencekit/internal/etcdtest"
	"github.com/fencekit/fencekit/internal/testkit"
	"github.com/fencekit/fencekit/lease"
)

// BenchmarkFairness is bench/'s BenchmarkFairness on etcd (its harness
// lives here, so that bench/ does not pull in etcd): 8 contenders, each a
// Manager over a backend and a client of its own, loop on one lease name
// for 5 s: Acquire, hold 1 ms, Release, Acquire again at once; with
// fifo=off and fifo=on (lease.WithFIFO). One iteration is one run (use
// -benchtime 1x). Metrics: grants/s; min-share and max-share, the smallest
// and largest fraction of the run's grants one contender got (fair: 1/8);
// max-wait-ns, the longest single Acquire (the unfinished ones included).
func BenchmarkFairness(b *testing.B) {
	const contenders, run = 8, 5 * time.Second
	cl := etcdtest.StartWith(b, 3, etcdtest.Default)
	p := prefix(b)
	for _, fifo := range []bool{false, true} {
		mode := map[bool]string{false: "off", true: "on"}[fifo]
		b.Run("fifo="+mode, func(b *testing.B) {
			var opts []lease.Option
			if fifo {
				opts = append(opts, lease.WithFIFO())
			}
			ms := make([]*lease.Manager, contenders)
			for i := range ms {
				ms[i] = testkit.NewManager(b, benchBackend(b, cl.Client(), p+"fair-"+mode+"/"), benchTTL, opts...)
			}
			var minShare, maxShare, maxWait, rate float64
			n := 0
			for b.Loop() {
				n++
				grants, longest := contend(b, ms, fmt.Sprintf("fair-%d", n), run)
				total := 0
				for _, g := range grants {
					total += g
				}
				if total == 0 {
					b.Fatalf("no grant in %v", run)
				}
				rate += float64(total) / run.Seconds()
				minShare += float64(slices.Min(grants)) / float64(total)
				maxShare += float64(slices.Max(grants)) / float64(total)
				maxWait += float64(longest)
			}
			b.ReportMetric(0, "ns/op")
			b.ReportMetric(rate/float64(n), "grants/s")
			b.ReportMetric(minShare/float64(n), "min-share")
			b.ReportMetric(maxShare/float64(n), "max-share")
			b.ReportMetric(maxWait/float64(n), "max-wait-ns")
		})
	}
}

// contend runs the contenders on name for d; it returns each one's grants
// and the longest single wait.
func contend(b *testing.B, ms []*lease.Manager, name string, d time.Duration) ([]int, time.Duration) {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	grants := make([]int, len(ms))
	longest := make([]time.Duration, len(ms))
	var wg sync.WaitGroup
	for i, m := range ms {
		wg.Go(func() {
			for {
				t0 := time.Now()
				l, err := m.Acquire(ctx, name)
				longest[i] = max(longest[i], time.Since(t0))
				if err != nil {
					if ctx.Err() == nil {
						b.Errorf("contender %d: %v", i, err)
					}
					return
				}
				time.Sleep(time.Millisecond)
				if err := l.Release(context.WithoutCancel(ctx)); err != nil {
					b.Errorf("contender %d: release: %v", i, err)
					return
				}
				grants[i]++
			}
		})
	}
	wg.Wait()
	return grants, slices.Max(longest)
}
