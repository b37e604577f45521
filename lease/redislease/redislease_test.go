package redislease_test

import (
	"context"
	"errors"
	"net"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"go.uber.org/goleak"

	"github.com/fencekit/fencekit/fence"
	"github.com/fencekit/fencekit/internal/testkit"
	"github.com/fencekit/fencekit/lease"
	"github.com/fencekit/fencekit/lease/driver"
	"github.com/fencekit/fencekit/lease/leasetest"
	"github.com/fencekit/fencekit/lease/redislease"
	"github.com/fencekit/fencekit/lease/redislease/redistest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func newBackend(t testing.TB, c redislease.Client, prefix string) *redislease.Backend {
	t.Helper()
	return testkit.Closed(redislease.New(c, redislease.WithPrefix(prefix)))(t)
}

func newManager(t testing.TB, b lease.Backend, opts lease.Options) *lease.Manager {
	t.Helper()
	m, err := lease.NewManager(b, opts.TTL, func(o *lease.Options) { *o = opts })
	if err != nil {
		t.Fatalf("lease.NewManager: %v", err)
	}
	return m
}

// The shared Redis, each connection its own client.
func TestConformance(t *testing.T) {
	leasetest.Run(t, leasetest.Config{
		NewStore: func(t *testing.T) func() lease.Backend {
			prefix := redistest.Prefix(t)
			return func() lease.Backend { return newBackend(t, redistest.Shared(t), prefix) }
		},
		LoseData: loseKeys,
		Lacks:    redisLacks,
	})
}

// redisLacks: what Redis cannot do (a Redis lease lives in keys with a TTL,
// not in a session: docs/design.md, "The backend contract").
var redisLacks = map[leasetest.Capability]string{
	leasetest.PushLoss: "Redis grants are keys with a TTL, not sessions: nothing at the store ends them but expiry, release or data loss, which a renew finds",
}

// loseKeys deletes every key of the backend's namespace, lease hashes and
// token counters alike, as FLUSHALL or eviction would on the shared server.
// (TestTokensSurviveRestart restarts a server of its own for real.)
func loseKeys(t *testing.T, b lease.Backend) {
	t.Helper()
	rb := b.(*redislease.Backend)
	c := rb.ClientForTest()
	ctx := testkit.Context(t)
	var keys []string
	iter := c.(redis.UniversalClient).Scan(ctx, 0, rb.PrefixForTest()+"*", 1000).Iterator()
	for iter.Next(ctx) {
		keys = append(keys, iter.Val())
	}
	if err := iter.Err(); err != nil {
		t.Fatalf("SCAN: %v", err)
	}
	for _, k := range keys {
		if err := c.(redis.UniversalClient).Del(ctx, k).Err(); err != nil {
			t.Fatalf("DEL %s: %v", k, err)
		}
	}
	if len(keys) == 0 {
		t.Fatal("loseKeys: no keys under the prefix; nothing was lost")
	}
}

// A real single-node Redis Cluster: every script's keys must share a hash
// slot, or Redis answers CROSSSLOT.
func TestConformanceCluster(t *testing.T) {
	srv := redistest.Start(t, "--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf")
	admin := srv.Client()
	ctx := testkit.Context(t)
	if err := admin.Do(ctx, "CLUSTER", "ADDSLOTSRANGE", "0", "16383").Err(); err != nil {
		t.Fatalf("CLUSTER ADDSLOTSRANGE: %v", err)
	}
	for i := 0; ; i++ {
		info, err := admin.ClusterInfo(ctx).Result()
		if err == nil && containsLine(info, "cluster_state:ok") {
			break
		}
		if i > 100 {
			t.Fatalf("cluster never became ok: %v %s", err, info)
		}
		time.Sleep(50 * time.Millisecond)
	}
	leasetest.Run(t, leasetest.Config{
		NewStore: func(t *testing.T) func() lease.Backend {
			prefix := redistest.Prefix(t)
			return func() lease.Backend {
				c := redis.NewClusterClient(&redis.ClusterOptions{Addrs: []string{srv.Addr}, ContextTimeoutEnabled: true})
				t.Cleanup(func() { _ = c.Close() })
				return newBackend(t, c, prefix)
			}
		},
		LoseData: func(t *testing.T, _ lease.Backend) {
			if err := admin.FlushAll(testkit.Context(t)).Err(); err != nil {
				t.Fatalf("FLUSHALL: %v", err)
			}
		},
		Lacks: redisLacks,
	})
}

