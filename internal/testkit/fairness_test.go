package testkit_test

import (
	"testing"
	"time"

	"github.com/fencekit/fencekit/internal/testkit"
	"github.com/fencekit/fencekit/lease"
	"github.com/fencekit/fencekit/lease/memlease"
)

// Contend counts each contender's grants and records one wait per grant,
// plus at most one per contender for the Acquire cut short by the end.
func TestContendCounts(t *testing.T) {
	be := memlease.New()
	ms := make([]*lease.Manager, 3)
	for i := range ms {
		ms[i] = testkit.NewManager(t, be, time.Minute)
	}
	r, err := testkit.Contend(ms, "fair", 300*time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}
	if len(r.Grants) != len(ms) {
		t.Fatalf("Grants has %d entries, want %d", len(r.Grants), len(ms))
	}
	total := 0
	for _, g := range r.Grants {
		total += g
	}
	if total == 0 || r.Total() != total {
		t.Fatalf("Total() = %d, sum of Grants %v = %d; want equal and > 0", r.Total(), r.Grants, total)
	}
	if n := len(r.Waits); n < total || n > total+len(ms) {
		t.Fatalf("%d waits for %d grants of %d contenders; want %d..%d", n, total, len(ms), total, total+len(ms))
	}
	// The name is free again: every grant was released.
	l := testkit.TryAcquire(t, ms[0], "fair")
	if err := l.Release(testkit.Context(t)); err != nil {
		t.Fatal(err)
	}
}
