package pairbench

import (
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"
)

func TestPercentile(t *testing.T) {
	ms := func(ns ...int) []time.Duration {
		var d []time.Duration
		for _, n := range ns {
			d = append(d, time.Duration(n)*time.Millisecond)
		}
		return d
	}
	for _, tc := range []struct {
		samples []time.Duration
		p       float64
		want    time.Duration
	}{
		{nil, 50, 0},
		{ms(7), 99, 7 * time.Millisecond},
		{ms(4, 1, 3, 2), 0, 1 * time.Millisecond},
		{ms(4, 1, 3, 2), 1, 1 * time.Millisecond},
		{ms(4, 1, 3, 2), 50, 2 * time.Millisecond},
		{ms(4, 1, 3, 2), 75, 3 * time.Millisecond},
		{ms(4, 1, 3, 2), 99, 4 * time.Millisecond},
		{ms(4, 1, 3, 2), 100, 4 * time.Millisecond},
	} {
		in := slices.Clone(tc.samples)
		if got := Percentile(in, tc.p); got != tc.want {
			t.Errorf("Percentile(%v, %v) = %v, want %v", tc.samples, tc.p, got, tc.want)
		}
		if !slices.Equal(in, tc.samples) {
			t.Errorf("Percentile(%v, %v) reordered its samples to %v", tc.samples, tc.p, in)
		}
	}
	if got := Mean(ms(1, 2, 3, 6)); got != 3*time.Millisecond {
		t.Errorf("Mean = %v, want 3ms", got)
	}
	if got := Mean(nil); got != 0 {
		t.Errorf("Mean(nil) = %v, want 0", got)
	}
}

func TestMedian(t *testing.T) {
	for _, tc := range []struct {
		xs   []float64
		want float64
	}{
		{nil, 0},
		{[]float64{3}, 3},
		{[]float64{5, 1, 3}, 3},
		{[]float64{4, 1, 3, 2}, 2.5},
	} {
		in := slices.Clone(tc.xs)
		if got := Median(in); got != tc.want {
			t.Errorf("Median(%v) = %v, want %v", tc.xs, got, tc.want)
		}
		if !slices.Equal(in, tc.xs) {
			t.Errorf("Median(%v) reordered its input to %v", tc.xs, in)
		}
	}
}

// BenchmarkAlternate checks Alternate's bookkeeping: every iteration calls
// both functions once with the iteration's number, in alternating order.
func BenchmarkAlternate(b *testing.B) {
	var order []string
	var seen []int
	base := func(i int) error { order = append(order, "base"); seen = append(seen, i); return nil }
	other := func(i int) error { order = append(order, "other"); return nil }
	_, _, n := Alternate(b, base, other)
	if len(order) != 2*n || len(seen) != n {
		b.Fatalf("%d iterations made %d calls, %d of base", n, len(order), len(seen))
	}
	for i := range n {
		first := map[bool]string{true: "other", false: "base"}[i%2 == 0]
		if order[2*i] != first || seen[i] != i {
			b.Fatalf("iteration %d: first call %s with %d, want %s with %d", i, order[2*i], seen[i], first, i)
		}
	}
}

// TestPairsRatios checks that the ratios are taken pair by pair, so that
// one slow pair moves their median no more than any other pair does.
func TestPairsRatios(t *testing.T) {
	ms := func(ns ...int) []time.Duration {
		var d []time.Duration
		for _, n := range ns {
			d = append(d, time.Duration(n)*time.Millisecond)
		}
		return d
	}
	p := Pairs{Base: ms(10, 20, 10, 1000), Other: ms(11, 22, 12, 1100)}
	got := p.Ratios()
	want := []float64{1.1, 1.1, 1.2, 1.1}
	for i := range want {
		if d := got[i] - want[i]; d > 1e-9 || d < -1e-9 {
			t.Fatalf("Ratios() = %v, want %v", got, want)
		}
	}
	if m := Median(got); m < 1.1-1e-9 || m > 1.1+1e-9 {
		t.Errorf("median ratio %v, want 1.1", m)
	}
	if (Pairs{Base: ms(0), Other: ms(5)}).Ratios()[0] <= 0 {
		t.Error("a zero base time gave no ratio")
	}
}

// BenchmarkThroughputCalls checks Throughput's bookkeeping: one untimed
// cycle per worker, then b.N cycles in all, each worker on its own name.
func BenchmarkThroughputCalls(b *testing.B) {
	const workers = 3
	var mu sync.Mutex
	calls := map[string]int{}
	Throughput(b, workers, func(w int) string { return fmt.Sprint("w", w) }, func(name string) error {
		mu.Lock()
		calls[name]++
		mu.Unlock()
		return nil
	})
	total := 0
	for name, n := range calls {
		if n < 1 {
			b.Errorf("%s: %d calls", name, n)
		}
		total += n
	}
	if len(calls) != workers || total != b.N+workers {
		b.Fatalf("calls %v: %d names, %d calls; want %d names, %d calls", calls, len(calls), total, workers, b.N+workers)
	}
}
