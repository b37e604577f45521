package pairbench

import (
	"math"
	"slices"
	"testing"
	"time"
)

// Percentile returns the p-th percentile (0 <= p <= 100) of samples by the
// nearest-rank method: the smallest sample that is at least p% of all
// samples (p = 0 gives the smallest, p = 100 the largest). It sorts a copy
// and returns 0 for no samples.
func Percentile(samples []time.Duration, p float64) time.Duration {
	if len(samples) == 0 {
		return 0
	}
	s := slices.Clone(samples)
	slices.Sort(s)
	rank := int(math.Ceil(p / 100 * float64(len(s))))
	return s[min(max(rank, 1), len(s))-1]
}

// Mean returns the arithmetic mean of samples, or 0 for none.
func Mean(samples []time.Duration) time.Duration {
	if len(samples) == 0 {
		return 0
	}
	var sum time.Duration
	for _, s := range samples {
		sum += s
	}
	return sum / time.Duration(len(samples))
}

// Median returns the median of xs (the mean of the two middle values for
// an even count), or 0 for none. It sorts a copy.
func Median(xs []float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	s := slices.Clone(xs)
	slices.Sort(s)
	n := len(s)
	if n%2 == 1 {
		return s[n/2]
	}
	return (s[n/2-1] + s[n/2]) / 2
}

// ReportLatency reports the mean, median and 99th percentile of samples as
// the metrics "<name>-mean-ns", "<name>-p50-ns" and "<name>-p99-ns" (with
// an empty name, "mean-ns", "p50-ns" and "p99-ns").
func ReportLatency(b *testing.B, name string, samples []time.Duration) {
	b.Helper()
	if name != "" {
		name += "-"
	}
	b.ReportMetric(float64(Mean(samples)), name+"mean-ns")
	b.ReportMetric(float64(Percentile(samples, 50)), name+"p50-ns")
	b.ReportMetric(float64(Percentile(samples, 99)), name+"p99-ns")
}

// Alternate is the summed form of Run for two calls: each iteration of b's
// loop calls base and other once with the iteration's number, other first
// on even iterations and base first on odd ones, and it returns the total
// time each took and the number of iterations. A failing call fails b.
// ReportAlternate reports the usual metrics from its result.
func Alternate(b *testing.B, base, other func(i int) error) (baseT, otherT time.Duration, n int) {
	b.Helper()
	p := AlternatePairs(b, base, other)
	for i := range p.Base {
		baseT += p.Base[i]
		otherT += p.Other[i]
	}
	return baseT, otherT, len(p.Base)
}

// Pairs are the times AlternatePairs measured, iteration by iteration:
// Base[i] and Other[i] were taken one right after the other.
type Pairs struct {
	Base, Other []time.Duration
}

// AlternatePairs calls base and other as Alternate does and returns each
// call's time. A failing call fails b.
func AlternatePairs(b *testing.B, base, other func(i int) error) Pairs {
	b.Helper()
	var p Pairs
	n := 0
	timed := func(f func(int) error, d *[]time.Duration) {
		t0 := time.Now()
		err := f(n)
		*d = append(*d, time.Since(t0))
		if err != nil {
			b.Fatal(err)
		}
	}
	for ; b.Loop(); n++ {
		if n%2 == 0 {
			timed(other, &p.Other)
			timed(base, &p.Base)
		} else {
			timed(base, &p.Base)
			timed(other, &p.Other)
		}
	}
	return p
}

// Ratios returns Other[i] / Base[i] for every iteration.
func (p Pairs) Ratios() []float64 {
	r := make([]float64, len(p.Base))
	for i := range r {
		r[i] = float64(p.Other[i]) / float64(max(p.Base[i], 1))
	}
	return r
}

// Report reports what ReportAlternate reports, and "<baseName>-p50-ratio":
// the median over iterations of other's time over base's. On a loaded
// machine the summed ratio follows the few iterations that waited for a
// CPU (a 99th percentile tens of times the median); the median ratio does
// not.
func (p Pairs) Report(b *testing.B, baseName string) {
	b.Helper()
	if len(p.Base) == 0 {
		return
	}
	ReportAlternate(b, baseName, sum(p.Base), sum(p.Other), len(p.Base))
	b.ReportMetric(Median(p.Ratios()), baseName+"-p50-ratio")
}

func sum(ds []time.Duration) time.Duration {
	var t time.Duration
	for _, d := range ds {
		t += d
	}
	return t
}

// ReportAlternate reports what Alternate measured: ns/op is other's mean
// time, "<baseName>-ratio" its total time over base's, and
// "over-<baseName>-ns/op" the mean time other adds to base.
func ReportAlternate(b *testing.B, baseName string, baseT, otherT time.Duration, n int) {
	b.Helper()
	if n == 0 {
		return
	}
	b.ReportMetric(float64(otherT.Nanoseconds())/float64(n), "ns/op")
	b.ReportMetric(float64(otherT)/float64(baseT), baseName+"-ratio")
	b.ReportMetric(float64((otherT-baseT).Nanoseconds())/float64(n), "over-"+baseName+"-ns/op")
}