func containsLine(s, line string) bool {
	for len(s) > 0 {
		i := 0
		for i < len(s) && s[i] != '\n' {
			i++
		}
		if l := s[:i]; l == line || l == line+"\r" {
			return true
		}
		if i == len(s) {
			break
		}
		s = s[i+1:]
	}
	return false
}

func TestNewRejectsBadOptions(t *testing.T) {
	if _, err := redislease.New(nil); !errors.Is(err, redislease.ErrInvalidOptions) {
		t.Fatalf("New(nil) = %v, want ErrInvalidOptions", err)
	}
	c := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1"})
	defer c.Close()
	_, err := redislease.New(c, func(o *redislease.Options) { o.Prefix = "a{b}:" })
	if !errors.Is(err, redislease.ErrInvalidOptions) {
		t.Fatalf("New with a braced prefix = %v, want ErrInvalidOptions", err)
	}
}

func TestKeysShareHashTag(t *testing.T) {
	c := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1"})
	defer c.Close()
	b := newBackend(t, c, "p:")
	for name, want := range map[string]string{
		"jobs":   "p:{jobs}:",
		"a{b}c":  "p:{a%7Bb%7Dc}:",
		"}":      "p:{%7D}:",
		"50%":    "p:{50%25}:",
		"a%7Bb":  "p:{a%257Bb}:",
		"ünï":    "p:{ünï}:",
		"x:y{z}": "p:{x:y%7Bz%7D}:",
	} {
		k := b.KeysFor(name)
		if k.Lease != want+"lease" || k.Token != want+"token" || k.Channel != want+"released" {
			t.Errorf("KeysFor(%q) = %+v, want the base %q", name, k, want)
		}
	}
}

// Tokens keep growing when the counter is lost: FLUSHALL, a restart without
// persistence, the counter deleted alone, and the counter set back (a
// failover to a replica that lagged).
func TestTokensSurviveCounterLoss(t *testing.T) {
	srv := redistest.Start(t)
	c := srv.Client()
	b := newBackend(t, c, "fencekit:")
	m := newManager(t, b, lease.Options{TTL: 10 * time.Second})
	const name = "counter-loss"
	keys := b.KeysFor(name)

	steps := []struct {
		what string
		lose func()
	}{
		{"FLUSHALL", func() {
			if err := c.FlushAll(testkit.Context(t)).Err(); err != nil {
				t.Fatalf("FLUSHALL: %v", err)
			}
		}},
		{"DEL counter", func() {
			if err := c.Del(testkit.Context(t), keys.Token).Err(); err != nil {
				t.Fatalf("DEL: %v", err)
			}
		}},
		{"counter set back to 1", func() {
			if err := c.Set(testkit.Context(t), keys.Token, 1, 0).Err(); err != nil {
				t.Fatalf("SET: %v", err)
			}
		}},
		{"restart without persistence", func() {
			srv.Restart()
			if n, err := c.Exists(testkit.Context(t), keys.Token).Result(); err != nil || n != 0 {
				t.Fatalf("after restart the counter exists=%d (%v); the test needs an empty server", n, err)
			}
		}},
	}
	last := fence.None
	for _, step := range steps {
		l := testkit.TryAcquire(t, m, name)
		if l.Token() <= last {
			t.Fatalf("before %s: token %d <= previous %d", step.what, l.Token(), last)
		}
		last = l.Token()
		if err := l.Release(testkit.Context(t)); err != nil && step.what != "restart without persistence" {
			t.Fatalf("Release: %v", err)
		}
		step.lose()
		l2 := testkit.TryAcquire(t, m, name)
		if l2.Token() <= last {
			t.Fatalf("after %s: token %d is not greater than the last token %d", step.what, l2.Token(), last)
		}
		t.Logf("%s: token %d -> %d", step.what, last, l2.Token())
		last = l2.Token()
		if err := l2.Release(testkit.Context(t)); err != nil {
			t.Fatalf("Release: %v", err)
		}
	}
}

