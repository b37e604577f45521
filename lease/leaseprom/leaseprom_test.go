package leaseprom_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"go.uber.org/goleak"

	"github.com/fencekit/fencekit/fence"
	"github.com/fencekit/fencekit/lease"
	"github.com/fencekit/fencekit/lease/leaseprom"
	"github.com/fencekit/fencekit/lease/memlease"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestMetricsFollowLeaseEvents(t *testing.T) {
	reg := prometheus.NewRegistry()
	obs, err := leaseprom.New(reg)
	if err != nil {
		t.Fatal(err)
	}
	m, err := lease.NewManager(memlease.New(), 100*time.Millisecond, lease.WithoutAutoRenew(), lease.WithObserver(obs))
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	l, _ := m.TryAcquire(ctx, "a")
	if err := l.Renew(ctx); err != nil {
		t.Fatal(err)
	}
	_ = l.Release(ctx)
	l2, _ := m.TryAcquire(ctx, "b")
	<-l2.Done() // lost: no renewal

	want := `
# HELP fencekit_lease_acquired_total Leases granted to this process.
# TYPE fencekit_lease_acquired_total counter
fencekit_lease_acquired_total 2
# HELP fencekit_lease_lost_total Leases lost before being released, by reason.
# TYPE fencekit_lease_lost_total counter
fencekit_lease_lost_total{reason="expired"} 1
fencekit_lease_lost_total{reason="taken over"} 0
# HELP fencekit_lease_released_total Leases released by their holder, by whether the store confirmed it.
# TYPE fencekit_lease_released_total counter
fencekit_lease_released_total{result="error"} 0
fencekit_lease_released_total{result="ok"} 1
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want),
		"fencekit_lease_acquired_total", "fencekit_lease_lost_total", "fencekit_lease_released_total"); err != nil {
		t.Fatal(err)
	}
	if n := testutil.CollectAndCount(reg, "fencekit_lease_renew_duration_seconds"); n != 2 {
		t.Fatalf("renew histogram series = %d, want 2", n)
	}
	if _, err := leaseprom.New(reg); err == nil {
		t.Fatal("registering twice did not fail")
	}
}

// The held gauge counts leases granted and not yet released or lost; the
// leader gauge is 1 exactly while this process leads.
func TestHeldAndLeaderGauges(t *testing.T) {
	reg, m := observed(t)
	ctx := context.Background()
	held := func() float64 { return gauge(t, reg, "fencekit_lease_held", "") }
	a, _ := m.TryAcquire(ctx, "a")
	b, _ := m.TryAcquire(ctx, "b")
	if got := held(); got != 2 {
		t.Fatalf("held = %v after two grants, want 2", got)
	}
	_ = a.Release(ctx)
	if got := held(); got != 1 {
		t.Fatalf("held = %v after a release, want 1", got)
	}
	_ = b.Release(ctx)

	e, err := lease.NewElection(m, "scheduler")
	if err != nil {
		t.Fatal(err)
	}
	leader := func() float64 { return gauge(t, reg, "fencekit_election_leader", "scheduler") }
	runCtx, cancel := context.WithCancel(ctx)
	var during float64
	err = e.Run(runCtx, func(ctx context.Context, l *lease.Lease) error {
		during = leader()
		cancel()
		return nil
	})
	if err == nil {
		t.Fatal("Run returned nil after its context was cancelled")
	}
	if during != 1 {
		t.Fatalf("leader gauge = %v while leading, want 1", during)
	}
	if got := leader(); got != 0 {
		t.Fatalf("leader gauge = %v after the term, want 0", got)
	}
	if got := held(); got != 0 {
		t.Fatalf("held = %v after every lease ended, want 0", got)
	}
}

// Guarded writes are counted by guard, class and outcome, the outcome
// classified from the guard's error.
func TestGuardWriteMetrics(t *testing.T) {
	reg := prometheus.NewRegistry()
	obs, err := leaseprom.New(reg)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	writes := []error{
		nil,
		nil,
		fence.Stale("public.invoices(id=1)", 3, 4),
		fmt.Errorf("sqlguard: update: %w", fence.ErrOutcomeUnknown),
		errors.New("sqlguard: update: connection refused"),
	}
	for _, err := range writes {
		e := fence.WriteEvent{Ctx: ctx, Guard: "sqlguard", Class: "public.invoices", Op: "update", Token: 3, Start: time.Now()}
		_ = fence.ObserveWrite(obs, e, err)
	}
	want := `
# HELP fencekit_guard_writes_total Guarded writes, by guard, resource class and outcome (accepted, stale, unknown, failed).
# TYPE fencekit_guard_writes_total counter
fencekit_guard_writes_total{class="public.invoices",guard="sqlguard",outcome="accepted"} 2
fencekit_guard_writes_total{class="public.invoices",guard="sqlguard",outcome="failed"} 1
fencekit_guard_writes_total{class="public.invoices",guard="sqlguard",outcome="stale"} 1
fencekit_guard_writes_total{class="public.invoices",guard="sqlguard",outcome="unknown"} 1
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), "fencekit_guard_writes_total"); err != nil {
		t.Fatal(err)
	}
	if n := testutil.CollectAndCount(reg, "fencekit_guard_write_duration_seconds"); n != 4 {
		t.Fatalf("write duration series = %d, want 4 (one per outcome)", n)
	}
}

// gauge reads the gauge name from reg: the series whose only label value is
// label, or the unlabelled one when label is "". A series not exported
// reads as 0.
func gauge(t *testing.T, reg *prometheus.Registry, name, label string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			if (label == "" && len(m.GetLabel()) == 0) || (len(m.GetLabel()) == 1 && m.GetLabel()[0].GetValue() == label) {
				return m.GetGauge().GetValue()
			}
		}
	}
	return 0
}
