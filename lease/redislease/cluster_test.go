package redislease_test

import (
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/fencekit/fencekit/internal/testkit"
	"github.com/fencekit/fencekit/lease"
	"github.com/fencekit/fencekit/lease/leasetest"
	"github.com/fencekit/fencekit/lease/redislease"
	"github.com/fencekit/fencekit/lease/redislease/redistest"
)

// clusterDeployment is a Redis Cluster for the failover scenarios, with
// the Cluster itself for what only a cluster has (slots, the bus).
type clusterDeployment struct {
	redistest.Deployment
	c *redistest.Cluster
}

// TestCluster runs the backend on a Redis Cluster of three masters with one
// replica each (cluster-node-timeout 1 s), started once for all of its
// subtests. They run in order; the failover subtests come last and leave
// the cluster healthy again (roles swapped). The SIGKILL of a master, with
// the stale holder's writes rejected at PostgreSQL and S3, is an
// end-to-end test: integration/redisfailover (TestClusterMasterKilled).
func TestCluster(t *testing.T) {
	cl := redistest.StartCluster(t, redistest.ClusterOptions{Masters: 3, NodeTimeout: time.Second})
	d := clusterDeployment{cl.Deployment(), cl}
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
				return func() lease.Backend { return newBackend(t, d.Client(t), prefix) }
			},
			LoseData: flushAll(d),
			Lacks:    redisLacks,
		})
	})
	steady("ExclusiveUnderContention", func(t *testing.T) { testExclusiveUnderContention(t, d) })
	steady("RoundTrips", func(t *testing.T) { testRoundTrips(t, d) })
	steady("RenewalsAtScale", func(t *testing.T) { testRenewalsAtScale(t, d, 10000) })
	steady("ShardedWakeUps", func(t *testing.T) { testShardedWakeUps(t, d) })
	steady("ShardedConnsClosed", func(t *testing.T) { testShardedConnsClosed(t, d) })
	t.Run("ManualFailover", func(t *testing.T) { testManualFailover(t, d) })
	t.Run("ShardedWakeUpsAcrossFailover", func(t *testing.T) { testShardedWakeUpsAcrossFailover(t, d) })
}