// Loss is noticed before expiry: with the holder's Redis paused (CLIENT
// PAUSE on a server of this test's own), the lease's local deadline is the
// last successful renewal's send time + TTL - safety margin and its context
// is cancelled then (within a late timer's slack); another
// holder gets the lease afterwards, with a greater token.
func TestLossNoticedBeforeExpiry(t *testing.T) {
	srv := redistest.Start(t)
	const ttl = time.Second
	log := &testkit.RenewEvents{}
	last := func() time.Time { sent, _ := log.LastSucceeded(); return sent }
	holderM := newManager(t, newBackend(t, srv.Client(), "fencekit:"), lease.Options{TTL: ttl, Observer: log})
	otherM := newManager(t, newBackend(t, srv.Client(), "fencekit:"), lease.Options{TTL: ttl})
	const name = "paused"
	l := testkit.TryAcquire(t, holderM, name)
	granted := time.Now()
	// The pause must come after a renewal, so that the deadline checked
	// below is one that a renewal moved. Wait for the first (due about a
	// third of the TTL after the grant) rather than for a fixed time, which
	// a loaded machine's late heartbeat could outlast.
	for start := time.Now(); last().IsZero(); time.Sleep(5 * time.Millisecond) {
		if time.Since(start) > 5*time.Second {
			t.Fatal("no successful renewal within 5s of the grant")
		}
	}

	pauser := srv.Client()
	pausedAt := time.Now()
	if err := pauser.Do(testkit.Context(t), "CLIENT", "PAUSE", "3000", "ALL").Err(); err != nil {
		t.Fatalf("CLIENT PAUSE: %v", err)
	}
	select {
	case <-l.Done():
	case <-time.After(10 * time.Second):
		t.Fatal("lease not lost while Redis was paused")
	}
	lostAt := time.Now()
	lastSent := last()
	t.Logf("granted, paused after %v; last renewal sent %v before the pause; lost %v after it",
		pausedAt.Sub(granted), pausedAt.Sub(lastSent), lostAt.Sub(lastSent))
	if !leasetest.CheckLostByDeadline(t, l, lastSent, lostAt, holderM.Options().SafetyMargin, leasetest.LateTimerSlack) {
		t.FailNow()
	}
	var le *lease.LostError
	if !errors.As(l.Err(), &le) || le.Reason != lease.LostExpired {
		t.Fatalf("Err = %v, want an expired LostError", l.Err())
	}

	l2, err := otherM.Acquire(testkit.Context(t), name)
	if err != nil {
		t.Fatalf("the other holder's Acquire: %v", err)
	}
	if l2.Token() <= l.Token() {
		t.Fatalf("new token %d <= lost token %d", l2.Token(), l.Token())
	}
	if err := l.Release(testkit.Context(t)); !errors.Is(err, lease.ErrLost) {
		t.Fatalf("Release of the lost lease = %v, want ErrLost", err)
	}
	if err := l2.Release(testkit.Context(t)); err != nil {
		t.Fatalf("Release: %v", err)
	}
}

