package redistest

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// SilenceLogger discards what go-redis writes through its package logger:
// a line for each failed dial and each Sentinel lookup, hundreds of them
// in a failover. It is for the init function of a test package that
// breaks deployments; the tests report what matters themselves.
func SilenceLogger() { redis.SetLogger(discardLogger{}) }

type discardLogger struct{}

func (discardLogger) Printf(context.Context, string, ...any) {}

// Deployment is a Redis deployment of several servers that a failover test
// can break, the same calls for both kinds: a Redis Cluster
// (Cluster.Deployment) or a primary with a replica watched by Sentinels
// (Sentinel.Deployment).
type Deployment interface {
	// Client returns a new client of the deployment, closed when t ends.
	Client(t testing.TB) redis.UniversalClient
	// HookedClient is Client with hook(addr) added to the commands the
	// client sends to the server at addr: to every node a cluster
	// client talks to, to the primary of the moment for a Sentinel
	// deployment (the hook is not moved by a failover).
	HookedClient(t testing.TB, hook func(addr string) redis.Hook) redis.UniversalClient
	// Admin returns a client of the server s alone.
	Admin(s *Server) *redis.Client
	// Primaries returns the servers that take writes now.
	Primaries(t testing.TB) []*Server
	// PrimaryFor returns the server that takes writes for key now.
	PrimaryFor(t testing.TB, key string) *Server
	// ReplicaOf returns the replica of primary.
	ReplicaOf(t testing.TB, primary *Server) *Server
	// Failover runs a manual failover of primary and returns the new
	// primary and the time from the command to the switch.
	Failover(t testing.TB, primary *Server) (*Server, time.Duration)
	// AwaitPromoted waits until replica has replaced the killed primary
	// dead, and returns how long it waited; it fails t if another server
	// was promoted.
	AwaitPromoted(t testing.TB, dead, replica *Server) time.Duration
	// AwaitHealthy waits until every primary has its replica in sync.
	AwaitHealthy(t testing.TB)
	// ExpectNoFailover makes t fail at its end, with the reason, if the
	// deployment failed over by itself meanwhile: a server that did not
	// answer within the failure timeout on an overloaded machine makes
	// its replica take over, and any grant not yet replicated is lost,
	// which the tests that do not fail over on purpose do not allow for.
	ExpectNoFailover(t testing.TB)
}

// NamesOn returns n names starting with base (base-0, base-1, ...) whose
// keys, as keyOf gives them, primary serves now.
func NamesOn(t testing.TB, d Deployment, primary *Server, base string, n int, keyOf func(name string) string) []string {
	t.Helper()
	var names []string
	for i := 0; len(names) < n; i++ {
		if i > 100*n {
			t.Fatalf("redistest: no %d names of %d tried are served by %s", n, i, primary.Addr)
		}
		name := fmt.Sprintf("%s-%d", base, i)
		if d.PrimaryFor(t, keyOf(name)) == primary {
			names = append(names, name)
		}
	}
	return names
}

// WaitReplicated waits until the replicas of primary have acknowledged
// every write it has taken (WAIT), and fails t if none has within 5 s.
func WaitReplicated(t testing.TB, d Deployment, primary *Server) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	n, err := d.Admin(primary).Do(ctx, "WAIT", 1, 5000).Int64()
	if err != nil || n < 1 {
		t.Fatalf("redistest: WAIT on %s: %d replicas acknowledged (%v)", primary.Addr, n, err)
	}
}

// Deployment returns the Sentinel deployment's Deployment, reached through
// go-redis's failover client.
func (s *Sentinel) Deployment() Deployment { return sentinelDeployment{s} }

type sentinelDeployment struct{ s *Sentinel }

func (d sentinelDeployment) Client(t testing.TB) redis.UniversalClient { return d.s.Client(t) }

