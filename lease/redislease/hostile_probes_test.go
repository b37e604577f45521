package redislease_test

import (
	"context"
	"errors"
	"fmt"
	"math"
	mrand "math/rand/v2"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/fencekit/fencekit/internal/testkit"
	"github.com/fencekit/fencekit/lease"
	"github.com/fencekit/fencekit/lease/driver"
	"github.com/fencekit/fencekit/lease/leasetest"
	"github.com/fencekit/fencekit/lease/redislease"
	"github.com/fencekit/fencekit/lease/redislease/redistest"
)

// delayClient delivers every script reply (and pipeline) late by a delay
// chosen per call: a network that holds replies back. The request itself
// reaches Redis at once, so the store acts before the client hears of it.
// The delay ignores the request's context, like a client without
// ContextTimeoutEnabled.
type delayClient struct {
	*redis.Client
	// delay is called once Redis has run the script, with its reply (nil
	// for a pipeline), and returns how long to hold the reply back. A
	// script refused with NOSCRIPT (sent again with its body) is not
	// delayed and not reported.
	delay func(reply *redis.Cmd) time.Duration
}

func (d *delayClient) Eval(ctx context.Context, script string, keys []string, args ...any) *redis.Cmd {
	r := d.Client.Eval(ctx, script, keys, args...)
	time.Sleep(d.delay(r))
	return r
}

func (d *delayClient) EvalSha(ctx context.Context, sha string, keys []string, args ...any) *redis.Cmd {
	r := d.Client.EvalSha(ctx, sha, keys, args...)
	if !redis.HasErrorPrefix(r.Err(), "NOSCRIPT") {
		time.Sleep(d.delay(r))
	}
	return r
}

func (d *delayClient) Pipelined(ctx context.Context, fn func(redis.Pipeliner) error) ([]redis.Cmder, error) {
	cmds, err := d.Client.Pipelined(ctx, fn)
	time.Sleep(d.delay(nil))
	return cmds, err
}

// TestHostile_ExclusiveWhileLeasesExpireDuringWork: holders over four
// managers (prompt replies; replies delayed up to 2/3 of the TTL; manual
// renewal that stops; delayed replies with no safety margin) take one
// short-TTL lease in turns, and many of their leases expire during work.
// Each holder samples Err() and Deadline() while working. No holder may
// believe it holds the lease (Err() == nil), nor report a Deadline(), later
// than the moment any later grant had already been made.
func TestHostile_ExclusiveWhileLeasesExpireDuringWork(t *testing.T) {
	const ttl = 60 * time.Millisecond
	prefix := redistest.Prefix(t)
	delayed := func() redislease.Client {
		return &delayClient{Client: redistest.Shared(t), delay: func(*redis.Cmd) time.Duration { return mrand.N(40 * time.Millisecond) }}
	}
	type mgr struct {
		name   string
		m      *lease.Manager
		manual bool
	}
	mgrs := []mgr{
		{"prompt", newManager(t, newBackend(t, redistest.Shared(t), prefix), lease.Options{TTL: ttl}), false},
		{"delayed", newManager(t, newBackend(t, delayed(), prefix), lease.Options{TTL: ttl}), false},
		{"manual", newManager(t, newBackend(t, redistest.Shared(t), prefix), lease.Options{TTL: ttl, DisableAutoRenew: true}), true},
		{"delayed-nomargin", newManager(t, newBackend(t, delayed(), prefix), lease.Options{TTL: ttl, SafetyMargin: lease.NoSafetyMargin}), false},
	}
	const name = "expire-during-work"
	var (
		mu       sync.Mutex
		holdings []holding
	)
	// The overlap check needs hand-offs to look at: the workers take turns
	// for 4 s, and on a machine so loaded that fewer than minGrants were
	// made by then, carry on until there are that many, for up to a
	// minute. Fewer after that means the lease stopped being handed over.
	const minGrants = 20
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	start := time.Now()
	more := func() bool {
		mu.Lock()
		n := len(holdings)
		mu.Unlock()
		since := time.Since(start)
		return since < 4*time.Second || (n < minGrants && since < time.Minute)
	}
	var wg sync.WaitGroup
	for w := range 6 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for more() {
				mg := mgrs[(w+mrand.N(len(mgrs)))%len(mgrs)]
				actx, cancel := context.WithTimeout(ctx, 500*time.Millisecond)
				l, err := mg.m.Acquire(actx, name)
				acquiredAt := time.Now()
				cancel()
				if err != nil {
					continue
				}
				h := holding{token: l.Token(), acquiredAt: acquiredAt, manager: mg.name}
				work := time.Duration(mrand.N(4)) * ttl / 2 // 0 to 1.5 TTL
				renews := mrand.N(3)
				h = workWhileHeld(t, ctx, l, h, time.Now().Add(work), func() {
					if mg.manual && renews > 0 && mrand.N(10) == 0 {
						renews--
						_ = l.Renew(ctx)
					}
				})
				mu.Lock()
				holdings = append(holdings, h)
				mu.Unlock()
			}
		}()
	}
	wg.Wait()

	lost := checkNoOverlap(t, holdings)
	t.Logf("%d grants checked, %d lost during work", len(holdings), lost)
	if len(holdings) < minGrants {
		t.Fatalf("only %d grants in %v, want %d: the test did not exercise contention", len(holdings), time.Since(start).Round(time.Millisecond), minGrants)
	}
}

