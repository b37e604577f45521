package redislease_test

import (
	"context"
	"errors"
	"fmt"
	mrand "math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/fencekit/fencekit/fence"
	"github.com/fencekit/fencekit/internal/testkit"
	"github.com/fencekit/fencekit/lease"
	"github.com/fencekit/fencekit/lease/redislease"
	"github.com/fencekit/fencekit/lease/redislease/redistest"
)

// The tests of Redis deployments of several servers (cluster_test.go,
// sentinel_test.go and the scenarios here, shared by both) run on a
// redistest.Deployment, which integration/redisfailover (the SIGKILL
// scenario) uses too, and make every Manager with testkit.NewManager, so
// that a change of the lease API is made in one place (internal/testkit).

func init() { redistest.SilenceLogger() }

// namesOn returns n lease names starting with base whose keys primary
// serves now.
func namesOn(t *testing.T, d redistest.Deployment, b *redislease.Backend, primary *redistest.Server, base string, n int) []string {
	t.Helper()
	return redistest.NamesOn(t, d, primary, base, n, func(name string) string { return b.KeysFor(name).Lease })
}

// nodeCounter counts round trips per server: each command and each
// pipeline sent to a server is one, except the handshake of a new
// connection and the cluster client's own discovery (CLUSTER SLOTS,
// COMMAND).
type nodeCounter struct {
	mu sync.Mutex
	n  map[string]*redistest.RoundTrips
}

func newNodeCounter() *nodeCounter { return &nodeCounter{n: make(map[string]*redistest.RoundTrips)} }

// hook returns a go-redis hook that counts the round trips to addr.
func (c *nodeCounter) hook(addr string) redis.Hook {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.n[addr] == nil {
		c.n[addr] = new(redistest.RoundTrips)
	}
	return c.n[addr]
}

// total returns the round trips to every server so far.
func (c *nodeCounter) total() int64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	var sum int64
	for _, n := range c.n {
		sum += n.Load()
	}
	return sum
}

// perNode returns the round trips to each server so far.
func (c *nodeCounter) perNode() map[string]int64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	m := make(map[string]int64, len(c.n))
	for addr, n := range c.n {
		m[addr] = n.Load()
	}
	return m
}

// testExclusiveUnderContention: workers over four clients (each with its
// own Manager; one of them never renews, so its leases expire during
// work) take one lease per primary in turns for 3 s (longer on a loaded
// machine, until each lease was granted 20 times), working up to 1.5 TTL
// each time; the overlap checker of the exclusivity tests finds no holder
// that believed it held a lease, or reported a deadline, after a later
// grant of it had been made, and no token granted twice.
func testExclusiveUnderContention(t *testing.T, d redistest.Deployment) {
	const ttl = 100 * time.Millisecond
	prefix := redistest.UniquePrefix()
	var mgrs []*lease.Manager
	var probe *redislease.Backend
	for i := range 4 {
		b := newBackend(t, d.Client(t), prefix)
		probe = b
		mgrs = append(mgrs, testkit.NewManager(t, b, ttl, func(o *lease.Options) { o.DisableAutoRenew = i == 3 }))
	}
	var names []string
	for i, p := range d.Primaries(t) {
		names = append(names, namesOn(t, d, probe, p, fmt.Sprintf("contended-%d", i), 1)...)
	}
	var (
		mu       sync.Mutex
		holdings = make(map[string][]holding)
	)
	// The overlap check needs hand-offs of each lease to look at: the
	// workers take turns for 3 s, and on a machine so loaded that fewer
	// than minGrants of a lease were made by then, carry on with that
	// lease until there are that many, for up to a minute. Fewer after
	// that means the lease stopped being handed over.
	const minGrants = 20
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	start := time.Now()
	more := func(name string) bool {
		mu.Lock()
		n := len(holdings[name])
		mu.Unlock()
		since := time.Since(start)
		return since < 3*time.Second || (n < minGrants && since < time.Minute)
	}
	var wg sync.WaitGroup
	for _, name := range names {
		for w := range 4 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for more(name) {
					mi := (w + mrand.N(len(mgrs))) % len(mgrs)
					actx, cancel := context.WithTimeout(ctx, 500*time.Millisecond)
					l, err := mgrs[mi].Acquire(actx, name)
					acquiredAt := time.Now()
					cancel()
					if err != nil {
						continue
					}
					h := holding{token: l.Token(), acquiredAt: acquiredAt, manager: fmt.Sprintf("client %d", mi)}
					h = workWhileHeld(t, ctx, l, h, time.Now().Add(time.Duration(mrand.N(4))*ttl/2), nil) // 0 to 1.5 TTL of work
					mu.Lock()
					holdings[name] = append(holdings[name], h)
					mu.Unlock()
				}
			}()
		}
	}
	wg.Wait()
	for _, name := range names {
		hs := holdings[name]
		lost := checkNoOverlap(t, hs)
		t.Logf("%s: %d grants over %d clients checked, %d lost during work", name, len(hs), len(mgrs), lost)
		if len(hs) < minGrants {
			t.Errorf("%s: only %d grants in %v, want %d: the test did not exercise contention", name, len(hs), time.Since(start).Round(time.Millisecond), minGrants)
		}
	}
}

