package testkit

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/fencekit/fencekit/internal/pairbench"
	"github.com/fencekit/fencekit/lease"
)

// The fairness benchmarks measure how a backend shares one
// lease name among contenders that all want it all the time: each
// contender, a Manager with a backend and connections of its own (as a
// process of its own would have), loops on the name for a fixed time:
// Acquire, hold 1 ms, Release, and at once Acquire again. With fifo=off
// whichever contender asks first after a release wins, and the one that
// just released asks again at once; with fifo=on (lease.WithFIFO) the
// waiters keep places in a line at the store and the oldest is granted.

// FairnessHold is how long a contender holds each grant in Contend.
const FairnessHold = time.Millisecond

// FairnessRun is the outcome of one Contend run.
type FairnessRun struct {
	// Grants counts the leases each contender was granted (and released),
	// by the contender's index in the Managers given to Contend.
	Grants []int
	// Waits holds every Acquire call's wait, the unfinished calls' ones
	// (cut short by the end of the run) included.
	Waits []time.Duration
}

// Total is the run's number of grants, all contenders together.
func (r FairnessRun) Total() int {
	n := 0
	for _, g := range r.Grants {
		n += g
	}
	return n
}

// Contend lets the contenders ms loop on the lease name for d: Acquire,
// hold FairnessHold, Release, again. It returns when every contender has
// stopped: d after the start, plus one release. Acquires cut short by the
// end of the run are not errors; any other Acquire or Release error stops
// that contender and is returned (all of them joined) with the counts.
func Contend(ms []*lease.Manager, name string, d time.Duration) (FairnessRun, error) {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	var (
		mu   sync.Mutex
		run  = FairnessRun{Grants: make([]int, len(ms))}
		errs []error
		wg   sync.WaitGroup
	)
	fail := func(err error) {
		mu.Lock()
		errs = append(errs, err)
		mu.Unlock()
	}
	for i, m := range ms {
		wg.Go(func() {
			for ctx.Err() == nil {
				t0 := time.Now()
				l, err := m.Acquire(ctx, name)
				wait := time.Since(t0)
				mu.Lock()
				run.Waits = append(run.Waits, wait)
				mu.Unlock()
				if err != nil {
					if ctx.Err() == nil {
						fail(fmt.Errorf("contender %d: %w", i, err))
					}
					return
				}
				time.Sleep(FairnessHold)
				if err := l.Release(context.WithoutCancel(ctx)); err != nil {
					fail(fmt.Errorf("contender %d: release: %w", i, err))
					return
				}
				mu.Lock()
				run.Grants[i]++
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	return run, errors.Join(errs...)
}

// FairnessStats are the means over the runs of one MeasureFairness.
type FairnessStats struct {
	Runs int
	// GrantsPerSec is the grants of all contenders per second of run.
	GrantsPerSec float64
	// MinShare and MaxShare are the smallest and the largest fraction of
	// a run's grants that one contender got (fair: 1/contenders each).
	MinShare, MaxShare float64
	// MaxWait is the longest single Acquire of a run; P99Wait the 99th
	// percentile (nearest rank) of a run's Acquire waits.
	MaxWait, P99Wait time.Duration
}

// MeasureFairness runs Contend on ms once per iteration of b.Loop (use
// -benchtime 1x: one iteration is one whole run of d), on the names
// name+"-1", name+"-2", ..., and returns the means of the runs. It fails b
// on a contender's error or on a run without a grant.
func MeasureFairness(b *testing.B, ms []*lease.Manager, name string, d time.Duration) FairnessStats {
	b.Helper()
	var s FairnessStats
	var grants int
	var maxWait, p99Wait float64
	for b.Loop() {
		s.Runs++
		r, err := Contend(ms, fmt.Sprintf("%s-%d", name, s.Runs), d)
		if err != nil {
			b.Fatal(err)
		}
		total := r.Total()
		if total == 0 {
			b.Fatalf("no grant in %v", d)
		}
		grants += total
		s.MinShare += float64(slices.Min(r.Grants)) / float64(total)
		s.MaxShare += float64(slices.Max(r.Grants)) / float64(total)
		maxWait += float64(slices.Max(r.Waits))
		p99Wait += float64(pairbench.Percentile(r.Waits, 99))
	}
	n := float64(s.Runs)
	s.GrantsPerSec = float64(grants) / (n * d.Seconds())
	s.MinShare /= n
	s.MaxShare /= n
	s.MaxWait = time.Duration(maxWait / n)
	s.P99Wait = time.Duration(p99Wait / n)
	return s
}

// Report reports s as b's metrics: grants/s, min-share, max-share and
// max-wait-ns (ns/op, meaningless here, as 0). P99Wait is not reported;
// a caller that wants it reports it itself.
func (s FairnessStats) Report(b *testing.B) {
	b.ReportMetric(0, "ns/op")
	b.ReportMetric(s.GrantsPerSec, "grants/s")
	b.ReportMetric(s.MinShare, "min-share")
	b.ReportMetric(s.MaxShare, "max-share")
	b.ReportMetric(float64(s.MaxWait), "max-wait-ns")
}

// FairnessOffOn runs the sub-benchmarks fifo=off and fifo=on of a
// backend's fairness benchmark: each gets its contenders from
// newManagers(b, fifo) (called with the sub-benchmark's b, so cleanups
// registered there run at its end; with fifo true the Managers are to
// have lease.WithFIFO), measures them with MeasureFairness on the names
// "fair-1", "fair-2", ... for d each, and reports the metrics of
// FairnessStats.Report. The names may repeat between the two, so the
// Managers of each should use a namespace (key prefix, root) of their
// own.
func FairnessOffOn(b *testing.B, d time.Duration, newManagers func(b *testing.B, fifo bool) []*lease.Manager) {
	for _, fifo := range []bool{false, true} {
		b.Run("fifo="+map[bool]string{false: "off", true: "on"}[fifo], func(b *testing.B) {
			ms := newManagers(b, fifo)
			MeasureFairness(b, ms, "fair", d).Report(b)
		})
	}
}
