package redislease_test

import (
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/fencekit/fencekit/internal/testkit"
	"github.com/fencekit/fencekit/internal/testkit/pairbench"
	"github.com/fencekit/fencekit/lease"
	"github.com/fencekit/fencekit/lease/leasetest"
	"github.com/fencekit/fencekit/lease/redislease"
	"github.com/fencekit/fencekit/lease/redislease/redistest"
)

// newShardedBackend is newBackend: New publishes with SPUBLISH and
// subscribes with SSUBSCRIBE where the server has them.
func newShardedBackend(t testing.TB, c redislease.Client, prefix string) *redislease.Backend {
	return newBackend(t, c, prefix)
}

// newClassicBackend is a Backend with Options.ClassicPubSub.
func newClassicBackend(t testing.TB, c redislease.Client, prefix string) *redislease.Backend {
	t.Helper()
	b, err := redislease.New(c, redislease.WithPrefix(prefix), redislease.WithClassicPubSub())
	if err != nil {
		t.Fatalf("redislease.New: %v", err)
	}
	t.Cleanup(func() { _ = b.Close() })
	return b
}

// The hub's slot function agrees with Redis's CLUSTER KEYSLOT, for the
// channels the backend uses and for keys with odd or missing hash tags.
func TestSlotOfMatchesRedis(t *testing.T) {
	srv := redistest.Start(t, "--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf")
	c := srv.Client()
	b := newBackend(t, c, "fencekit:")
	keys := []string{"", "a", "{", "}", "{}", "{}x", "x{}", "{{a}}", "a{b}c{d}", "{a", "a}", "}{a}", "ünï{ü}", "fencekit:{jobs}:released"}
	for i := range 200 {
		keys = append(keys, b.KeysFor("name-"+strconv.Itoa(i)).Channel, b.KeysFor(strings.Repeat("{", i%5)+strconv.Itoa(i)+"}").Channel)
	}
	for _, k := range keys {
		want, err := c.ClusterKeySlot(testkit.Context(t), k).Result()
		if err != nil {
			t.Fatalf("CLUSTER KEYSLOT %q: %v", k, err)
		}
		if got := redislease.SlotOf(k); got != int(want) {
			t.Errorf("slotOf(%q) = %d, Redis says %d", k, got, want)
		}
	}
}

// wakeUps measures how long waiters take to get a lease after its holder
// releases it: rounds times, for one name on each primary, one waiter each
// blocked in Acquire (PollInterval 10 s: only a release notice can wake it
// within a second). It returns the time from the release to the waiter's
// grant, for every hand-off.
func wakeUps(t *testing.T, d redistest.Deployment, newB func() lease.Backend, rounds int) []time.Duration {
	t.Helper()
	opts := func(o *lease.Options) { o.PollInterval = 10 * time.Second }
	holderB, waiterB := newB(), newB()
	holder := testkit.NewManager(t, holderB, 30*time.Second, opts)
	waiter := testkit.NewManager(t, waiterB, 30*time.Second, opts)
	probe := newBackend(t, d.Client(t), "")
	var names []string
	for i, p := range d.Primaries(t) {
		names = append(names, namesOn(t, d, probe, p, fmt.Sprintf("wake-%d-%d", i, time.Now().UnixNano()), 1)...)
	}
	ctx := testkit.Context(t)
	var (
		mu    sync.Mutex
		waits []time.Duration
	)
	for range rounds {
		var wg sync.WaitGroup
		for _, name := range names {
			l := testkit.TryAcquire(t, holder, name)
			got := make(chan *lease.Lease, 1)
			wg.Add(1)
			go func() {
				defer wg.Done()
				w, err := waiter.Acquire(ctx, name)
				if err != nil {
					t.Errorf("waiter: %v", err)
					got <- nil
					return
				}
				got <- w
			}()
			time.Sleep(50 * time.Millisecond) // the waiter tries, is refused, subscribes
			released := time.Now()
			if err := l.Release(ctx); err != nil {
				t.Fatal(err)
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				w := <-got
				if w == nil {
					return
				}
				mu.Lock()
				waits = append(waits, time.Since(released))
				mu.Unlock()
				if err := w.Release(ctx); err != nil {
					t.Errorf("Release: %v", err)
				}
			}()
		}
		wg.Wait()
	}
	return waits
}

