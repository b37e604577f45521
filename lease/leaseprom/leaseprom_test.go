package leaseprom_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"go.uber.org/goleak"

	"github.com/fencekit/fencekit/lease"
	"github.com/fencekit/fencekit/lease/leaseprom"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestMetricsFollowLeaseEvents(t *testing.T) {
	reg := prometheus.NewRegistry()
	obs, err := leaseprom.New(reg)
	if err != nil {
		t.Fatal(err)
	}
	m, err := lease.NewManager(lease.NewMemoryBackend(), 100*time.Millisecond, lease.WithoutAutoRenew(), lease.WithObserver(obs))
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
