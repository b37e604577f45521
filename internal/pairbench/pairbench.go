// Package pairbench measures operations side by side, interleaved call by
// call, so that the drifts of a shared machine hit all of them alike: the
// overhead of a fencing layer is reported as the median of per-iteration
// ratios to the same call without it, not as the difference of two runs
// made at different moments.
//
// It also holds the statistics the workspace's benchmarks report
// (nearest-rank percentiles, mean, median), written once for all of them;
// it needs only the standard library, so any module's tests can use it.
package pairbench

import (
	"testing"
	"time"
)

// Op is one operation of a pair (or more): Name labels its metrics; the
// first Op of a Run is the baseline.
type Op struct {
	Name string
	Call func() error
}

// Run calls every op once per iteration, starting with a different one
// each iteration, and reports for each its median time ("<name>-µs") and,
// for every op after the first, the median over iterations of its time
// divided by the baseline's in the same iteration ("<name>/<base>"). A
// failing call fails b. ns/op counts all the ops of an iteration.
func Run(b *testing.B, ops ...Op) {
	b.Helper()
	times := make([][]float64, len(ops))
	for i := 0; b.Loop(); i++ {
		var took = make([]time.Duration, len(ops))
		for k := range ops {
			j := (i + k) % len(ops)
			start := time.Now()
			if err := ops[j].Call(); err != nil {
				b.Fatalf("%s: %v", ops[j].Name, err)
			}
			took[j] = time.Since(start)
		}
		for j := range ops {
			times[j] = append(times[j], float64(took[j]))
		}
	}
	if len(times[0]) == 0 {
		return
	}
	for j, op := range ops {
		b.ReportMetric(Median(times[j])/1e3, op.Name+"-µs")
		if j == 0 {
			continue
		}
		ratios := make([]float64, len(times[j]))
		for i := range ratios {
			ratios[i] = times[j][i] / max(times[0][i], 1)
		}
		b.ReportMetric(Median(ratios), op.Name+"/"+ops[0].Name)
	}
}
