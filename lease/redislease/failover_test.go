package redislease_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	mrand "math/rand/v2"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/fencekit/fencekit/fence"
	"github.com/fencekit/fencekit/internal/redistest"
	"github.com/fencekit/fencekit/lease"
	"github.com/fencekit/fencekit/lease/redislease"
)

// The tests of Redis deployments of several servers (cluster_test.go,
// sentinel_test.go and the scenarios here, shared by both) make every
// Manager with multiNodeManager and read every token with tokenOf, so that
// a change of the lease API is made in these two places.

// multiNodeManager returns a Manager over b with the given TTL and options.
func multiNodeManager(t testing.TB, b lease.Backend, ttl time.Duration, opts ...lease.Option) *lease.Manager {
	t.Helper()
	m, err := lease.NewManager(b, ttl, opts...)
	if err != nil {
		t.Fatalf("lease.NewManager: %v", err)
	}
	return m
}

// tokenOf returns the fencing token of l.
func tokenOf(l *lease.Lease) fence.Token { return l.Token() }

// go-redis logs each failed dial and each Sentinel lookup through its
// package logger; a failover makes hundreds of such lines. The tests report
// what matters themselves.
func init() { redis.SetLogger(discardLogger{}) }

type discardLogger struct{}

func (discardLogger) Printf(context.Context, string, ...any) {}

// deployment is a Redis deployment of several servers that the scenarios
// below can break: a Redis Cluster or a primary watched by Sentinels.
type deployment interface {
	// client returns a new client of the deployment, closed when t ends.
	client(t *testing.T) redislease.Client
	// countedClient returns a new client whose round trips to each server
	// h counts.
	countedClient(t *testing.T, h *nodeCounter) redislease.Client
	// admin returns a client of the server s alone.
	admin(s *redistest.Server) *redis.Client
	// primaries returns the servers that take writes now.
	primaries(t *testing.T) []*redistest.Server
	// primaryFor returns the server that takes writes for key now.
	primaryFor(t *testing.T, key string) *redistest.Server
	// replicaOf returns the replica of primary.
	replicaOf(t *testing.T, primary *redistest.Server) *redistest.Server
	// failover runs a manual failover of primary and returns the new
	// primary and the time from the command to the switch.
	failover(t *testing.T, primary *redistest.Server) (*redistest.Server, time.Duration)
	// awaitPromoted waits until replica has replaced the killed primary
	// dead, and returns how long it waited.
	awaitPromoted(t *testing.T, dead, replica *redistest.Server) time.Duration
	// awaitHealthy waits until every primary has its replica in sync.
	awaitHealthy(t *testing.T)
}

// uniquePrefix returns a key prefix unique to this run and test, for a
// deployment the test owns (nothing to clean up: the servers go away).
func uniquePrefix(t *testing.T) string {
	var b [6]byte
	_, _ = rand.Read(b[:])
	return "fencekit-test:" + hex.EncodeToString(b[:]) + ":"
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

// nodeCounter counts round trips per server: each command and each
// pipeline sent to a server is one, except the handshake of a new
// connection and the cluster client's own discovery (CLUSTER SLOTS,
// COMMAND).
type nodeCounter struct {
	mu sync.Mutex
	n  map[string]*atomic.Int64
}

func newNodeCounter() *nodeCounter { return &nodeCounter{n: make(map[string]*atomic.Int64)} }

func (c *nodeCounter) counter(addr string) *atomic.Int64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.n[addr] == nil {
		c.n[addr] = new(atomic.Int64)
	}
	return c.n[addr]
}

// hook returns a go-redis hook that counts the round trips to addr.
func (c *nodeCounter) hook(addr string) redis.Hook { return countHook{c.counter(addr)} }

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

type countHook struct{ n *atomic.Int64 }

func notCounted(cmd redis.Cmder) bool {
	switch cmd.Name() {
	case "hello", "client", "cluster", "command", "readonly":
		return true
	}
	return false
}

func (h countHook) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h countHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if !notCounted(cmd) {
			h.n.Add(1)
		}
		return next(ctx, cmd)
	}
}
func (h countHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		if len(cmds) > 0 && !notCounted(cmds[0]) {
			h.n.Add(1)
		}
		return next(ctx, cmds)
	}
}

