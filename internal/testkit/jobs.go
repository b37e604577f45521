package testkit

import (
	"context"
	"sync"
	"testing"

	"github.com/fencekit/fencekit/fence"
	"github.com/fencekit/fencekit/lease"
)

// Ledger is a lease.Ledger in memory, enough for RunOnce to run. The zero
// value is ready; it is safe for concurrent use.
type Ledger struct {
	mu   sync.Mutex
	done map[string]bool
}

// Claim reports whether job's run key is marked done.
func (l *Ledger) Claim(_ context.Context, job, key string, _ fence.Token) (bool, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.done[job+"/"+key], nil
}

// MarkDone marks job's run key done.
func (l *Ledger) MarkDone(_ context.Context, job, key string, _ fence.Token) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.done == nil {
		l.done = map[string]bool{}
	}
	l.done[job+"/"+key] = true
	return nil
}

// CheckJobGauge runs one job of each kind on m, whose observer feeds the
// job gauge that running reads for a lease name (gauge names it in
// failures): Run on "nightly", RunOnce on "settle-orders" and an
// election's term on "scheduler". The gauge must be 1 while each job runs
// and 0 once its lease ended.
func CheckJobGauge[V int64 | float64](t *testing.T, m *lease.Manager, gauge string, running func(name string) V) {
	t.Helper()
	ctx := t.Context()
	var during []V
	if err := m.Run(ctx, "nightly", func(context.Context, *lease.Lease) error {
		during = append(during, running("nightly"))
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if _, err := m.RunOnce(ctx, "settle-orders", "2026-12-01", &Ledger{}, func(context.Context, *lease.Lease) error {
		during = append(during, running("settle-orders"))
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	e, err := lease.NewElection(m, "scheduler")
	if err != nil {
		t.Fatal(err)
	}
	runCtx, cancel := context.WithCancel(ctx)
	_ = e.Run(runCtx, func(context.Context, *lease.Lease) error {
		during = append(during, running("scheduler"))
		cancel()
		return nil
	})
	if len(during) != 3 || during[0] != 1 || during[1] != 1 || during[2] != 1 {
		t.Fatalf("%s while each job ran: %v, want [1 1 1]", gauge, during)
	}
	for _, name := range []string{"nightly", "settle-orders", "scheduler"} {
		if got := running(name); got != 0 {
			t.Fatalf("%s of %s = %v after its job, want 0", gauge, name, got)
		}
	}
}
