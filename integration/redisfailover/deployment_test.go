package redisfailover

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/fencekit/fencekit/internal/testkit"
	"github.com/fencekit/fencekit/lease/redislease"
	"github.com/fencekit/fencekit/lease/redislease/redistest"
)

// The deployment interface and the helpers on it, a subset of
// lease/redislease's failover tests' (failover_test.go, cluster_test.go,
// sentinel_test.go): only what testPrimaryKilled calls. The helpers that
// need no deployment are shared: internal/testkit (NewManager, TryAcquire,
// RenewEvents, Span) and lease/redislease/redistest (UniquePrefix, StoredOwner).

// go-redis logs each failed dial and each Sentinel lookup through its
// package logger; a failover makes hundreds of such lines. The tests report
// what matters themselves.
func init() { redis.SetLogger(discardLogger{}) }

type discardLogger struct{}

func (discardLogger) Printf(context.Context, string, ...any) {}

// deployment is a Redis deployment of several servers that the scenario
// can break: a Redis Cluster or a primary watched by Sentinels.
type deployment interface {
	// client returns a new client of the deployment, closed when t ends.
	client(t *testing.T) redislease.Client
	// admin returns a client of the server s alone.
	admin(s *redistest.Server) *redis.Client
	// primaries returns the servers that take writes now.
	primaries(t *testing.T) []*redistest.Server
	// primaryFor returns the server that takes writes for key now.
	primaryFor(t *testing.T, key string) *redistest.Server
	// replicaOf returns the replica of primary.
	replicaOf(t *testing.T, primary *redistest.Server) *redistest.Server
	// awaitPromoted waits until replica has replaced the killed primary
	// dead, and returns how long it waited.
	awaitPromoted(t *testing.T, dead, replica *redistest.Server) time.Duration
	// awaitHealthy waits until every primary has its replica in sync.
	awaitHealthy(t *testing.T)
}

// sentinelDeployment is a primary and a replica watched by Sentinels,
// reached through go-redis's failover client.
type sentinelDeployment struct{ s *redistest.Sentinel }

func (d sentinelDeployment) client(t *testing.T) redislease.Client   { return d.s.Client(t) }
func (d sentinelDeployment) admin(s *redistest.Server) *redis.Client { return d.s.Admin(s) }
func (d sentinelDeployment) primaries(t *testing.T) []*redistest.Server {
	return []*redistest.Server{d.s.Primary(t)}
}
func (d sentinelDeployment) primaryFor(t *testing.T, key string) *redistest.Server {
	return d.s.Primary(t)
}
func (d sentinelDeployment) replicaOf(t *testing.T, p *redistest.Server) *redistest.Server {
	return d.s.Replica(t)
}
func (d sentinelDeployment) awaitPromoted(t *testing.T, dead, replica *redistest.Server) time.Duration {
	p, took := d.s.AwaitPromoted(t, dead)
	if p != replica {
		t.Fatalf("the Sentinels promoted %s, want %s", p.Addr, replica.Addr)
	}
	return took
}
func (d sentinelDeployment) awaitHealthy(t *testing.T) { d.s.AwaitHealthy(t) }

// clusterDeployment is a Redis Cluster. Its clients are plain go-redis
// cluster clients: redislease.New wraps them to reload their slot map
// after a request got no reply, without which a client keeps sending the
// requests for a dead master's slots to its address for up to a minute.
type clusterDeployment struct{ c *redistest.Cluster }

func (d clusterDeployment) client(t *testing.T) redislease.Client {
	return d.c.Client(t) // New adds the slot-map reload
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
func (d clusterDeployment) awaitPromoted(t *testing.T, dead, replica *redistest.Server) time.Duration {
	return d.c.AwaitPromoted(t, dead, replica)
}
func (d clusterDeployment) awaitHealthy(t *testing.T) { d.c.AwaitHealthy(t) }

func newBackend(t testing.TB, c redislease.Client, prefix string) *redislease.Backend {
	t.Helper()
	b, err := redislease.New(c, func(o *redislease.Options) { o.Prefix = prefix })
	if err != nil {
		t.Fatalf("redislease.New: %v", err)
	}
	t.Cleanup(func() { _ = b.Close() })
	return b
}

// newShardedBackend is newBackend: New publishes with SPUBLISH and
// subscribes with SSUBSCRIBE where the server has them.
func newShardedBackend(t testing.TB, c redislease.Client, prefix string) *redislease.Backend {
	return newBackend(t, c, prefix)
}

// namesOn returns n lease names starting with base whose keys primary
// serves now.
func namesOn(t *testing.T, d deployment, b *redislease.Backend, primary *redistest.Server, base string, n int) []string {
	t.Helper()
	var names []string
	for i := 0; len(names) < n; i++ {
		if i > 100*n {
			t.Fatalf("no %d names of %d tried are served by %s", n, i, primary.Addr)
		}
		name := fmt.Sprintf("%s-%d", base, i)
		if d.primaryFor(t, b.KeysFor(name).Lease) == primary {
			names = append(names, name)
		}
	}
	return names
}

// waitReplicated waits until the replicas of primary have acknowledged
// every write it has taken (WAIT).
func waitReplicated(t *testing.T, d deployment, primary *redistest.Server) {
	t.Helper()
	n, err := d.admin(primary).Do(testkit.Context(t), "WAIT", 1, 5000).Int64()
	if err != nil || n < 1 {
		t.Fatalf("WAIT on %s: %d replicas acknowledged (%v)", primary.Addr, n, err)
	}
}