// flushLog records, for every renewal the heartbeats sent, its lease name
// and the send time of its batch (every lease of one batch shares it).
type flushLog struct {
	lease.NopObserver
	mu      sync.Mutex
	batches map[time.Time][]string
	slowest map[time.Time]time.Duration // each batch's longest renewal
	failed  int
}

func (f *flushLog) Renewed(e lease.RenewedEvent) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if e.Err != nil {
		f.failed++
		return
	}
	if f.batches == nil {
		f.batches = make(map[time.Time][]string)
	}
	f.batches[e.Sent] = append(f.batches[e.Sent], e.Name)
	if f.slowest == nil {
		f.slowest = make(map[time.Time]time.Duration)
	}
	f.slowest[e.Sent] = max(f.slowest[e.Sent], e.Latency)
}

// latency returns the longest time any batch logged so far took.
func (f *flushLog) latency() time.Duration {
	f.mu.Lock()
	defer f.mu.Unlock()
	var d time.Duration
	for _, l := range f.slowest {
		d = max(d, l)
	}
	return d
}

func (f *flushLog) take() (map[time.Time][]string, int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	b, n := f.batches, f.failed
	f.batches, f.slowest, f.failed = nil, nil, 0
	return b, n
}

// testRoundTrips: with the scripts cached on every server, an acquire, a
// renew and a release each cost one round trip to one server; and the
// heartbeats of leases spread over every primary go out as one pipeline
// per server per batch: over a few renew intervals, the round trips are
// exactly the sum, over the batches sent, of the servers that batch's
// leases live on, however many leases each batch holds.
func testRoundTrips(t *testing.T, d redistest.Deployment) {
	counter := newNodeCounter()
	b := newBackend(t, d.HookedClient(t, counter.hook), redistest.UniquePrefix())
	ctx := testkit.Context(t)
	primaries := d.Primaries(t)
	nodeOf := make(map[string]string)
	var names []string
	for i, p := range primaries {
		on := namesOn(t, d, b, p, fmt.Sprintf("rt-%d", i), 11)
		for _, n := range on {
			nodeOf[n] = p.Addr
		}
		names = append(names, on...)
	}
	manual := testkit.NewManager(t, b, 10*time.Second, func(o *lease.Options) { o.DisableAutoRenew = true })
	// Warm up: every server caches the scripts (the first EVALSHA of a
	// script on a server is answered NOSCRIPT and sent again as EVAL).
	for i := range primaries {
		l := testkit.TryAcquire(t, manual, names[i*11])
		if err := l.Renew(ctx); err != nil {
			t.Fatal(err)
		}
		if err := l.Release(ctx); err != nil {
			t.Fatal(err)
		}
	}
	for i := range primaries {
		name := names[i*11]
		before := counter.total()
		l := testkit.TryAcquire(t, manual, name)
		if n := counter.total() - before; n != 1 {
			t.Errorf("TryAcquire of %s took %d round trips, want 1", name, n)
		}
		before = counter.total()
		if err := l.Renew(ctx); err != nil {
			t.Fatal(err)
		}
		if n := counter.total() - before; n != 1 {
			t.Errorf("Renew of %s took %d round trips, want 1", name, n)
		}
		before = counter.total()
		if err := l.Release(ctx); err != nil {
			t.Fatal(err)
		}
		if n := counter.total() - before; n != 1 {
			t.Errorf("Release of %s took %d round trips, want 1", name, n)
		}
	}

	// Heartbeats in batches: 10 leases per primary.
	log := &flushLog{}
	hb := testkit.NewManager(t, b, 3*time.Second, func(o *lease.Options) {
		o.RenewInterval = 500 * time.Millisecond
		o.RenewBatchWindow = 100 * time.Millisecond
		o.Observer = log
	})
	var held []*lease.Lease
	for i := range primaries {
		for _, name := range names[i*11+1 : (i+1)*11] {
			held = append(held, testkit.TryAcquire(t, hb, name))
		}
	}
	log.take()
	before := counter.perNode()
	time.Sleep(1600 * time.Millisecond) // three heartbeats each
	after := counter.perNode()
	batches, failed := log.take()
	if failed > 0 {
		t.Fatalf("%d renewals failed", failed)
	}
	want := make(map[string]int64)
	renewals := 0
	for _, leases := range batches {
		servers := make(map[string]bool)
		for _, n := range leases {
			servers[nodeOf[n]] = true
		}
		for s := range servers {
			want[s]++
		}
		renewals += len(leases)
	}
	// A batch in flight when the window ended may have been counted on one
	// side only: allow one round trip per server of slack.
	for _, p := range primaries {
		got := after[p.Addr] - before[p.Addr]
		if got < want[p.Addr]-1 || got > want[p.Addr]+1 {
			t.Errorf("server %s: %d round trips for %d batches that had leases there (renewals in all: %d)", p.Addr, got, want[p.Addr], renewals)
		}
	}
	t.Logf("%d leases over %d primaries: %d renewals in %d batches; round trips per server %v (want %v)",
		len(held), len(primaries), renewals, len(batches), diff(after, before), want)
	if renewals < 2*len(held) {
		t.Errorf("only %d renewals of %d leases in 1.6 s with a renew interval of 500 ms", renewals, len(held))
	}
	for _, l := range held {
		if err := l.Release(ctx); err != nil {
			t.Fatal(err)
		}
	}
}