// testRenewalsAtScale holds n leases, spread by their names over every
// master, through one Manager, and counts the round trips of their
// heartbeats over one renew interval: each batch the Manager sends (the
// heartbeats due within one RenewBatchWindow) costs one pipeline per
// master, whatever its size, so a renew interval costs at most one
// pipeline per master per batch window in it, not one round trip per lease.
func testRenewalsAtScale(t *testing.T, d clusterDeployment, n int) {
	const ttl = 10 * time.Second
	counter := newNodeCounter()
	b := newBackend(t, d.HookedClient(t, counter.hook), redistest.UniquePrefix())
	log := &flushLog{}
	// Each Release first waits for its lease's renew in flight, and 10,000
	// renewals on six servers sharing two loaded cores take seconds: the
	// default ReleaseTimeout ran out (at load 15-20) before the releases
	// were sent. What is tested here is the round trips of renewal, and
	// that no lease is lost; a release may take until the grant would end.
	m := testkit.NewManager(t, b, ttl, func(o *lease.Options) { o.Observer = log }, lease.WithReleaseTimeout(2*ttl))
	opts := m.Options()
	ctx := testkit.Context(t)

	start := time.Now()
	held := make([]*lease.Lease, n)
	var wg sync.WaitGroup
	const workers = 32
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := w; i < n; i += workers {
				l, err := m.TryAcquire(ctx, fmt.Sprintf("scale-%d", i))
				if err != nil {
					t.Errorf("TryAcquire: %v", err)
					return
				}
				held[i] = l
			}
		}()
	}
	wg.Wait()
	if t.Failed() {
		return
	}
	acquired := time.Since(start)
	masters := d.Primaries(t)

	// Skip the first interval (the heartbeats of the leases acquired last
	// were not all due yet), then count the round trips sent during one
	// interval and the batches sent during it (each batch's renewals share
	// its send time), once their replies are in.
	time.Sleep(opts.RenewInterval)
	from, before := time.Now(), counter.perNode()
	time.Sleep(opts.RenewInterval)
	to, after := time.Now(), counter.perNode()
	time.Sleep(time.Second)
	slowest := log.latency()
	all, failed := log.take()
	if failed > 0 {
		t.Errorf("%d renewals failed", failed)
	}
	per := diff(after, before)
	var trips int64
	for _, ms := range masters {
		trips += per[ms.Addr]
	}
	// A batch costs one round trip to each master that holds one of its
	// leases.
	owners := d.c.SlotOwners(t)
	// The counters were read at from and to, and a batch's pipeline to a
	// master is counted when it goes out, at most its latency after the
	// batch's send time: a batch sent within the slowest batch's latency
	// before to may be counted after to (not in per), and one sent as long
	// before from may be counted after from (in per, not in batches). On a
	// loaded machine a batch takes hundreds of milliseconds, so that edge
	// holds several batches; each is allowed for, on its side.
	masterSet := func(names []string) map[string]bool {
		on := make(map[string]bool)
		for _, name := range names {
			on[owners[redislease.SlotOf(b.KeysFor(name).Lease)].Addr] = true
		}
		return on
	}
	want := make(map[string]int64)
	atEnd := make(map[string]int64)   // batches in the interval that may be counted after it
	atStart := make(map[string]int64) // batches before it that may be counted in it
	batches, renewals := 0, 0         // sent in the interval
	for sent, names := range all {
		if !sent.Before(from) && sent.Before(to) {
			batches++
			renewals += len(names)
		}
		on := masterSet(names)
		for addr := range on {
			switch {
			case !sent.Before(from) && sent.Before(to):
				want[addr]++
				if !sent.Before(to.Add(-slowest)) {
					atEnd[addr]++
				}
			case sent.Before(from) && !sent.Before(from.Add(-slowest)):
				atStart[addr]++
			}
		}
	}
	windows := float64(opts.RenewInterval) / float64(opts.RenewBatchWindow)
	t.Logf("%d leases over %d masters, acquired in %v by %d goroutines; renew interval %v, batch window %v",
		n, len(masters), acquired.Round(time.Millisecond), workers, opts.RenewInterval.Round(time.Millisecond), opts.RenewBatchWindow.Round(time.Millisecond))
	t.Logf("one renew interval: %d renewals in %d batches, %d round trips (%v per master, for batches with leases there %v; %.0f batch windows in an interval), %.0f renewals per round trip",
		renewals, batches, trips, per, want, windows, float64(renewals)/max(float64(trips), 1))
	for _, ms := range masters {
		// One pipeline per batch per master (a batch sent at either end of
		// the interval may count on one side only).
		lo, hi := want[ms.Addr]-atEnd[ms.Addr]-1, want[ms.Addr]+atStart[ms.Addr]+2
		if got := per[ms.Addr]; got < lo || got > hi {
			t.Errorf("master %s: %d round trips for the %d batches that had leases there (%d of them within the slowest batch's %v of the interval's end, %d before its start; want %d to %d)",
				ms.Addr, got, want[ms.Addr], atEnd[ms.Addr], slowest, atStart[ms.Addr], lo, hi)
		}
		if limit := int64(windows) + 2; per[ms.Addr] > limit {
			t.Errorf("master %s: %d round trips in one renew interval, more than one per batch window (%d)", ms.Addr, per[ms.Addr], limit)
		}
	}
	for _, l := range held {
		if err := l.Err(); err != nil {
			t.Fatalf("lease %s ended while renewed at scale: %v", l.Name(), err)
		}
	}
	start = time.Now()
	// Release must report a lease lost only when it was: its local
	// deadline had passed when Release was called (on a loaded machine
	// the release of 10,000 leases takes seconds, and the heartbeats of
	// those not yet released can fall behind meanwhile: those are lost
	// for real, and Release says so). A lease still valid at the call
	// that Release reports lost is a defect.
	var (
		mu      sync.Mutex
		late    []time.Duration // valid at the call, reported lost: local deadline from the call
		expired []time.Duration // past their local deadline at the call, reported lost
	)
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := w; i < n; i += workers {
				dl, at := held[i].Deadline(), time.Now()
				err := held[i].Release(ctx)
				switch {
				case errors.Is(err, lease.ErrLost):
					mu.Lock()
					if dl.After(at) {
						late = append(late, dl.Sub(at))
					} else {
						expired = append(expired, dl.Sub(at))
					}
					mu.Unlock()
				case err != nil:
					t.Errorf("Release: %v", err)
					return
				}
			}
		}()
	}
	wg.Wait()
	t.Logf("released in %v", time.Since(start).Round(time.Millisecond))
	if len(expired) > 0 {
		t.Logf("%d leases had passed their local deadline when Release was called (heartbeats behind during the release phase), deadlines %v from the call; Release reported them lost",
			len(expired), testkit.Span(expired))
	}
	if len(late) > 0 {
		t.Errorf("%d leases valid when Release was called were reported lost by Release; their local deadlines were %v after the call",
			len(late), testkit.Span(late))
	}
}
