package bench

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/fencekit/fencekit/internal/pairbench"
	"github.com/fencekit/fencekit/lease"
	"github.com/fencekit/fencekit/lease/redislease"
	"github.com/fencekit/fencekit/lease/redislease/redistest"
)

// BenchmarkRedisThroughput is BenchmarkPGThroughput on the shared Redis:
// lease.Manager.Acquire + Lease.Release over redislease (TTL 10 s, waiters
// woken by the release notice), workers goroutines on distinct names or
// on one name, b.N cycles in all (run it with a fixed count: -benchtime
// 2000x). Metrics: ops/s, p50-ns, p99-ns of a cycle, waits included.
func BenchmarkRedisThroughput(b *testing.B) {
	ctx := context.Background()
	c := redistest.Shared(b)
	m, err := lease.NewManager(redisBackend(b, c, redistest.Prefix(b)+"tp:"), benchTTL)
	if err != nil {
		b.Fatal(err)
	}
	cycle := func(name string) error {
		l, err := m.Acquire(ctx, name)
		if err != nil {
			return err
		}
		return l.Release(ctx)
	}
	pairbench.ThroughputRuns(b, "lib=fencekit", true, cycle)
}

// BenchmarkRedisRenewLoad is BenchmarkPGRenewLoad on the shared Redis:
// 1,000 leases held by one lease.Manager with its defaults at TTL 15 s,
// over a window of b.N seconds (run it with -benchtime 10x). The requests
// the store receives are counted at the client (RoundTrips: one per
// command or pipeline sent), since the shared server's own counters see
// other clients too.
//
// Metrics, per 1,000 held leases: reqs/s, the requests (round trips) the
// server receives per second; renewals/s, the lease renewals those
// requests carry.
func BenchmarkRedisRenewLoad(b *testing.B) {
	ctx := context.Background()
	c := redistest.Shared(b)
	rt := new(RoundTrips)
	c.AddHook(rt)
	be := redisBackend(b, c, redistest.Prefix(b)+"renew:")
	const leases = 1000
	renewals := &renewCounter{}
	m, err := lease.NewManager(be, pgRenewTTL, lease.WithObserver(renewals))
	if err != nil {
		b.Fatal(err)
	}
	held := make([]*lease.Lease, 0, leases)
	defer func() {
		for _, l := range held {
			_ = l.Release(ctx)
		}
	}()
	// Acquired over one renew interval, as leases taken at random times
	// over a long run would be.
	interval := m.Options().RenewInterval
	for i := range leases {
		l, err := m.TryAcquire(ctx, fmt.Sprintf("renew-%d", i))
		if err != nil {
			b.Fatal(err)
		}
		held = append(held, l)
		time.Sleep(interval / leases)
	}
	rt0, n0 := rt.Load(), renewals.n.Load()
	b.ResetTimer()
	time.Sleep(time.Duration(b.N) * time.Second)
	b.StopTimer()
	window := float64(b.N)
	for _, l := range held {
		if err := l.Err(); err != nil {
			b.Fatalf("a lease was lost while renewed: %v", err)
		}
	}
	b.ReportMetric(0, "ns/op")
	b.ReportMetric(float64(rt.Load()-rt0)/window, "reqs/s")
	b.ReportMetric(float64(renewals.n.Load()-n0)/window, "renewals/s")
}

// redisBackend is a redislease backend on c under prefix, closed when b
// ends.
func redisBackend(b *testing.B, c *redis.Client, prefix string) *redislease.Backend {
	b.Helper()
	be, err := redislease.New(c, func(o *redislease.Options) { o.Prefix = prefix })
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = be.Close() })
	return be
}