// A renew that finds another owner cancels the lease at once, both when
// called by hand and from the heartbeat.
func TestRenewFindsAnotherOwner(t *testing.T) {
	c := redistest.Shared(t)
	b := newBackend(t, c, redistest.Prefix(t))
	m := newManager(t, b, lease.Options{TTL: 30 * time.Second, DisableAutoRenew: true})
	l := testkit.TryAcquire(t, m, "taken")
	if err := c.Set(testkit.Context(t), b.KeysFor("taken").Lease, l.Token().String()+":intruder", redis.KeepTTL).Err(); err != nil {
		t.Fatal(err)
	}
	// The lease ends at once, and its Release must not delete the
	// intruder's lease.
	testkit.RenewFindsTakenOver(t, testkit.Context(t), l)
	if v, _ := c.Get(testkit.Context(t), b.KeysFor("taken").Lease).Result(); v != l.Token().String()+":intruder" {
		t.Fatalf("lease after Release = %q, want the intruder's lease untouched", v)
	}

	// The heartbeat notices within one renew interval.
	const ttl = 3 * time.Second
	m2 := newManager(t, b, lease.Options{TTL: ttl, RenewInterval: 200 * time.Millisecond})
	l2 := testkit.TryAcquire(t, m2, "taken-hb")
	if err := c.Set(testkit.Context(t), b.KeysFor("taken-hb").Lease, l2.Token().String()+":intruder", redis.KeepTTL).Err(); err != nil {
		t.Fatal(err)
	}
	hijacked := time.Now()
	select {
	case <-l2.Done():
	case <-time.After(ttl):
		t.Fatal("heartbeat did not notice the takeover")
	}
	if d := time.Since(hijacked); d > ttl/2 {
		t.Fatalf("heartbeat noticed the takeover after %v, want about one renew interval", d)
	}
	var le *lease.LostError
	if !errors.As(l2.Err(), &le) || le.Reason != lease.LostTakenOver {
		t.Fatalf("Err = %v, want taken over", l2.Err())
	}
	_ = l2.Release(testkit.Context(t))
}

// Round trips: one per acquire, renew and release once the scripts are
// cached by the server.
func TestRoundTrips(t *testing.T) {
	c := redistest.Shared(t)
	hook := &redistest.RoundTrips{}
	c.AddHook(hook)
	b := newBackend(t, c, redistest.Prefix(t))
	m := newManager(t, b, lease.Options{TTL: 10 * time.Second, DisableAutoRenew: true})
	warm := testkit.TryAcquire(t, m, "warm")
	_ = warm.Renew(testkit.Context(t))
	_ = warm.Release(testkit.Context(t))

	before := hook.Load()
	l := testkit.TryAcquire(t, m, "rt")
	if n := hook.Load() - before; n != 1 {
		t.Fatalf("TryAcquire took %d round trips, want 1", n)
	}
	before = hook.Load()
	if err := l.Renew(testkit.Context(t)); err != nil {
		t.Fatal(err)
	}
	if n := hook.Load() - before; n != 1 {
		t.Fatalf("Renew took %d round trips, want 1", n)
	}
	before = hook.Load()
	if err := l.Release(testkit.Context(t)); err != nil {
		t.Fatal(err)
	}
	if n := hook.Load() - before; n != 1 {
		t.Fatalf("Release took %d round trips, want 1", n)
	}
}

// A waiter's Watch survives many waiters coming and going on one pub/sub
// connection, and Close ends it.
func TestWatchManyWaitersAndClose(t *testing.T) {
	b := newBackend(t, redistest.Shared(t), redistest.Prefix(t))
	m := newManager(t, b, lease.Options{TTL: 30 * time.Second, PollInterval: 10 * time.Second})
	const name = "many"
	const waiters = 10
	holder := testkit.TryAcquire(t, m, name)
	var wg sync.WaitGroup
	got := make(chan *lease.Lease, waiters)
	for range waiters {
		wg.Add(1)
		go func() {
			defer wg.Done()
			l, err := m.Acquire(testkit.Context(t), name)
			if err != nil {
				t.Errorf("Acquire: %v", err)
				return
			}
			got <- l
		}()
	}
	time.Sleep(300 * time.Millisecond)
	start := time.Now()
	if err := holder.Release(testkit.Context(t)); err != nil {
		t.Fatal(err)
	}
	for range waiters {
		select {
		case l := <-got:
			if err := l.Release(testkit.Context(t)); err != nil {
				t.Fatalf("Release: %v", err)
			}
		case <-time.After(5 * time.Second):
			t.Fatalf("hand-off chain stalled after %v", time.Since(start))
		}
	}
	wg.Wait()
	t.Logf("%d hand-offs in %v", waiters, time.Since(start))
	if err := b.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	if _, _, err := b.Watch(testkit.Context(t), name); !errors.Is(err, redislease.ErrClosed) {
		t.Fatalf("Watch after Close = %v, want ErrClosed", err)
	}
}