// quantiles formats the minimum, median, 90th percentile and maximum of ds.
func quantiles(ds []time.Duration) string {
	if len(ds) == 0 {
		return "-"
	}
	q := func(p float64) time.Duration { return pairbench.Percentile(ds, p).Round(10 * time.Microsecond) }
	return fmt.Sprintf("min %v, median %v, p90 %v, max %v (n=%d)", q(0), q(50), q(90), q(100), len(ds))
}

// pubsubBusStats sums, over every node of the cluster, the cluster bus
// messages that carried classic and sharded pub/sub messages.
func pubsubBusStats(t *testing.T, cl *redistest.Cluster) (classic, sharded int64) {
	t.Helper()
	for _, s := range cl.Nodes() {
		info, err := cl.Admin(s).ClusterInfo(testkit.Context(t)).Result()
		if err != nil {
			t.Fatalf("CLUSTER INFO on %s: %v", s.Addr, err)
		}
		for line := range strings.Lines(info) {
			k, v, _ := strings.Cut(strings.TrimSpace(line), ":")
			n, _ := strconv.ParseInt(v, 10, 64)
			switch k {
			case "cluster_stats_messages_publish_received":
				classic += n
			case "cluster_stats_messages_publishshard_received":
				sharded += n
			}
		}
	}
	return classic, sharded
}

// settledBusStats waits until the cluster bus counters have stopped moving
// (messages of earlier releases are delivered in the background) for
// 300 ms, up to 5 s, and returns them.
func settledBusStats(t *testing.T, cl *redistest.Cluster) (classic, sharded int64) {
	classic, sharded = pubsubBusStats(t, cl)
	stable := time.Now()
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline) && time.Since(stable) < 300*time.Millisecond; {
		time.Sleep(50 * time.Millisecond)
		c, s := pubsubBusStats(t, cl)
		if c != classic || s != sharded {
			classic, sharded, stable = c, s, time.Now()
		}
	}
	return classic, sharded
}

