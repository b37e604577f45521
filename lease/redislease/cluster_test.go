package redislease_test

import (
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/fencekit/fencekit/internal/redistest"
	"github.com/fencekit/fencekit/lease"
	"github.com/fencekit/fencekit/lease/leasetest"
	"github.com/fencekit/fencekit/lease/redislease"
)

// clusterDeployment is a Redis Cluster for the failover scenarios. Its
// clients are go-redis cluster clients wrapped to reload their slot map
// after a refused connection, as the backend should do by itself (see
// withSlotReload): with go-redis's defaults a client keeps sending the
// requests for a dead master's slots to its address for up to a minute.
type clusterDeployment struct{ c *redistest.Cluster }

func (d clusterDeployment) client(t *testing.T) redislease.Client {
	return redislease.WithSlotReload(d.c.Client(t))
}

func (d clusterDeployment) countedClient(t *testing.T, h *nodeCounter) redislease.Client {
	return redislease.WithSlotReload(d.c.Client(t, func(o *redis.ClusterOptions) {
		o.NewClient = func(opt *redis.Options) *redis.Client {
			c := redis.NewClient(opt)
			c.AddHook(h.hook(opt.Addr))
			return c
		}
	}))
}

func (d clusterDeployment) admin(s *redistest.Server) *redis.Client { return d.c.Admin(s) }
func (d clusterDeployment) primaries(t *testing.T) []*redistest.Server {
	return d.c.Masters(t)
}
func (d clusterDeployment) primaryFor(t *testing.T, key string) *redistest.Server {
	return d.c.MasterFor(t, key)
}
func (d clusterDeployment) replicaOf(t *testing.T, p *redistest.Server) *redistest.Server {
	return d.c.ReplicaOf(t, p)
}
func (d clusterDeployment) failover(t *testing.T, p *redistest.Server) (*redistest.Server, time.Duration) {
	return d.c.Failover(t, p)
}
func (d clusterDeployment) awaitPromoted(t *testing.T, dead, replica *redistest.Server) time.Duration {
	return d.c.AwaitPromoted(t, dead, replica)
}
func (d clusterDeployment) awaitHealthy(t *testing.T) { d.c.AwaitHealthy(t) }

// TestCluster runs the backend on a Redis Cluster of three masters with one
// replica each (cluster-node-timeout 1 s), started once for all of its
// subtests. They run in order; the failover subtests come last and leave
// the cluster healthy again (roles swapped).
func TestCluster(t *testing.T) {
	start := time.Now()
	cl := redistest.StartCluster(t, redistest.ClusterOptions{Masters: 3, NodeTimeout: time.Second})
	t.Logf("3 masters + 3 replicas healthy after %v", time.Since(start).Round(time.Millisecond))
	d := clusterDeployment{cl}
	t.Run("Conformance", func(t *testing.T) {
		leasetest.Run(t, func(t *testing.T) func() lease.Backend {
			prefix := uniquePrefix(t)
			return func() lease.Backend { return newBackend(t, d.client(t), prefix) }
		})
	})
	t.Run("ExclusiveUnderContention", func(t *testing.T) { testExclusiveUnderContention(t, d) })
	t.Run("RoundTrips", func(t *testing.T) { testRoundTrips(t, d) })
	t.Run("ManualFailover", func(t *testing.T) { testManualFailover(t, d) })
	t.Run("MasterKilled", func(t *testing.T) { testPrimaryKilled(t, d, 3) })
}
