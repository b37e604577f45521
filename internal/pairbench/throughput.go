package pairbench

import (
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// Workers are the numbers of concurrent workers the throughput benchmarks
// run.
var Workers = []int{1, 10, 50, 200}

// Throughput runs b.N cycles in all over workers goroutines, worker w
// cycling on name(w), and reports ops/s (cycles per second of wall time)
// and the p50-ns and p99-ns of a cycle. Each worker runs one cycle first,
// untimed (it creates rows, prepares statements, loads scripts).
func Throughput(b *testing.B, workers int, name func(w int) string, cycle func(name string) error) {
	b.Helper()
	for w := range workers {
		if err := cycle(name(w)); err != nil {
			b.Fatal(err)
		}
	}
	var (
		next    atomic.Int64
		mu      sync.Mutex
		samples = make([]time.Duration, 0, b.N)
		wg      sync.WaitGroup
		failed  atomic.Pointer[error]
	)
	b.ResetTimer()
	start := time.Now()
	for w := range workers {
		wg.Go(func() {
			own := make([]time.Duration, 0, b.N/workers+1)
			for next.Add(1) <= int64(b.N) {
				t0 := time.Now()
				if err := cycle(name(w)); err != nil {
					failed.CompareAndSwap(nil, &err)
					return
				}
				own = append(own, time.Since(t0))
			}
			mu.Lock()
			samples = append(samples, own...)
			mu.Unlock()
		})
	}
	wg.Wait()
	elapsed := time.Since(start)
	b.StopTimer()
	if err := failed.Load(); err != nil {
		b.Fatal(*err)
	}
	b.ReportMetric(0, "ns/op")
	b.ReportMetric(float64(len(samples))/elapsed.Seconds(), "ops/s")
	b.ReportMetric(float64(Percentile(samples, 50)), "p50-ns")
	b.ReportMetric(float64(Percentile(samples, 99)), "p99-ns")
}

// ThroughputRuns runs Throughput as sub-benchmarks
// "<label>/names=distinct/workers=<n>" for each n of Workers, each worker
// on a name of its own, and, when one is set, "<label>/names=one/workers=<n>",
// every worker on one name. Names are unique to the label and the run's
// worker count (the label with "=" and "/" as "-").
func ThroughputRuns(b *testing.B, label string, one bool, cycle func(name string) error) {
	b.Helper()
	for _, names := range []string{"distinct", "one"} {
		if names == "one" && !one {
			continue
		}
		base := strings.NewReplacer("=", "-", "/", "-").Replace(label)
		for _, workers := range Workers {
			b.Run(fmt.Sprintf("%s/names=%s/workers=%d", label, names, workers), func(b *testing.B) {
				Throughput(b, workers, func(w int) string {
					if names == "one" {
						return fmt.Sprintf("tp-%s-one-%d", base, workers)
					}
					return fmt.Sprintf("tp-%s-%d-%d", base, workers, w)
				}, cycle)
			})
		}
	}
}