// waitersFor starts n blocked Acquire calls on name and returns a channel
// of their leases.
func waitersFor(t *testing.T, m *lease.Manager, name string, n int, wg *sync.WaitGroup) <-chan *lease.Lease {
	got := make(chan *lease.Lease, n)
	for range n {
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
	return got
}

// handOff releases holder and requires every waiter to get the lease in
// turn, each within within of the previous release.
func handOff(t *testing.T, holder *lease.Lease, got <-chan *lease.Lease, n int, within time.Duration) {
	t.Helper()
	if err := holder.Release(testkit.Context(t)); err != nil {
		t.Fatalf("Release: %v", err)
	}
	for i := range n {
		released := time.Now()
		select {
		case l := <-got:
			if err := l.Release(testkit.Context(t)); err != nil {
				t.Fatalf("Release: %v", err)
			}
		case <-time.After(within):
			t.Fatalf("hand-off %d: no waiter got the lease within %v of the release", i, within)
		}
		_ = released
	}
}

// TestHostile_PubSubKilledWhileWaiting: the backend's pub/sub connection is
// killed (CLIENT KILL TYPE pubsub, several times) while waiters wait; a
// release afterwards still wakes them at once, not after PollInterval
// (20 s here), because go-redis resubscribes and the hub signals on
// resubscription.
func TestHostile_PubSubKilledWhileWaiting(t *testing.T) {
	srv := redistest.Start(t)
	admin := srv.Client()
	b := newBackend(t, srv.Client(), "fencekit:")
	m := newManager(t, b, lease.Options{TTL: 60 * time.Second, PollInterval: 20 * time.Second})
	const name, waiters = "killed", 4
	holder := testkit.TryAcquire(t, m, name)
	var wg sync.WaitGroup
	got := waitersFor(t, m, name, waiters, &wg)
	// Each kill comes once the backend is subscribed again, on a new
	// connection (Redis numbers clients in increasing order, so a client
	// newer than the killed ones is a reconnection, never a connection
	// the kill has yet to free).
	var killed int64
	for range 3 {
		killed = awaitSubscribed(t, admin, killed)
		if n, err := admin.ClientKillByFilter(testkit.Context(t), "TYPE", "pubsub").Result(); err != nil || n == 0 {
			t.Fatalf("CLIENT KILL TYPE pubsub = %d, %v", n, err)
		}
	}
	awaitSubscribed(t, admin, killed)
	// And once more, immediately followed by the release, which may be
	// published before the connection is back.
	if err := admin.ClientKillByFilter(testkit.Context(t), "TYPE", "pubsub").Err(); err != nil {
		t.Fatal(err)
	}
	handOff(t, holder, got, waiters, 3*time.Second)
	wg.Wait()
}

// awaitSubscribed waits until a pub/sub client of the server behind admin
// with an ID greater than after has subscribed to a channel (classic or
// sharded), and returns the greatest ID of the pub/sub clients then.
func awaitSubscribed(t *testing.T, admin *redis.Client, after int64) int64 {
	t.Helper()
	start := time.Now()
	for {
		list, err := admin.Do(testkit.Context(t), "CLIENT", "LIST", "TYPE", "pubsub").Text()
		if err != nil {
			t.Fatalf("CLIENT LIST TYPE pubsub: %v", err)
		}
		var newest int64
		subscribed := false
		for _, line := range strings.Split(strings.TrimSpace(list), "\n") {
			var id, subs int64
			for _, f := range strings.Fields(line) {
				k, v, _ := strings.Cut(f, "=")
				switch k {
				case "id":
					id, _ = strconv.ParseInt(v, 10, 64)
				case "sub", "ssub":
					n, _ := strconv.ParseInt(v, 10, 64)
					subs += n
				}
			}
			newest = max(newest, id)
			if id > after && subs > 0 {
				subscribed = true
			}
		}
		if subscribed {
			return newest
		}
		if time.Since(start) > 10*time.Second {
			t.Fatalf("no pub/sub client newer than ID %d subscribed within 10s; clients:\n%s", after, list)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// TestHostile_CloseWhileWaiting: Backend.Close while waiters wait (some
// subscribed, one still subscribing) ends the pub/sub connection; the
// waiters carry on by polling and get the lease after a release within a
// poll interval, and no goroutine is left behind (TestMain runs goleak).
func TestHostile_CloseWhileWaiting(t *testing.T) {
	c := redistest.Shared(t)
	b := newBackend(t, c, redistest.Prefix(t))
	m := newManager(t, b, lease.Options{TTL: 60 * time.Second, PollInterval: time.Second})
	const name, waiters = "closed", 4
	holder := testkit.TryAcquire(t, m, name)
	var wg sync.WaitGroup
	got := waitersFor(t, m, name, waiters, &wg)
	time.Sleep(200 * time.Millisecond)
	if err := b.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	late := waitersFor(t, m, name, 1, &wg) // its Watch fails with ErrClosed
	merged := make(chan *lease.Lease, waiters+1)
	go func() {
		for range waiters {
			merged <- <-got
		}
	}()
	go func() { merged <- <-late }()
	handOff(t, holder, merged, waiters+1, 3*time.Second)
	wg.Wait()
	if err := b.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
}

// TestHostile_AcquireReplyLaterThanTTL: the grant reaches the store, but
// its reply arrives after the TTL, when the store has let it expire and
// another holder took the lease. The late grant must be refused, its token
// never handed out, and the other holder's grant left alone.
func TestHostile_AcquireReplyLaterThanTTL(t *testing.T) {
	const ttl = 200 * time.Millisecond
	prefix := redistest.Prefix(t)
	var slowOnce sync.Once
	// The slow client's first script is the acquire: its reply, as Redis
	// sent it, is passed on here once Redis has run it.
	stored := make(chan *redis.Cmd, 1)
	slow := &delayClient{Client: redistest.Shared(t), delay: func(reply *redis.Cmd) time.Duration {
		d := time.Duration(0)
		slowOnce.Do(func() {
			stored <- reply
			d = ttl + 150*time.Millisecond
		})
		return d
	}}
	slowM := newManager(t, newBackend(t, slow, prefix), lease.Options{TTL: ttl})
	otherB := newBackend(t, redistest.Shared(t), prefix)
	otherM := newManager(t, otherB, lease.Options{TTL: 10 * time.Second})
	const name = "late-grant"

	type res struct {
		l   *lease.Lease
		err error
	}
	done := make(chan res, 1)
	go func() {
		l, err := slowM.TryAcquire(testkit.Context(t), name)
		done <- res{l, err}
	}()
	// The other client starts once Redis has granted the slow request, so
	// that it takes the lease over after that grant's expiry, however late
	// the slow goroutine ran. (Started after a fixed sleep, it could come
	// first: the slow request would then be refused at the store, and the
	// test would pass without a late grant.)
	var slowToken int64
	select {
	case reply := <-stored:
		v, err := reply.Int64()
		if err != nil || v <= 0 {
			t.Fatalf("the delayed acquire was not granted at the store (reply %d, %v): the test would not exercise a late grant", v, err)
		}
		slowToken = v
	case <-time.After(10 * time.Second):
		t.Fatal("the slow client's acquire did not reach Redis within 10s")
	}
	other, err := otherM.Acquire(testkit.Context(t), name) // waits for the expiry
	if err != nil {
		t.Fatalf("other Acquire: %v", err)
	}
	r := <-done
	if r.err == nil || !errors.Is(r.err, lease.ErrNotAcquired) {
		if r.l != nil {
			_ = r.l.Release(testkit.Context(t))
		}
		t.Fatalf("TryAcquire with a reply later than the TTL = %v, %v; want ErrNotAcquired", r.l, r.err)
	}
	if uint64(other.Token()) <= uint64(slowToken) {
		t.Fatalf("the other holder got token %d, not greater than the late grant's %d", other.Token(), slowToken)
	}
	if err := other.Renew(testkit.Context(t)); err != nil {
		t.Fatalf("the other holder's grant was disturbed by the late grant's give-back: %v", err)
	}
	if err := other.Release(testkit.Context(t)); err != nil {
		t.Fatal(err)
	}
}

// TestHostile_RenewReplyAfterDeadline: a renewal reaches the store and
// succeeds there, but its reply arrives after the local deadline. The lease
// must be lost at its deadline (not when the reply comes, and not revived
// by it), Renew must report ErrLost, and the grant that the late renewal
// extended must be given back so that others need not wait a TTL.
//
// The store keeps a grant for the TTL, 10 s, while the lease is valid here
// for 1 s only (a safety margin of 9 s): when the late reply comes, the
// grant the renewal extended still has about 8 s to live at the store, so
// finding it gone right after Renew returned tells a give-back from an
// expiry. (With a TTL close to the validity, the store would have let the
// grant expire before the reply came, and the check could not fail.)
func TestHostile_RenewReplyAfterDeadline(t *testing.T) {
	const (
		ttl      = 10 * time.Second
		validity = time.Second
		// The renewal is sent after the acquire, so its reply comes at
		// least 600 ms after the deadline: far beyond a late timer's slack
		// (a lease that ended at the reply, not at its deadline, is told
		// apart), and seconds before the store's TTL runs out.
		replyDelay = validity + 600*time.Millisecond
	)
	prefix := redistest.Prefix(t)
	var armed atomic.Bool // the next script's reply is delayed
	slow := &delayClient{Client: redistest.Shared(t), delay: func(*redis.Cmd) time.Duration {
		if armed.CompareAndSwap(true, false) {
			return replyDelay
		}
		return 0
	}}
	b := newBackend(t, slow, prefix)
	renews := &testkit.RenewEvents{}
	m := newManager(t, b, lease.Options{TTL: ttl, SafetyMargin: ttl - validity, DisableAutoRenew: true, Observer: renews})
	const name = "late-renew"
	l := testkit.TryAcquire(t, m, name)
	deadline := l.Deadline()
	lostAt := make(chan time.Time, 1)
	go func() { <-l.Done(); lostAt <- time.Now() }()
	armed.Store(true)
	err := l.Renew(testkit.Context(t))
	returned := time.Now()
	// Right away, before the store's TTL could have ended the grant the
	// late renewal extended: the give-back ran inside Renew.
	key := b.KeysFor(name).Lease
	pttl, perr := redistest.Shared(t).Do(testkit.Context(t), "PTTL", key).Int64()
	checked := time.Now()

	var le *lease.LostError
	if !errors.As(err, &le) {
		t.Fatalf("Renew whose reply came %v after the deadline = %v, want ErrLost", returned.Sub(deadline), err)
	}
	// The path under test ran: the renewal went out before the deadline
	// (it was not refused at the gate), the store extended the grant, and
	// the reply came after the deadline, later than a late timer's slack.
	evs := renews.All()
	if len(evs) != 1 {
		t.Fatalf("%d renewals reported, want the one late renewal: %+v", len(evs), evs)
	}
	e := evs[0]
	replied := e.Sent.Add(e.Latency)
	switch {
	case e.Err != nil:
		t.Fatalf("the store did not extend the grant: %v", e.Err)
	case !e.Sent.Before(deadline):
		t.Fatalf("the renewal was sent %v after the deadline; the test must send it before", e.Sent.Sub(deadline))
	case replied.Sub(deadline) <= leasetest.LateTimerSlack:
		t.Fatalf("the reply came %v after the deadline, within a late timer's slack %v: an end at the reply could not be told from one at the deadline", replied.Sub(deadline), leasetest.LateTimerSlack)
	}
	if !l.Deadline().Equal(deadline) {
		t.Fatalf("the late renewal moved the deadline by %v", l.Deadline().Sub(deadline))
	}
	if at := <-lostAt; at.Sub(deadline) > leasetest.LateTimerSlack {
		t.Fatalf("lease context done %v after the deadline (the reply came %v after it); want at the deadline, within a late timer's slack %v", at.Sub(deadline), replied.Sub(deadline), leasetest.LateTimerSlack)
	}
	if perr != nil {
		t.Fatalf("PTTL %s: %v", key, perr)
	}
	if pttl != -2 { // -2: no such key
		t.Fatalf("the grant extended by the late renewal is still stored, for %v more (PTTL %d): it was not given back, others wait a full TTL", time.Duration(pttl)*time.Millisecond, pttl)
	}
	// Redis ran the renewal after it was sent, so the grant it extended
	// would live until at least e.Sent + ttl: gone before that, it was
	// given back. (Only a stall of seconds could make the check late.)
	if !checked.Before(e.Sent.Add(ttl)) {
		t.Fatalf("the store was checked %v after the renewal was sent, when the grant would have expired anyway: the give-back went unchecked", checked.Sub(e.Sent))
	}
}

// TestHostile_NamesDoNotCollide: names built to collide under a naive key
// encoding (braces, their percent-encodings, percent signs, ":lease"
// suffixes, Unicode in two normal forms, a maximal name of braces) are
// all distinct leases, held by distinct owners at once, and each one's
// keys carry exactly one hash tag. (The conformance suite's
// testNamesDoNotCollide acquires every name with the same owner, so a
// collision would pass there as an idempotent re-acquire.)
func TestHostile_NamesDoNotCollide(t *testing.T) {
	b := newBackend(t, redistest.Shared(t), redistest.Prefix(t))
	names := []string{
		"a{b}c", "a%7Bb%7Dc", "a%257Bb%257Dc", "a%7bb%7dc", "{", "}", "%", "%25", "%7B", "%7D", "{}", "}{",
		"x}:lease", "x}:token", "x", "x:lease", "\u00e9", "e\u0301", "ünï/cødé", "🔒{🔑}", "a b", " ",
		strings.Repeat("{", driver.MaxNameLen), strings.Repeat("}", driver.MaxNameLen),
	}
	var recs []driver.Grant
	for i, n := range names {
		if err := lease.ValidateName(n); err != nil {
			t.Fatalf("name %q: %v", n, err)
		}
		r := driver.Request{Name: n, Owner: fmt.Sprintf("owner-%d", i), TTL: 10 * time.Second}
		g, err := b.Acquire(testkit.Context(t), r)
		if err != nil {
			t.Fatalf("Acquire(%q) by its own owner: %v (collides with another name)", n, err)
		}
		recs = append(recs, g)
		k := b.KeysFor(n)
		for _, key := range []string{k.Lease, k.Token, k.Channel} {
			if strings.Count(key, "{") != 1 || strings.Count(key, "}") != 1 {
				t.Errorf("key %q of name %q has more than one hash tag", key, n)
			}
		}
	}
	for _, r := range recs {
		if err := b.Release(testkit.Context(t), r); err != nil {
			t.Errorf("Release(%q): %v", r.Name, err)
		}
	}
}

// TestHostile_HugeTTL: the largest TTL a time.Duration can hold (about 292
// years, in whole milliseconds) is stored, reported back as RetryAfter
// without overflow, and released.
func TestHostile_HugeTTL(t *testing.T) {
	ttl := time.Duration(math.MaxInt64).Truncate(time.Millisecond)
	b := newBackend(t, redistest.Shared(t), redistest.Prefix(t))
	m := newManager(t, b, lease.Options{TTL: ttl})
	l := testkit.TryAcquire(t, m, "huge")
	_, err := m.TryAcquire(testkit.Context(t), "huge")
	var na *lease.NotAcquiredError
	if !errors.As(err, &na) || na.RetryAfter <= ttl-time.Minute || na.RetryAfter > ttl {
		t.Fatalf("second TryAcquire = %v, want NotAcquiredError with RetryAfter close to %v", err, ttl)
	}
	if d := time.Until(l.Deadline()); d < ttl/2 {
		t.Fatalf("deadline only %v away", d)
	}
	if err := l.Release(testkit.Context(t)); err != nil {
		t.Fatal(err)
	}
}

// TestHostile_TokenCeiling: with the counter set just below 2^53 (a restore
// from a bad backup, a hostile write), the next grant gets 2^53-1 and the
// one after that fails closed: an error, no grant stored, never a token
// that is not greater than the last.
func TestHostile_TokenCeiling(t *testing.T) {
	c := redistest.Shared(t)
	b := newBackend(t, c, redistest.Prefix(t))
	const name = "ceiling"
	k := b.KeysFor(name)
	if err := c.Set(testkit.Context(t), k.Token, strconv.FormatUint(1<<53-2, 10), 0).Err(); err != nil {
		t.Fatal(err)
	}
	r := driver.Request{Name: name, Owner: "a", TTL: 10 * time.Second}
	g, err := b.Acquire(testkit.Context(t), r)
	if err != nil || g.Token != 1<<53-1 {
		t.Fatalf("Acquire below the ceiling = %d, %v; want %d", g.Token, err, uint64(1<<53-1))
	}
	if err := b.Release(testkit.Context(t), g); err != nil {
		t.Fatal(err)
	}
	g, err = b.Acquire(testkit.Context(t), driver.Request{Name: name, Owner: "b", TTL: 10 * time.Second})
	if err == nil || errors.Is(err, lease.ErrNotAcquired) {
		t.Fatalf("Acquire at the ceiling = %d, %v; want a store error", g.Token, err)
	}
	if n := c.Exists(testkit.Context(t), k.Lease).Val(); n != 0 {
		t.Fatal("a grant was stored although the acquire failed")
	}
}