func (d sentinelDeployment) HookedClient(t testing.TB, hook func(addr string) redis.Hook) redis.UniversalClient {
	c := d.s.Client(t)
	c.AddHook(hook(d.s.Primary(t).Addr))
	return c
}

func (d sentinelDeployment) Admin(s *Server) *redis.Client             { return d.s.Admin(s) }
func (d sentinelDeployment) Primaries(t testing.TB) []*Server          { return []*Server{d.s.Primary(t)} }
func (d sentinelDeployment) PrimaryFor(t testing.TB, _ string) *Server { return d.s.Primary(t) }
func (d sentinelDeployment) ReplicaOf(t testing.TB, _ *Server) *Server { return d.s.Replica(t) }
func (d sentinelDeployment) AwaitHealthy(t testing.TB)                 { d.s.AwaitHealthy(t) }

func (d sentinelDeployment) Failover(t testing.TB, _ *Server) (*Server, time.Duration) {
	return d.s.Failover(t)
}

func (d sentinelDeployment) AwaitPromoted(t testing.TB, dead, replica *Server) time.Duration {
	t.Helper()
	p, took := d.s.AwaitPromoted(t, dead)
	if p != replica {
		t.Fatalf("redistest: the Sentinels promoted %s, want %s", p.Addr, replica.Addr)
	}
	return took
}

func (d sentinelDeployment) ExpectNoFailover(t testing.TB) {
	p := d.s.Primary(t)
	t.Cleanup(func() {
		if now := d.s.Primary(t); now != p {
			t.Errorf("the Sentinels failed %s over to %s by themselves during this test: it stalled beyond down-after-milliseconds; the machine is overloaded", p.Addr, now.Addr)
			d.s.AwaitHealthy(t)
		}
	})
}

// Deployment returns the cluster's Deployment. Its clients are plain
// go-redis cluster clients: redislease.New wraps them to reload their slot
// map after a request got no reply, without which a client keeps sending
// the requests for a dead master's slots to its address for up to a
// minute.
func (c *Cluster) Deployment() Deployment { return clusterDeployment{c} }

type clusterDeployment struct{ c *Cluster }

func (d clusterDeployment) Client(t testing.TB) redis.UniversalClient { return d.c.Client(t) }

func (d clusterDeployment) HookedClient(t testing.TB, hook func(addr string) redis.Hook) redis.UniversalClient {
	return d.c.Client(t, func(o *redis.ClusterOptions) {
		o.NewClient = func(opt *redis.Options) *redis.Client {
			c := redis.NewClient(opt)
			c.AddHook(hook(opt.Addr))
			return c
		}
	})
}

func (d clusterDeployment) Admin(s *Server) *redis.Client               { return d.c.Admin(s) }
func (d clusterDeployment) Primaries(t testing.TB) []*Server            { return d.c.Masters(t) }
func (d clusterDeployment) PrimaryFor(t testing.TB, key string) *Server { return d.c.MasterFor(t, key) }
func (d clusterDeployment) ReplicaOf(t testing.TB, primary *Server) *Server {
	return d.c.ReplicaOf(t, primary)
}
func (d clusterDeployment) AwaitHealthy(t testing.TB) { d.c.AwaitHealthy(t) }

func (d clusterDeployment) Failover(t testing.TB, primary *Server) (*Server, time.Duration) {
	return d.c.Failover(t, primary)
}

func (d clusterDeployment) AwaitPromoted(t testing.TB, dead, replica *Server) time.Duration {
	return d.c.AwaitPromoted(t, dead, replica)
}

func (d clusterDeployment) ExpectNoFailover(t testing.TB) {
	epoch := d.c.CurrentEpoch(t)
	t.Cleanup(func() {
		if now := d.c.CurrentEpoch(t); now != epoch {
			t.Errorf("the cluster failed over by itself during this test (epoch %d -> %d): a node stalled beyond cluster-node-timeout; the machine is overloaded", epoch, now)
			d.c.AwaitHealthy(t)
		}
	})
}