func diff(after, before map[string]int64) map[string]int64 {
	d := make(map[string]int64)
	for k, v := range after {
		if v-before[k] != 0 {
			d[k] = v - before[k]
		}
	}
	return d
}

// testManualFailover: leases are held on every primary, renewed every
// 250 ms, while one primary is failed over by hand (CLUSTER FAILOVER, or
// SENTINEL FAILOVER). Their grants had reached the replica, so every lease
// survives: none is lost, the ones on the failed-over primary are renewed
// on the new one (which names their owners), another client still cannot
// take them, and every token granted after the failover is greater than
// every token granted before it.
func testManualFailover(t *testing.T, d redistest.Deployment) {
	const ttl = 10 * time.Second
	prefix := redistest.UniquePrefix()
	log := &testkit.RenewEvents{}
	b := newBackend(t, d.Client(t), prefix)
	m := testkit.NewManager(t, b, ttl, func(o *lease.Options) { o.RenewInterval = 250 * time.Millisecond; o.Observer = log })
	other := testkit.NewManager(t, newBackend(t, d.Client(t), prefix), ttl)
	ctx := testkit.Context(t)
	primaries := d.Primaries(t)
	target := primaries[0]
	var held []*lease.Lease
	var onTarget []string
	for i, p := range primaries {
		ns := namesOn(t, d, b, p, fmt.Sprintf("manual-%d", i), 3)
		if p == target {
			onTarget = ns
		}
		for _, n := range ns {
			held = append(held, testkit.TryAcquire(t, m, n))
		}
	}
	var maxBefore fence.Token
	for _, l := range held {
		maxBefore = max(maxBefore, l.Token())
	}
	for _, p := range primaries {
		redistest.WaitReplicated(t, d, p)
	}
	newPrimary, took := d.Failover(t, target)
	switched := time.Now()
	time.Sleep(time.Second) // a few heartbeats on the new primary
	for _, l := range held {
		if err := l.Err(); err != nil {
			t.Fatalf("lease %s ended across the failover: %v", l.Name(), err)
		}
	}
	for _, name := range onTarget {
		if !log.SucceededSince(name, switched) {
			t.Errorf("%s: no successful renewal on the new primary", name)
		}
		owner, err := redistest.StoredOwner(ctx, d.Admin(newPrimary), b.KeysFor(name).Lease)
		if err != nil {
			t.Fatalf("GET on the new primary %s: %v", newPrimary.Addr, err)
		}
		var l *lease.Lease
		for _, h := range held {
			if h.Name() == name {
				l = h
			}
		}
		if owner != l.Owner() {
			t.Errorf("%s: the new primary names owner %q, want %q", name, owner, l.Owner())
		}
		if got, err := other.TryAcquire(ctx, name); !errors.Is(err, lease.ErrNotAcquired) {
			t.Errorf("another client's TryAcquire of %s after the failover = %v, %v; want ErrNotAcquired", name, got, err)
		}
	}
	failures, slowest := log.Failures()
	t.Logf("failover of %s to %s switched in %v; %d renewals failed meanwhile, the slowest took %v", target.Addr, newPrimary.Addr, took, failures, slowest)
	for _, l := range held {
		if err := l.Release(ctx); err != nil {
			t.Fatalf("Release of %s: %v", l.Name(), err)
		}
	}
	for _, l := range held {
		l2 := testkit.TryAcquire(t, other, l.Name())
		if l2.Token() <= maxBefore {
			t.Errorf("%s: token %d after the failover is not above %d, the greatest before it", l.Name(), l2.Token(), maxBefore)
		}
		if err := l2.Release(ctx); err != nil {
			t.Fatal(err)
		}
	}
	d.AwaitHealthy(t)
}

// flushAll is leasetest's data-loss hook on a deployment the test owns:
// FLUSHALL on every primary (the replicas follow), as an operator's mistake
// or a restart without persistence would lose the data.
func flushAll(d redistest.Deployment) func(*testing.T, lease.Backend) {
	return func(t *testing.T, _ lease.Backend) {
		t.Helper()
		for _, p := range d.Primaries(t) {
			if err := d.Admin(p).FlushAll(testkit.Context(t)).Err(); err != nil {
				t.Fatalf("FLUSHALL on %s: %v", p.Addr, err)
			}
		}
	}
}