// testShardedWakeUps, on the Cluster: with sharded pub/sub the conformance
// suite passes (its wake-up test included); waiters on every master are
// woken within milliseconds of a release, each over a connection to its
// slot's master (no poll: PollInterval is 10 s); a release's notice
// crosses the cluster bus only to the replica of its shard (SPUBLISH),
// where classic PUBLISH reaches every other node. Classic pub/sub is
// measured alongside for comparison.
func testShardedWakeUps(t *testing.T, d clusterDeployment) {
	t.Run("Conformance", func(t *testing.T) {
		leasetest.Run(t, leasetest.Config{
			NewStore: func(t *testing.T) func() lease.Backend {
				prefix := redistest.UniquePrefix()
				return func() lease.Backend { return newShardedBackend(t, d.Client(t), prefix) }
			},
			LoseData: flushAll(d),
			Lacks:    redisLacks,
		})
	})
	prefix := redistest.UniquePrefix()
	var sharded []*redislease.Backend
	newSharded := func() lease.Backend {
		b := newShardedBackend(t, d.Client(t), prefix)
		sharded = append(sharded, b)
		return b
	}
	classic0, shard0 := settledBusStats(t, d.c) // the conformance run's notices are still on the bus
	waits := wakeUps(t, d, newSharded, 10)
	releases := int64(len(waits) * 2) // holder and waiter each release once per hand-off
	// The cluster bus delivers in the background: wait for the counts.
	var classic1, shard1 int64
	for deadline := time.Now().Add(2 * time.Second); ; {
		classic1, shard1 = pubsubBusStats(t, d.c)
		if shard1-shard0 >= releases || time.Now().After(deadline) {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	for _, b := range sharded {
		if kind := b.PubSubKind(); kind != "sharded, per slot" && kind != "" {
			t.Errorf("the hub of a Cluster client on Redis 7 chose %q pub/sub, want sharded, per slot", kind)
		}
	}
	t.Logf("sharded pub/sub, waiters on %d masters: woken %s", len(d.Primaries(t)), quantiles(waits))
	t.Logf("cluster bus, %d releases: %d classic and %d sharded pub/sub messages received", releases, classic1-classic0, shard1-shard0)
	if len(waits) == 0 || slices.Max(waits) > time.Second {
		t.Errorf("sharded wake-ups: %s; want every waiter woken by the release notice, well within the 10 s poll interval", quantiles(waits))
	}
	if classic1 != classic0 {
		t.Errorf("%d classic pub/sub messages crossed the cluster bus, want none (SPUBLISH only)", classic1-classic0)
	}
	if n := shard1 - shard0; n < releases || n > releases+10 {
		t.Errorf("%d sharded messages crossed the cluster bus for %d releases, want one per release (to its shard's replica)", n, releases)
	}

	classicWaits := wakeUps(t, d, func() lease.Backend { return newClassicBackend(t, d.Client(t), prefix) }, 10)
	time.Sleep(100 * time.Millisecond) // for the count only
	classic2, _ := pubsubBusStats(t, d.c)
	t.Logf("classic pub/sub, for comparison: woken %s; %d classic messages crossed the cluster bus for %d releases",
		quantiles(classicWaits), classic2-classic1, 2*len(classicWaits))
}

// testShardedWakeUpsAcrossFailover: waiters subscribed with SSUBSCRIBE to
// channels of one master's slots stay subscribed across a manual failover
// of that master: the old master unsubscribes them (its slots moved), the
// hub subscribes again through the new master, and a release afterwards
// still wakes them within milliseconds, not after the poll interval.
func testShardedWakeUpsAcrossFailover(t *testing.T, d clusterDeployment) {
	prefix := redistest.UniquePrefix()
	opts := func(o *lease.Options) { o.PollInterval = 20 * time.Second }
	hb := newShardedBackend(t, d.Client(t), prefix)
	wb := newShardedBackend(t, d.Client(t), prefix)
	holder := testkit.NewManager(t, hb, 30*time.Second, opts)
	waiter := testkit.NewManager(t, wb, 30*time.Second, opts)
	target := d.Primaries(t)[0]
	names := namesOn(t, d, hb, target, "wake-failover", 3)
	ctx := testkit.Context(t)
	type got struct {
		l  *lease.Lease
		at time.Time
	}
	results := make(chan got, len(names))
	var held []*lease.Lease
	var wg sync.WaitGroup
	for _, name := range names {
		held = append(held, testkit.TryAcquire(t, holder, name))
		wg.Add(1)
		go func() {
			defer wg.Done()
			l, err := waiter.Acquire(ctx, name)
			if err != nil {
				t.Errorf("waiter of %s: %v", name, err)
				results <- got{}
				return
			}
			results <- got{l, time.Now()}
		}()
	}
	time.Sleep(200 * time.Millisecond) // every waiter subscribed
	conns := wb.PubSubConns()
	redistest.WaitReplicated(t, d, target)
	newMaster, took := d.Failover(t, target)
	time.Sleep(500 * time.Millisecond) // the hub moves its subscriptions
	t.Logf("failover of %s to %s in %v; the waiters' hub had %d connections", target.Addr, newMaster.Addr, took, conns)
	var waits []time.Duration
	for _, l := range held {
		released := time.Now()
		if err := l.Release(ctx); err != nil {
			t.Fatalf("Release of %s: %v", l.Name(), err)
		}
		select {
		case r := <-results:
			if r.l == nil {
				t.FailNow()
			}
			waits = append(waits, r.at.Sub(released))
			if err := r.l.Release(ctx); err != nil {
				t.Fatal(err)
			}
		case <-time.After(5 * time.Second):
			t.Fatalf("no waiter woken within 5 s of the release of %s after the failover (poll interval 20 s)", l.Name())
		}
	}
	wg.Wait()
	t.Logf("after the failover, waiters woken %s", quantiles(waits))
	d.AwaitHealthy(t)
}

// On a standalone Redis 7 server the hub speaks sharded pub/sub over one
// connection; on a server without SPUBLISH (renamed away here, as on Redis
// 6) it falls back to classic pub/sub and the release script to PUBLISH.
// Either way a release wakes a waiter at once.
func TestShardedPubSubFallback(t *testing.T) {
	for _, tc := range []struct {
		name  string
		extra []string
		want  string
	}{
		{"Redis7", nil, "sharded"},
		{"WithoutSPUBLISH", []string{"--rename-command", "SPUBLISH", ""}, "classic"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			srv := redistest.Start(t, tc.extra...)
			prefix := "fencekit:"
			hb := newShardedBackend(t, srv.Client(), prefix)
			wb := newShardedBackend(t, srv.Client(), prefix)
			opts := func(o *lease.Options) { o.PollInterval = 10 * time.Second }
			holder := testkit.NewManager(t, hb, 30*time.Second, opts)
			waiter := testkit.NewManager(t, wb, 30*time.Second, opts)
			l := testkit.TryAcquire(t, holder, "fallback")
			type res struct {
				l  *lease.Lease
				at time.Time
			}
			got := make(chan res, 1)
			go func() {
				w, err := waiter.Acquire(testkit.Context(t), "fallback")
				if err != nil {
					t.Errorf("waiter: %v", err)
				}
				got <- res{w, time.Now()}
			}()
			time.Sleep(100 * time.Millisecond)
			released := time.Now()
			if err := l.Release(testkit.Context(t)); err != nil {
				t.Fatal(err)
			}
			r := <-got
			if r.l == nil {
				t.FailNow()
			}
			defer r.l.Release(testkit.Context(t))
			if kind := wb.PubSubKind(); kind != tc.want {
				t.Errorf("the hub chose %q pub/sub, want %s", kind, tc.want)
			}
			wake := r.at.Sub(released)
			t.Logf("%s pub/sub: waiter woken %v after the release", wb.PubSubKind(), wake)
			if wake > time.Second {
				t.Errorf("waiter woken %v after the release; the release notice did not reach it (poll interval 10 s)", wake)
			}
		})
	}
}

// A per-slot connection is closed when its last waiter leaves.
func testShardedConnsClosed(t *testing.T, d clusterDeployment) {
	b := newShardedBackend(t, d.Client(t), redistest.UniquePrefix())
	var stops []func()
	for i := range 5 {
		_, stop, err := b.Watch(testkit.Context(t), "conns-"+strconv.Itoa(i))
		if err != nil {
			t.Fatalf("Watch: %v", err)
		}
		stops = append(stops, stop)
	}
	slots := make(map[int]bool)
	for i := range 5 {
		slots[redislease.SlotOf(b.KeysFor("conns-"+strconv.Itoa(i)).Channel)] = true
	}
	if n := b.PubSubConns(); n != len(slots) {
		t.Errorf("%d pub/sub connections for 5 names in %d slots, want one per slot", n, len(slots))
	}
	for _, stop := range stops {
		stop()
	}
	deadline := time.Now().Add(5 * time.Second)
	for b.PubSubConns() != 0 {
		if time.Now().After(deadline) {
			t.Fatalf("%d pub/sub connections left after every waiter left", b.PubSubConns())
		}
		time.Sleep(10 * time.Millisecond)
	}
}
