package redislease_test

import (
	"testing"
	"time"

	"github.com/fencekit/fencekit/lease"
	"github.com/fencekit/fencekit/lease/leasetest"
	"github.com/fencekit/fencekit/lease/redislease/redistest"
)

// TestSentinel runs the backend on a primary with one replica watched by
// three Sentinels (quorum 2, down-after-milliseconds 1000), through
// go-redis's failover client, started once for all of its subtests. They
// run in order; the failover subtest comes last and leaves the deployment
// healthy again (roles swapped). The SIGKILL of the primary, with the
// stale holder's writes rejected at PostgreSQL and S3, is an end-to-end
// test: integration/redisfailover (TestSentinelPrimaryKilled).
func TestSentinel(t *testing.T) {
	sen := redistest.StartSentinel(t, redistest.SentinelOptions{DownAfter: time.Second})
	d := sen.Deployment()
	// The subtests that do not fail over on purpose check that the
	// deployment did not fail over by itself meanwhile.
	steady := func(name string, fn func(*testing.T)) {
		t.Run(name, func(t *testing.T) {
			d.ExpectNoFailover(t)
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
