package bench

import (
	"context"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/fencekit/fencekit/internal/testkit"
	"github.com/fencekit/fencekit/internal/testkit/pairbench"
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

// BenchmarkRedisRenewLoad is BenchmarkPGRenewLoad on the shared Redis
// (pairbench.RenewLoad: 1,000 leases held by one lease.Manager with its
// defaults at TTL 15 s, over a window of b.N seconds; run it with
// -benchtime 10x). The requests the store receives are counted at the
// client (RoundTrips: one per command or pipeline sent), since the shared
// server's own counters see other clients too.
//
// Metrics, per 1,000 held leases: reqs/s, the requests (round trips) the
// server receives per second; renewals/s, the lease renewals those
// requests carry.
func BenchmarkRedisRenewLoad(b *testing.B) {
	c := redistest.Shared(b)
	rt := new(redistest.RoundTrips)
	c.AddHook(rt)
	be := redisBackend(b, c, redistest.Prefix(b)+"renew:")
	renewals := &pairbench.RenewCounter{}
	m, err := lease.NewManager(be, pairbench.RenewTTL, lease.WithObserver(renewals))
	if err != nil {
		b.Fatal(err)
	}
	pairbench.RenewLoad(b, m, renewals, "renew-", 1000, func() map[string]int64 {
		return map[string]int64{"": rt.Load()}
	})
}

// redisBackend is a redislease backend on c under prefix, closed when b
// ends.
func redisBackend(b *testing.B, c *redis.Client, prefix string) *redislease.Backend {
	b.Helper()
	return testkit.Closed(redislease.New(c, redislease.WithPrefix(prefix)))(b)
}