// testExclusiveUnderContention: workers over four clients (each with its
// own Manager; one of them never renews, so its leases expire during
// work) take one lease per primary in turns for 3 s (longer on a loaded
// machine, until each lease was granted 20 times), working up to 1.5 TTL
// each time; the overlap checker of the exclusivity tests finds no holder
// that believed it held a lease, or reported a deadline, after a later
// grant of it had been made, and no token granted twice.
func testExclusiveUnderContention(t *testing.T, d deployment) {
	const ttl = 100 * time.Millisecond
	prefix := uniquePrefix(t)
	var mgrs []*lease.Manager
	var probe *redislease.Backend
	for i := range 4 {
		b := newBackend(t, d.client(t), prefix)
		probe = b
		mgrs = append(mgrs, multiNodeManager(t, b, ttl, func(o *lease.Options) { o.DisableAutoRenew = i == 3 }))
	}
	var names []string
	for i, p := range d.primaries(t) {
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
					h := holding{token: tokenOf(l), acquiredAt: acquiredAt, manager: fmt.Sprintf("client %d", mi)}
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
}

func (f *flushLog) take() (map[time.Time][]string, int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	b, n := f.batches, f.failed
	f.batches, f.failed = nil, 0
	return b, n
}

// testRoundTrips: with the scripts cached on every server, an acquire, a
// renew and a release each cost one round trip to one server; and the
// heartbeats of leases spread over every primary go out as one pipeline
// per server per batch: over a few renew intervals, the round trips are
// exactly the sum, over the batches sent, of the servers that batch's
// leases live on, however many leases each batch holds.
func testRoundTrips(t *testing.T, d deployment) {
	counter := newNodeCounter()
	b := newBackend(t, d.countedClient(t, counter), uniquePrefix(t))
	ctx := ctxT(t)
	primaries := d.primaries(t)
	nodeOf := make(map[string]string)
	var names []string
	for i, p := range primaries {
		on := namesOn(t, d, b, p, fmt.Sprintf("rt-%d", i), 11)
		for _, n := range on {
			nodeOf[n] = p.Addr
		}
		names = append(names, on...)
	}
	manual := multiNodeManager(t, b, 10*time.Second, func(o *lease.Options) { o.DisableAutoRenew = true })
	// Warm up: every server caches the scripts (the first EVALSHA of a
	// script on a server is answered NOSCRIPT and sent again as EVAL).
	for i := range primaries {
		l := acquire(t, manual, names[i*11])
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
		l := acquire(t, manual, name)
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
	hb := multiNodeManager(t, b, 3*time.Second, func(o *lease.Options) {
		o.RenewInterval = 500 * time.Millisecond
		o.RenewBatchWindow = 100 * time.Millisecond
		o.Observer = log
	})
	var held []*lease.Lease
	for i := range primaries {
		for _, name := range names[i*11+1 : (i+1)*11] {
			held = append(held, acquire(t, hb, name))
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

// renewLogAll records every renewal's outcome with its send time.
type renewLogAll struct {
	lease.NopObserver
	mu     sync.Mutex
	events []lease.RenewedEvent
}

func (r *renewLogAll) Renewed(e lease.RenewedEvent) {
	r.mu.Lock()
	r.events = append(r.events, e)
	r.mu.Unlock()
}

// all returns every renewal recorded so far.
func (r *renewLogAll) all() []lease.RenewedEvent {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]lease.RenewedEvent(nil), r.events...)
}

// succeededSince reports whether a renewal of name sent after since
// succeeded.
func (r *renewLogAll) succeededSince(name string, since time.Time) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, e := range r.events {
		if e.Name == name && e.Err == nil && e.Sent.After(since) {
			return true
		}
	}
	return false
}

// failures returns the renewals that failed, and the longest latency of
// any renewal.
func (r *renewLogAll) failures() (n int, slowest time.Duration) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, e := range r.events {
		if e.Err != nil {
			n++
		}
		slowest = max(slowest, e.Latency)
	}
	return n, slowest
}

// waitReplicated waits until the replicas of primary have acknowledged
// every write it has taken (WAIT).
func waitReplicated(t *testing.T, d deployment, primary *redistest.Server) {
	t.Helper()
	n, err := d.admin(primary).Do(ctxT(t), "WAIT", 1, 5000).Int64()
	if err != nil || n < 1 {
		t.Fatalf("WAIT on %s: %d replicas acknowledged (%v)", primary.Addr, n, err)
	}
}

// testManualFailover: leases are held on every primary, renewed every
// 250 ms, while one primary is failed over by hand (CLUSTER FAILOVER, or
// SENTINEL FAILOVER). Their grants had reached the replica, so every lease
// survives: none is lost, the ones on the failed-over primary are renewed
// on the new one (which names their owners), another client still cannot
// take them, and every token granted after the failover is greater than
// every token granted before it.
func testManualFailover(t *testing.T, d deployment) {
	const ttl = 10 * time.Second
	prefix := uniquePrefix(t)
	log := &renewLogAll{}
	b := newBackend(t, d.client(t), prefix)
	m := multiNodeManager(t, b, ttl, func(o *lease.Options) { o.RenewInterval = 250 * time.Millisecond; o.Observer = log })
	other := multiNodeManager(t, newBackend(t, d.client(t), prefix), ttl)
	ctx := ctxT(t)
	primaries := d.primaries(t)
	target := primaries[0]
	var held []*lease.Lease
	var onTarget []string
	for i, p := range primaries {
		ns := namesOn(t, d, b, p, fmt.Sprintf("manual-%d", i), 3)
		if p == target {
			onTarget = ns
		}
		for _, n := range ns {
			held = append(held, acquire(t, m, n))
		}
	}
	var maxBefore fence.Token
	for _, l := range held {
		maxBefore = max(maxBefore, tokenOf(l))
	}
	for _, p := range primaries {
		waitReplicated(t, d, p)
	}
	newPrimary, took := d.failover(t, target)
	switched := time.Now()
	time.Sleep(time.Second) // a few heartbeats on the new primary
	for _, l := range held {
		if err := l.Err(); err != nil {
			t.Fatalf("lease %s ended across the failover: %v", l.Name(), err)
		}
	}
	for _, name := range onTarget {
		if !log.succeededSince(name, switched) {
			t.Errorf("%s: no successful renewal on the new primary", name)
		}
		owner, err := storedOwner(ctx, d.admin(newPrimary), b.KeysFor(name).Lease)
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
	failures, slowest := log.failures()
	t.Logf("failover of %s to %s switched in %v; %d renewals failed meanwhile, the slowest took %v", target.Addr, newPrimary.Addr, took, failures, slowest)
	for _, l := range held {
		if err := l.Release(ctx); err != nil {
			t.Fatalf("Release of %s: %v", l.Name(), err)
		}
	}
	for _, l := range held {
		l2 := acquire(t, other, l.Name())
		if tokenOf(l2) <= maxBefore {
			t.Errorf("%s: token %d after the failover is not above %d, the greatest before it", l.Name(), tokenOf(l2), maxBefore)
		}
		if err := l2.Release(ctx); err != nil {
			t.Fatal(err)
		}
	}
	d.awaitHealthy(t)
}

// acquireAfterFailover acquires name, which no one holds, through m, whose
// client may still have to find the new primary (each client learns of it
// on its own, after a request to the dead one fails).
func acquireAfterFailover(t *testing.T, m *lease.Manager, name string) *lease.Lease {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	l, err := m.Acquire(ctx, name)
	if err != nil {
		t.Fatalf("Acquire(%q) after the failover: %v", name, err)
	}
	return l
}

// killRun is what one SIGKILL of a primary measured.
type killRun struct {
	promoted time.Duration // from the kill to the replica serving, as the servers say
	takeover time.Duration // from the kill to another client's grant of a lost lease
	stale    int           // stale writes rejected by the guards
	wake     time.Duration // from a release after the failover to a sharded waiter's grant
}

// testPrimaryKilled kills a primary (SIGKILL) runs times, each time after
// cutting its replica off (the replica is paused, the primary drops its
// link, and grants are made that the replica never receives), and checks
// what a failover to a replica that lagged does to leases:
//
//   - a lease granted before the cut (so replicated) survives: its heartbeat
//     renews it on the new primary;
//   - a lease granted after the cut is gone from the new primary: its holder
//     learns that at its next renewal (LostTakenOver), its context is
//     cancelled, and its renewals never create the grant again;
//   - tokens granted after the failover are greater than every token
//     granted before it for the same name, including the grants the
//     replica never received (the new primary's counter is behind them);
//     the token floor, the server clock in microseconds, makes up for it;
//   - where two holders overlap (the lost grant's holder still believes it
//     holds the lease while another client is granted it), the older
//     holder's writes through sqlguard (a row and a fenced transaction on
//     PostgreSQL) and blobguard (an S3 object) are rejected as stale, and
//     the newer holder's writes stay;
//   - the takeover time: from the kill until another client is granted
//     the lost lease.
func testPrimaryKilled(t *testing.T, d deployment, runs int) {
	stores := newFencedStores(t)
	var results []killRun
	for run := range runs {
		primaries := d.primaries(t)
		target := primaries[run%len(primaries)]
		t.Run(fmt.Sprintf("run%d", run), func(t *testing.T) {
			results = append(results, killOnce(t, d, stores, target))
		})
		if t.Failed() {
			return
		}
	}
	var promoted, takeover, wake []time.Duration
	stale := 0
	for _, r := range results {
		promoted = append(promoted, r.promoted)
		takeover = append(takeover, r.takeover)
		wake = append(wake, r.wake)
		stale += r.stale
	}
	t.Logf("SIGKILL of a primary, %d runs: the servers agree on the promoted replica after %v; the lost lease granted to a waiting client after %v; a sharded waiter woken %v after a release on the new primary; %d stale writes rejected by the guards",
		len(results), span(promoted), span(takeover), span(wake), stale)
}

// span formats the range of ds as "min–max".
func span(ds []time.Duration) string {
	if len(ds) == 0 {
		return "-"
	}
	lo, hi := slices.Min(ds), slices.Max(ds)
	return fmt.Sprintf("%v–%v", lo.Round(time.Millisecond), hi.Round(time.Millisecond))
}

func killOnce(t *testing.T, d deployment, stores *fencedStores, target *redistest.Server) killRun {
	const ttl = 15 * time.Second
	ctx := ctxT(t)
	prefix := uniquePrefix(t)
	renews := &renewLogAll{}
	auto := func(o *lease.Options) { o.RenewInterval = 500 * time.Millisecond; o.Observer = renews }
	probe := newBackend(t, d.client(t), prefix)
	names := namesOn(t, d, probe, target, "killed", 5)
	replicated, lostAuto, lostManual, churned, watched := names[0], names[1], names[2], names[3], names[4]
	replica := d.replicaOf(t, target)

	mA := multiNodeManager(t, newBackend(t, d.client(t), prefix), ttl, auto)
	mB := multiNodeManager(t, newBackend(t, d.client(t), prefix), ttl, auto)
	mD := multiNodeManager(t, newBackend(t, d.client(t), prefix), ttl, func(o *lease.Options) { o.DisableAutoRenew = true })
	mE := multiNodeManager(t, newBackend(t, d.client(t), prefix), ttl, func(o *lease.Options) { o.DisableAutoRenew = true })
	cBackend := newBackend(t, d.client(t), prefix)
	mC := multiNodeManager(t, cBackend, ttl, func(o *lease.Options) { o.DisableAutoRenew = true })
	// A holder and a waiter that use sharded pub/sub (SPUBLISH, SSUBSCRIBE).
	mH := multiNodeManager(t, newShardedBackend(t, d.client(t), prefix), ttl, auto)
	mW := multiNodeManager(t, newShardedBackend(t, d.client(t), prefix), ttl, func(o *lease.Options) { o.PollInterval = 20 * time.Second })

	// Every client finds its way around the cluster before the replica is
	// paused (a fresh cluster client that asked the paused replica for the
	// slot map would wait for its read timeout).
	for i, m := range []*lease.Manager{mA, mB, mC, mD, mE, mH, mW} {
		l := acquire(t, m, fmt.Sprintf("warm-%d", i))
		if err := l.Release(ctx); err != nil {
			t.Fatal(err)
		}
	}
	before := make(map[string][]fence.Token) // every token granted before the kill, by name
	grant := func(m *lease.Manager, name string) *lease.Lease {
		l := acquire(t, m, name)
		before[name] = append(before[name], tokenOf(l))
		return l
	}
	a := grant(mA, replicated)
	hl := grant(mH, watched)
	wGot := make(chan *lease.Lease, 1)
	go func() {
		l, err := mW.Acquire(ctx, watched)
		if err != nil {
			t.Errorf("the waiter for %s: %v", watched, err)
		}
		wGot <- l
	}()
	time.Sleep(100 * time.Millisecond) // the waiter is refused and subscribes
	waitReplicated(t, d, target)

	// Cut the replica off: paused, it cannot reconnect; the primary drops
	// the link, so nothing written from now on reaches the replica.
	replica.Pause(t)
	paused := true
	defer func() {
		if paused {
			replica.Resume(t)
		}
	}()
	if err := d.admin(target).Do(ctx, "CLIENT", "KILL", "TYPE", "replica").Err(); err != nil {
		t.Fatalf("CLIENT KILL TYPE replica on %s: %v", target.Addr, err)
	}
	if info, err := d.admin(target).Info(ctx, "replication").Result(); err != nil || !strings.Contains(info, "connected_slaves:0") {
		t.Fatalf("the primary still lists its replica after CLIENT KILL (%v): %s", err, info)
	}
	bl := grant(mB, lostAuto)
	dl := grant(mD, lostManual)
	for range 5 {
		l := grant(mE, churned)
		if err := l.Release(ctx); err != nil {
			t.Fatal(err)
		}
	}
	// The holder of the lost grant writes while its grant is good.
	res := fmt.Sprintf("job-%s-%d", strings.ReplaceAll(target.Addr, ":", "-"), time.Now().UnixNano())
	for i, err := range stores.write(ctx, res, "D", tokenOf(dl)) {
		if err != nil {
			t.Fatalf("D's %s write with its valid token %d: %v", fencedWrites[i], tokenOf(dl), err)
		}
	}

	killed := target.Kill(t)
	replica.Resume(t)
	paused = false

	// Another client waits for the lost lease from the moment of the kill.
	type granted struct {
		l   *lease.Lease
		at  time.Time
		err error
	}
	cGot := make(chan granted, 1)
	go func() {
		l, err := mC.Acquire(ctx, lostManual)
		cGot <- granted{l, time.Now(), err}
	}()
	promoted := d.awaitPromoted(t, target, replica)
	newPrimary := replica
	c := <-cGot
	if c.err != nil {
		t.Fatalf("the other client never got the lost lease: %v", c.err)
	}
	run := killRun{promoted: promoted, takeover: c.at.Sub(killed)}
	t.Logf("killed %s: %s serving after %v; the lost lease granted to another client %v after the kill",
		target.Addr, newPrimary.Addr, promoted.Round(time.Millisecond), run.takeover.Round(time.Millisecond))

	// The lost grants are really gone: the test exercised a lagging replica.
	adm := d.admin(newPrimary)
	for _, name := range []string{lostAuto, churned} {
		if n, err := adm.Exists(ctx, probe.KeysFor(name).Lease).Result(); err != nil || n != 0 {
			t.Fatalf("%s: the new primary has the grant made after the cut (exists=%d, %v): the replica was not cut off", name, n, err)
		}
	}
	lastChurned := slices.Max(before[churned])
	counter, err := adm.Get(ctx, probe.KeysFor(churned).Token).Uint64()
	if err != nil && !errors.Is(err, redis.Nil) {
		t.Fatal(err)
	}
	if fence.Token(counter) >= lastChurned {
		t.Fatalf("%s: the new primary's counter %d is not behind the last token %d: the replica was not cut off", churned, counter, lastChurned)
	}

	// Tokens after the failover are above every token before it, per name.
	cl := c.l
	after := map[string]fence.Token{lostManual: tokenOf(cl)}
	le := acquireAfterFailover(t, mE, churned)
	after[churned] = tokenOf(le)
	for name, tok := range after {
		if last := slices.Max(before[name]); tok <= last {
			t.Errorf("%s: token %d granted after the failover is not above %d, granted before it", name, tok, last)
		}
	}
	t.Logf("%s: the new primary's counter was %d, behind the lost grants' last token %d; the next grant got %d (the server clock)", churned, counter, lastChurned, after[churned])
	if err := le.Release(ctx); err != nil {
		t.Fatal(err)
	}

	// Two holders overlap: D still believes it holds its lease while C has
	// it. C writes; then D's writes are rejected as stale, C's stay.
	for i, err := range stores.write(ctx, res, "C", tokenOf(cl)) {
		if err != nil {
			t.Fatalf("C's %s write with token %d: %v", fencedWrites[i], tokenOf(cl), err)
		}
	}
	if err := dl.Err(); err != nil {
		t.Fatalf("D's lease ended before its stale writes (%v): no overlap to show", err)
	}
	for i, err := range stores.write(ctx, res, "D", tokenOf(dl)) {
		var se *fence.StaleError
		if !errors.Is(err, fence.ErrStaleToken) || !errors.As(err, &se) {
			t.Errorf("D's %s write with its lost token %d while C holds token %d = %v; want a stale-token error", fencedWrites[i], tokenOf(dl), tokenOf(cl), err)
			continue
		}
		run.stale++
	}
	for i, w := range stores.writer(t, ctx, res) {
		if want := fmt.Sprintf("C@%d", tokenOf(cl)); w != want {
			t.Errorf("%s holds %s, want %s", fencedWrites[i], w, want)
		}
	}
	t.Logf("overlap: D (token %d) and C (token %d) both held %s; %d of D's %d writes rejected as stale", tokenOf(dl), tokenOf(cl), lostManual, run.stale, len(fencedWrites))

	// D learns of the loss at its first renewal that reaches the new
	// primary (its client may first have to find it: those attempts fail
	// with the store's error and leave the lease valid until its
	// deadline), and does not re-create the grant.
	var lost *lease.LostError
	for attempt := 1; ; attempt++ {
		err = dl.Renew(ctx)
		if errors.As(err, &lost) {
			if lost.Reason != lease.LostTakenOver {
				t.Errorf("D's Renew after the failover = %v, want a LostError (taken over)", err)
			}
			break
		}
		if err == nil || dl.Err() != nil || attempt == 100 {
			t.Fatalf("D's Renew after the failover, attempt %d = %v (lease: %v); want a LostError (taken over)", attempt, err, dl.Err())
		}
		time.Sleep(50 * time.Millisecond)
	}
	select {
	case <-dl.Done():
	default:
		t.Error("D's lease context not cancelled after its renewal found the loss")
	}
	if owner, _ := storedOwner(ctx, adm, probe.KeysFor(lostManual).Lease); owner != cl.Owner() {
		t.Errorf("after D's renewal the lease names %q, want C's owner %q", owner, cl.Owner())
	}

	// B's heartbeat finds the loss by itself, and nothing re-creates it.
	select {
	case <-bl.Done():
	case <-time.After(ttl):
		t.Fatalf("B's lease was not lost within %v of the failover", ttl)
	}
	if !errors.As(bl.Err(), &lost) || lost.Reason != lease.LostTakenOver {
		t.Errorf("B's lease ended with %v, want a LostError (taken over: its renewal found no grant)", bl.Err())
	}
	time.Sleep(time.Second) // two more heartbeat intervals: none may run
	if n, err := adm.Exists(ctx, probe.KeysFor(lostAuto).Lease).Result(); err != nil || n != 0 {
		t.Errorf("B's lost grant was re-created on the new primary (exists=%d, %v)", n, err)
	}
	lb := acquireAfterFailover(t, mC, lostAuto)
	if last := slices.Max(before[lostAuto]); tokenOf(lb) <= last {
		t.Errorf("%s: token %d after the failover is not above the lost token %d", lostAuto, tokenOf(lb), last)
	}

	// A's grant had reached the replica: A still holds its lease, renewed
	// on the new primary. If the new primary no longer has it (once in
	// many CI runs, after a promotion that took about 5 s, both replicated
	// grants were missing: Redis's failover, not this backend, lost them),
	// the holder must have learnt it safely; a lease lost while the new
	// primary still names its holder is this backend's fault.
	survived := func(who string, l *lease.Lease) bool {
		err := l.Err()
		if err == nil {
			return true
		}
		owner, gerr := storedOwner(ctx, adm, probe.KeysFor(l.Name()).Lease)
		if owner == l.Owner() {
			t.Errorf("%s's replicated lease ended across the failover, though the new primary still names it: %v", who, err)
			return false
		}
		info, _ := adm.Info(ctx, "replication").Result()
		t.Logf("%s's replicated grant of %s is not on the new primary %s (it names %q, %v): the failover lost it; %s learnt it: %v\n%s",
			who, l.Name(), newPrimary.Addr, owner, gerr, who, err, info)
		var lost *lease.LostError
		if !errors.As(err, &lost) {
			t.Errorf("%s's lease ended with %v, want a LostError", who, err)
		}
		if rerr := l.Release(ctx); !errors.Is(rerr, lease.ErrLost) {
			t.Errorf("Release of %s's lost lease = %v, want ErrLost", who, rerr)
		}
		return false
	}
	aHeld := survived("A", a)
	if aHeld && !renews.succeededSince(replicated, killed.Add(promoted)) {
		t.Errorf("A's lease was not renewed on the new primary")
	}

	// The waiter's subscription died with the primary; its hub subscribed
	// again on the new one, so the release wakes it at once (the poll
	// interval is 20 s).
	hHeld := survived("H", hl)
	released := time.Now()
	if !hHeld {
		// H's grant is gone: the waiter may take the lease when it next
		// tries (after its resubscription or its poll).
	} else if err := hl.Release(ctx); err != nil {
		t.Errorf("Release of %s after the failover: %v", watched, err)
	}
	select {
	case wl := <-wGot:
		if wl != nil && !hHeld {
			_ = wl.Release(ctx)
		} else if wl != nil {
			run.wake = time.Since(released)
			t.Logf("the waiter on %s (sharded pub/sub) was woken %v after the release on the new primary", watched, run.wake.Round(10*time.Microsecond))
			if err := wl.Release(ctx); err != nil {
				t.Errorf("Release: %v", err)
			}
		}
	case <-time.After(5 * time.Second):
		if hHeld {
			t.Errorf("the waiter on %s was not woken within 5 s of the release after the failover (poll interval 20 s)", watched)
		}
		<-wGot
	}

	kept := []*lease.Lease{cl, lb}
	if aHeld {
		kept = append(kept, a)
	}
	for _, l := range kept {
		if err := l.Release(ctx); err != nil {
			t.Errorf("Release of %s: %v", l.Name(), err)
		}
	}
	_ = dl.Release(ctx)
	_ = bl.Release(ctx)

	target.Relaunch(t) // it rejoins as a replica of the new primary
	d.awaitHealthy(t)
	return run
}

// flushAll is leasetest's data-loss hook on a deployment the test owns:
// FLUSHALL on every primary (the replicas follow), as an operator's mistake
// or a restart without persistence would lose the data.
func flushAll(d deployment) func(*testing.T, lease.Backend) {
	return func(t *testing.T, _ lease.Backend) {
		t.Helper()
		for _, p := range d.primaries(t) {
			if err := d.admin(p).FlushAll(ctxT(t)).Err(); err != nil {
				t.Fatalf("FLUSHALL on %s: %v", p.Addr, err)
			}
		}
	}
}

// storedOwner reads the owner of the grant a lease key holds
// ("<token>:<owner>").
func storedOwner(ctx context.Context, c *redis.Client, key string) (string, error) {
	v, err := c.Get(ctx, key).Result()
	if err != nil {
		return "", err
	}
	_, owner, _ := strings.Cut(v, ":")
	return owner, nil
}
