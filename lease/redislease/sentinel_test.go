package redislease_test

import (
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/fencekit/fencekit/lease"
	"github.com/fencekit/fencekit/lease/leasetest"
	"github.com/fencekit/fencekit/lease/redislease"
	"github.com/fencekit/fencekit/lease/redislease/redistest"
)

// sentinelDeployment is a primary and a replica watched by Sentinels, for
// the failover scenarios, reached through go-redis's failover client.
type sentinelDeployment struct{ s *redistest.Sentinel }

func (d sentinelDeployment) client(t *testing.T) redislease.Client { return d.s.Client(t) }

func (d sentinelDeployment) countedClient(t *testing.T, h *nodeCounter) redislease.Client {
	c := d.s.Client(t)
	c.AddHook(h.hook(d.s.Primary(t).Addr)) // the primary of the moment: these tests do not fail over
	return c
}

func (d sentinelDeployment) admin(s *redistest.Server) *redis.Client { return d.s.Admin(s) }
func (d sentinelDeployment) primaries(t *testing.T) []*redistest.Server {
	return []*redistest.Server{d.s.Primary(t)}
}
func (d sentinelDeployment) primaryFor(t *testing.T, key string) *redistest.Server {
	return d.s.Primary(t)
}
func (d sentinelDeployment) failover(t *testing.T, p *redistest.Server) (*redistest.Server, time.Duration) {
	return d.s.Failover(t)
}
func (d sentinelDeployment) awaitHealthy(t *testing.T) { d.s.AwaitHealthy(t) }

// expectNoFailover makes t fail at its end, with the reason, if the
// Sentinels failed the primary over by themselves meanwhile (it did not
// answer them within down-after-milliseconds on an overloaded machine).
func (d sentinelDeployment) expectNoFailover(t *testing.T) {
	p := d.s.Primary(t)
	t.Cleanup(func() {
		if now := d.s.Primary(t); now != p {
			t.Errorf("the Sentinels failed %s over to %s by themselves during this test: it stalled beyond down-after-milliseconds; the machine is overloaded", p.Addr, now.Addr)
			d.s.AwaitHealthy(t)
		}
	})
}

// TestSentinel runs the backend on a primary with one replica watched by
// three Sentinels (quorum 2, down-after-milliseconds 1000), through
// go-redis's failover client, started once for all of its subtests. They
// run in order; the failover subtest comes last and leaves the deployment
// healthy again (roles swapped). The SIGKILL of the primary, with the
// stale holder's writes rejected at PostgreSQL and S3, is an end-to-end
// test: integration/redisfailover (TestSentinelPrimaryKilled).
func TestSentinel(t *testing.T) {
	start := time.Now()
	sen := redistest.StartSentinel(t, redistest.SentinelOptions{DownAfter: time.Second})
	t.Logf("primary, replica and 3 Sentinels healthy after %v", time.Since(start).Round(time.Millisecond))
	d := sentinelDeployment{sen}
	// The subtests that do not fail over on purpose check that the
	// deployment did not fail over by itself meanwhile.
	steady := func(name string, fn func(*testing.T)) {
		t.Run(name, func(t *testing.T) {
			d.expectNoFailover(t)
			fn(t)
		})
	}
	steady("Conformance", func(t *testing.T) {
		leasetest.Run(t, leasetest.Config{
			NewStore: func(t *testing.T) func() lease.Backend {
				prefix := redistest.UniquePrefix()
				return func() lease.Backend { return newBackend(t, sen.Client(t), prefix) }
			},
			LoseData: flushAll(d),
			Lacks:    redisLacks,
		})
	})
	steady("ExclusiveUnderContention", func(t *testing.T) { testExclusiveUnderContention(t, d) })
	steady("RoundTrips", func(t *testing.T) { testRoundTrips(t, d) })
	t.Run("ManualFailover", func(t *testing.T) { testManualFailover(t, d) })
}