// An unreachable Redis gives a clear error, not a lease.
func TestUnreachableRedis(t *testing.T) {
	l, _ := net.Listen("tcp", "127.0.0.1:0")
	addr := l.Addr().String()
	l.Close()
	c := redis.NewClient(&redis.Options{Addr: addr, MaxRetries: -1, ContextTimeoutEnabled: true})
	t.Cleanup(func() { _ = c.Close() })
	m := newManager(t, newBackend(t, c, "fencekit:"), lease.Options{TTL: time.Second})
	got, err := m.TryAcquire(testkit.Context(t), "x")
	if err == nil || got != nil || errors.Is(err, lease.ErrNotAcquired) {
		t.Fatalf("TryAcquire on a closed port = %v, %v; want a connection error", got, err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	if _, err := m.Acquire(ctx, "x"); !errors.Is(err, lease.ErrNotAcquired) || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Acquire on a closed port = %v, want ErrNotAcquired joined with DeadlineExceeded", err)
	}
}

// Heartbeats of many leases go out in few pipelines, and a batch survives
// the server losing its script cache.
func TestHeartbeatsAreBatched(t *testing.T) {
	srv := redistest.Start(t)
	c := srv.Client()
	hook := &redistest.RoundTrips{}
	c.AddHook(hook)
	b := newBackend(t, c, "fencekit:")
	const leases = 200
	m := newManager(t, b, lease.Options{TTL: 3 * time.Second, RenewInterval: time.Second, RenewBatchWindow: 50 * time.Millisecond})
	obs := make([]*lease.Lease, 0, leases)
	for i := range leases {
		obs = append(obs, testkit.TryAcquire(t, m, "batch-"+strconv.Itoa(i)))
	}
	if err := c.ScriptFlush(testkit.Context(t)).Err(); err != nil {
		t.Fatal(err)
	}
	before := hook.Load()
	time.Sleep(2500 * time.Millisecond) // two heartbeats each
	trips := hook.Load() - before
	for _, l := range obs {
		if err := l.Err(); err != nil {
			t.Fatalf("lease ended while renewed in batches: %v", err)
		}
	}
	t.Logf("%d leases, 2 heartbeats each: %d round trips", leases, trips)
	if trips > leases/2 {
		t.Fatalf("%d round trips for %d renewals: heartbeats were not batched", trips, 2*leases)
	}
	for _, l := range obs {
		if err := l.Release(testkit.Context(t)); err != nil {
			t.Fatal(err)
		}
	}
}

// A batch after the server lost its script cache costs one more round trip
// (the pipeline again, with the script's body), then one again.
func TestRenewBatchAfterScriptFlush(t *testing.T) {
	srv := redistest.Start(t)
	c := srv.Client()
	hook := &redistest.RoundTrips{}
	c.AddHook(hook)
	b := newBackend(t, c, "fencekit:")
	var recs []driver.Grant
	for i := range 5 {
		g, err := b.Acquire(testkit.Context(t), driver.Request{Name: "flush-" + strconv.Itoa(i), Owner: "o", TTL: 10 * time.Second})
		if err != nil {
			t.Fatal(err)
		}
		recs = append(recs, g)
	}
	if err := c.ScriptFlush(testkit.Context(t)).Err(); err != nil {
		t.Fatal(err)
	}
	for i, want := range []int64{2, 1} {
		before := hook.Load()
		errs, cerr := leasetest.RenewBatch(testkit.Context(t), b, recs)
		if cerr != nil {
			t.Fatal(cerr)
		}
		for _, err := range errs {
			if err != nil {
				t.Fatalf("RenewBatch: %v", err)
			}
		}
		if n := hook.Load() - before; n != want {
			t.Fatalf("batch %d took %d round trips, want %d", i, n, want)
		}
	}
}
