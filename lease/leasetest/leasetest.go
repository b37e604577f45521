// Package leasetest is the conformance suite every lease.Backend must pass.
// A backend's own tests call Run against the real store:
//
//	func TestConformance(t *testing.T) {
//		leasetest.Run(t, func(t *testing.T) func() lease.Backend {
//			ns := uniqueNamespace(t)
//			return func() lease.Backend { return connect(t, ns) }
//		})
//	}
//
// The suite checks the Backend contract directly (grants, token growth,
// compare-and-set renew and release, expiry, watch signals) and through a
// lease.Manager (exclusivity under contention over several connections,
// release semantics, loss at the local deadline, prompt wake-up of waiters).
package leasetest

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fencekit/fencekit/fence"
	"github.com/fencekit/fencekit/lease"
)

// NewStore prepares an isolated namespace of the store for one subtest
// (registering its cleanup with t) and returns a function that connects a
// new Backend to it. Each call of connect should open its own connection
// where the store has connections, so that the suite can contend across
// clients. connect is called from the test goroutine only.
type NewStore func(t *testing.T) (connect func() lease.Backend)

// Run runs the whole suite as parallel subtests of t.
func Run(t *testing.T, newStore NewStore) {
	tests := []struct {
		name string
		fn   func(*testing.T, func() lease.Backend)
	}{
		{"GrantMintsToken", testGrantMintsToken},
		{"HeldByAnotherOwner", testHeldByAnotherOwner},
		{"SameOwnerAcquireIsIdempotent", testSameOwnerIdempotent},
		{"TokensStrictlyGrow", testTokensGrow},
		{"RenewComparesOwner", testRenewComparesOwner},
		{"ReleaseComparesOwner", testReleaseComparesOwner},
		{"ExpiresAfterTTL", testExpiresAfterTTL},
		{"RenewKeepsLeaseAlive", testRenewKeepsAlive},
		{"NamesDoNotCollide", testNamesDoNotCollide},
		{"WatchSignalsRelease", testWatchSignalsRelease},
		{"RenewBatchComparesOwner", testRenewBatch},
		{"ManagerExclusiveUnderContention", testExclusiveUnderContention},
		{"ManagerReleaseSemantics", testReleaseSemantics},
		{"ManagerLosesAtLocalDeadline", testLosesAtLocalDeadline},
		{"ManagerWakesWaiterOnRelease", testWakesWaiter},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			tc.fn(t, newStore(t))
		})
	}
}

var seq atomic.Int64

// name returns a lease name unique within the process.
func name(t *testing.T) string {
	return fmt.Sprintf("%s-%d", t.Name(), seq.Add(1))
}

func rec(name, owner string, ttl time.Duration) lease.Record {
	return lease.Record{Name: name, Owner: owner, TTL: ttl}
}

func ctxT(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return ctx
}

func mustAcquire(t *testing.T, b lease.Backend, r lease.Record) fence.Token {
	t.Helper()
	tok, err := b.Acquire(ctxT(t), r)
	if err != nil {
		t.Fatalf("Acquire(%q, owner %q): %v", r.Name, r.Owner, err)
	}
	if tok == fence.None {
		t.Fatalf("Acquire(%q) granted token 0", r.Name)
	}
	return tok
}

func testGrantMintsToken(t *testing.T, connect func() lease.Backend) {
	b := connect()
	n := name(t)
	tok := mustAcquire(t, b, rec(n, "a", time.Minute))
	if err := b.Release(ctxT(t), lease.Record{Name: n, Owner: "a", Token: tok, TTL: time.Minute}); err != nil {
		t.Fatalf("Release: %v", err)
	}
}

func testHeldByAnotherOwner(t *testing.T, connect func() lease.Backend) {
	b1, b2 := connect(), connect()
	n := name(t)
	ttl := 10 * time.Second
	mustAcquire(t, b1, rec(n, "a", ttl))
	_, err := b2.Acquire(ctxT(t), rec(n, "b", ttl))
	if !errors.Is(err, lease.ErrNotAcquired) {
		t.Fatalf("second owner's Acquire = %v, want ErrNotAcquired", err)
	}
	var na *lease.NotAcquiredError
	if errors.As(err, &na) && (na.RetryAfter < 0 || na.RetryAfter > ttl) {
		t.Fatalf("RetryAfter = %v, want within (0, %v]", na.RetryAfter, ttl)
	}
}

func testSameOwnerIdempotent(t *testing.T, connect func() lease.Backend) {
	b := connect()
	n := name(t)
	tok1 := mustAcquire(t, b, rec(n, "a", 10*time.Second))
	tok2 := mustAcquire(t, b, rec(n, "a", 10*time.Second))
	if tok1 != tok2 {
		t.Fatalf("a retried Acquire by the same owner returned token %d, then %d; want the same", tok1, tok2)
	}
}

func testTokensGrow(t *testing.T, connect func() lease.Backend) {
	b := connect()
	n := name(t)
	var last fence.Token
	for i := range 50 {
		owner := fmt.Sprintf("o%d", i)
		tok := mustAcquire(t, b, rec(n, owner, 10*time.Second))
		if tok <= last {
			t.Fatalf("grant %d: token %d is not greater than the previous %d", i, tok, last)
		}
		last = tok
		if err := b.Release(ctxT(t), lease.Record{Name: n, Owner: owner, Token: tok, TTL: 10 * time.Second}); err != nil {
			t.Fatalf("Release: %v", err)
		}
	}
}

func testRenewComparesOwner(t *testing.T, connect func() lease.Backend) {
	b := connect()
	n := name(t)
	r := rec(n, "a", 10*time.Second)
	r.Token = mustAcquire(t, b, r)
	other := r
	other.Owner = "b"
	if err := b.Renew(ctxT(t), other); !errors.Is(err, lease.ErrNotHeld) {
		t.Fatalf("Renew by another owner = %v, want ErrNotHeld", err)
	}
	if err := b.Renew(ctxT(t), r); err != nil {
		t.Fatalf("Renew by the owner: %v", err)
	}
	if err := b.Release(ctxT(t), r); err != nil {
		t.Fatalf("Release: %v", err)
	}
	// A renew after release must not re-create the lease.
	if err := b.Renew(ctxT(t), r); !errors.Is(err, lease.ErrNotHeld) {
		t.Fatalf("Renew after release = %v, want ErrNotHeld", err)
	}
	tok := mustAcquire(t, b, rec(n, "c", 10*time.Second))
	if tok <= r.Token {
		t.Fatalf("token after release %d <= earlier token %d", tok, r.Token)
	}
}

func testReleaseComparesOwner(t *testing.T, connect func() lease.Backend) {
	b := connect()
	n := name(t)
	r := rec(n, "a", 10*time.Second)
	r.Token = mustAcquire(t, b, r)
	other := r
	other.Owner = "b"
	if err := b.Release(ctxT(t), other); !errors.Is(err, lease.ErrNotHeld) {
		t.Fatalf("Release by another owner = %v, want ErrNotHeld", err)
	}
	if _, err := b.Acquire(ctxT(t), rec(n, "c", 10*time.Second)); !errors.Is(err, lease.ErrNotAcquired) {
		t.Fatalf("after a foreign Release the lease must still be held; Acquire = %v", err)
	}
	if err := b.Release(ctxT(t), r); err != nil {
		t.Fatalf("Release by the owner: %v", err)
	}
	if err := b.Release(ctxT(t), r); !errors.Is(err, lease.ErrNotHeld) {
		t.Fatalf("second Release = %v, want ErrNotHeld", err)
	}
}

func testExpiresAfterTTL(t *testing.T, connect func() lease.Backend) {
	b := connect()
	n := name(t)
	ttl := 100 * time.Millisecond
	r := rec(n, "a", ttl)
	r.Token = mustAcquire(t, b, r)
	time.Sleep(ttl + 100*time.Millisecond)
	tok := mustAcquire(t, b, rec(n, "b", 10*time.Second))
	if tok <= r.Token {
		t.Fatalf("token after expiry %d <= expired token %d", tok, r.Token)
	}
	// The old owner must not get the lease back by renewing.
	if err := b.Renew(ctxT(t), r); !errors.Is(err, lease.ErrNotHeld) {
		t.Fatalf("Renew by the expired owner = %v, want ErrNotHeld", err)
	}
	if err := b.Release(ctxT(t), r); !errors.Is(err, lease.ErrNotHeld) {
		t.Fatalf("Release by the expired owner = %v, want ErrNotHeld", err)
	}
}

func testRenewKeepsAlive(t *testing.T, connect func() lease.Backend) {
	b1, b2 := connect(), connect()
	n := name(t)
	ttl := 300 * time.Millisecond
	r := rec(n, "a", ttl)
	r.Token = mustAcquire(t, b1, r)
	for range 8 {
		time.Sleep(ttl / 3)
		if err := b1.Renew(ctxT(t), r); err != nil {
			t.Fatalf("Renew: %v", err)
		}
		if _, err := b2.Acquire(ctxT(t), rec(n, "b", ttl)); !errors.Is(err, lease.ErrNotAcquired) {
			t.Fatalf("a renewed lease was granted to another owner: %v", err)
		}
	}
}

func testNamesDoNotCollide(t *testing.T, connect func() lease.Backend) {
	b := connect()
	base := name(t)
	names := []string{base + "a{b}c", base + "a%7Bb%7Dc", base + "}", base + "{", base + "ünï/cødé", base + "a:b", base + "a b"}
	// Each name with its own owner: names that shared a key would refuse
	// the second owner.
	for i, n := range names {
		mustAcquire(t, b, rec(n, fmt.Sprintf("owner-%d", i), 10*time.Second))
	}
}

func testWatchSignalsRelease(t *testing.T, connect func() lease.Backend) {
	b := connect()
	w, ok := b.(lease.Watcher)
	if !ok {
		return // The backend does not signal; Manager polls.
	}
	n := name(t)
	r := rec(n, "a", time.Minute)
	r.Token = mustAcquire(t, b, r)
	sig, stop, err := w.Watch(ctxT(t), n)
	if err != nil {
		t.Fatalf("Watch: %v", err)
	}
	defer stop()
	if err := connect().Release(ctxT(t), r); err != nil {
		t.Fatalf("Release: %v", err)
	}
	select {
	case <-sig:
	case <-time.After(5 * time.Second):
		t.Fatal("no signal within 5s of a release")
	}
}

func testRenewBatch(t *testing.T, connect func() lease.Backend) {
	b := connect()
	br, ok := b.(lease.BatchRenewer)
	if !ok {
		return
	}
	n := name(t)
	ttl := 10 * time.Second
	mine := rec(n+"-mine", "a", ttl)
	mine.Token = mustAcquire(t, b, mine)
	theirs := rec(n+"-theirs", "b", ttl)
	theirs.Token = mustAcquire(t, b, theirs)
	stolen := theirs
	stolen.Owner = "a"
	gone := rec(n+"-gone", "a", ttl)
	errs := br.RenewBatch(ctxT(t), []lease.Record{mine, stolen, gone, mine})
	if len(errs) != 4 {
		t.Fatalf("RenewBatch returned %d results for 4 records", len(errs))
	}
	if errs[0] != nil || errs[3] != nil {
		t.Fatalf("RenewBatch of a held lease: %v, %v", errs[0], errs[3])
	}
	if !errors.Is(errs[1], lease.ErrNotHeld) || !errors.Is(errs[2], lease.ErrNotHeld) {
		t.Fatalf("RenewBatch of another's and of a missing lease: %v, %v; want ErrNotHeld", errs[1], errs[2])
	}
	if _, err := b.Acquire(ctxT(t), gone); err != nil {
		t.Fatalf("a batch renew must not create a lease; Acquire: %v", err)
	}
}

func newManager(t *testing.T, b lease.Backend, opts lease.Options) *lease.Manager {
	t.Helper()
	m, err := lease.NewManager(b, opts)
	if err != nil {
		t.Fatalf("NewManager: %v", err)
	}
	return m
}

// testExclusiveUnderContention: many goroutines over two connections take
// the same lease in turns; a checker fails if two holders ever overlap and
// requires tokens to grow in grant order.
func testExclusiveUnderContention(t *testing.T, connect func() lease.Backend) {
	n := name(t)
	managers := []*lease.Manager{
		newManager(t, connect(), lease.Options{TTL: 5 * time.Second}),
		newManager(t, connect(), lease.Options{TTL: 5 * time.Second}),
	}
	const workers, rounds = 8, 15
	var (
		mu      sync.Mutex
		holder  = -1
		last    fence.Token
		grants  int
		failure error
	)
	fail := func(err error) {
		mu.Lock()
		if failure == nil {
			failure = err
		}
		mu.Unlock()
	}
	ctx := ctxT(t)
	var wg sync.WaitGroup
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			m := managers[w%len(managers)]
			for range rounds {
				l, err := m.Acquire(ctx, n)
				if err != nil {
					fail(fmt.Errorf("worker %d: Acquire: %w", w, err))
					return
				}
				mu.Lock()
				if holder != -1 {
					failure = errors.Join(failure, fmt.Errorf("worker %d granted token %d while worker %d holds the lease", w, l.Token(), holder))
				}
				if l.Token() <= last {
					failure = errors.Join(failure, fmt.Errorf("worker %d granted token %d after token %d", w, l.Token(), last))
				}
				holder, last = w, l.Token()
				grants++
				mu.Unlock()
				time.Sleep(time.Millisecond)
				if l.Err() != nil {
					fail(fmt.Errorf("worker %d: lease ended while working: %w", w, l.Err()))
				}
				mu.Lock()
				holder = -1
				mu.Unlock()
				if err := l.Release(ctx); err != nil {
					fail(fmt.Errorf("worker %d: Release: %w", w, err))
					return
				}
			}
		}()
	}
	wg.Wait()
	if failure != nil {
		t.Fatal(failure)
	}
	if grants != workers*rounds {
		t.Fatalf("%d grants, want %d", grants, workers*rounds)
	}
}

func testReleaseSemantics(t *testing.T, connect func() lease.Backend) {
	m := newManager(t, connect(), lease.Options{TTL: 10 * time.Second})
	other := newManager(t, connect(), lease.Options{TTL: 10 * time.Second})
	n := name(t)

	l, err := m.TryAcquire(ctxT(t), n)
	if err != nil {
		t.Fatalf("TryAcquire: %v", err)
	}
	if _, err := other.TryAcquire(ctxT(t), n); !errors.Is(err, lease.ErrNotAcquired) {
		t.Fatalf("TryAcquire of a held lease = %v, want ErrNotAcquired", err)
	}
	// Release with a context that is already cancelled still releases.
	cancelled, cancel := context.WithCancel(context.Background())
	cancel()
	if err := l.Release(cancelled); err != nil {
		t.Fatalf("Release with a cancelled context: %v", err)
	}
	if !errors.Is(context.Cause(l.Context()), lease.ErrReleased) || !errors.Is(l.Err(), lease.ErrReleased) {
		t.Fatalf("after Release: cause %v, Err %v; want ErrReleased", context.Cause(l.Context()), l.Err())
	}
	select {
	case <-l.Done():
	default:
		t.Fatal("Done not closed after Release")
	}
	// Twice is harmless.
	if err := l.Release(ctxT(t)); err != nil {
		t.Fatalf("second Release: %v", err)
	}
	if err := l.Renew(ctxT(t)); !errors.Is(err, lease.ErrReleased) {
		t.Fatalf("Renew after Release = %v, want ErrReleased", err)
	}
	l2, err := other.TryAcquire(ctxT(t), n)
	if err != nil {
		t.Fatalf("TryAcquire after release: %v", err)
	}
	if l2.Token() <= l.Token() {
		t.Fatalf("token %d after release <= %d", l2.Token(), l.Token())
	}
	if err := l2.Release(ctxT(t)); err != nil {
		t.Fatalf("Release: %v", err)
	}
}

func testLosesAtLocalDeadline(t *testing.T, connect func() lease.Backend) {
	ttl := 200 * time.Millisecond
	m := newManager(t, connect(), lease.Options{TTL: ttl, DisableAutoRenew: true})
	n := name(t)
	before := time.Now()
	l, err := m.TryAcquire(ctxT(t), n)
	if err != nil {
		t.Fatalf("TryAcquire: %v", err)
	}
	if dl := l.Deadline(); dl.After(before.Add(ttl)) || !dl.After(before) {
		t.Fatalf("deadline %v after the call began, want within (0, %v]", dl.Sub(before), ttl)
	}
	select {
	case <-l.Done():
	case <-time.After(10 * time.Second):
		t.Fatal("lease not lost 10s after its TTL passed without renewal")
	}
	if lostAt := time.Now(); lostAt.After(before.Add(ttl + 2*time.Second)) {
		t.Fatalf("lost %v after the call began, TTL %v", lostAt.Sub(before), ttl)
	}
	var le *lease.LostError
	if !errors.As(l.Err(), &le) || le.Reason != lease.LostExpired || !errors.Is(context.Cause(l.Context()), lease.ErrLost) {
		t.Fatalf("Err = %v, cause %v; want a LostError (expired)", l.Err(), context.Cause(l.Context()))
	}
	if err := l.Renew(ctxT(t)); !errors.Is(err, lease.ErrLost) {
		t.Fatalf("Renew of a lost lease = %v, want ErrLost", err)
	}
	if err := l.Release(ctxT(t)); !errors.Is(err, lease.ErrLost) {
		t.Fatalf("Release of a lost lease = %v, want ErrLost", err)
	}
	if err := l.Release(ctxT(t)); !errors.Is(err, lease.ErrLost) {
		t.Fatalf("second Release of a lost lease = %v, want ErrLost", err)
	}
}

func testWakesWaiter(t *testing.T, connect func() lease.Backend) {
	b := connect()
	if _, ok := b.(lease.Watcher); !ok {
		return
	}
	n := name(t)
	// Expiry and polling would take seconds: only a release signal can
	// wake the waiter quickly.
	opts := lease.Options{TTL: 30 * time.Second, PollInterval: 10 * time.Second}
	holder, err := newManager(t, b, opts).TryAcquire(ctxT(t), n)
	if err != nil {
		t.Fatalf("TryAcquire: %v", err)
	}
	waiter := newManager(t, connect(), opts)
	type result struct {
		l   *lease.Lease
		at  time.Time
		err error
	}
	got := make(chan result, 1)
	go func() {
		l, err := waiter.Acquire(ctxT(t), n)
		got <- result{l, time.Now(), err}
	}()
	time.Sleep(300 * time.Millisecond) // let the waiter block and subscribe
	releasedAt := time.Now()
	if err := holder.Release(ctxT(t)); err != nil {
		t.Fatalf("Release: %v", err)
	}
	r := <-got
	if r.err != nil {
		t.Fatalf("waiter's Acquire: %v", r.err)
	}
	defer r.l.Release(ctxT(t))
	wake := r.at.Sub(releasedAt)
	t.Logf("waiter acquired %v after the release", wake)
	if wake > time.Second {
		t.Fatalf("waiter acquired %v after the release; it should be woken at once (poll interval %v)", wake, opts.PollInterval)
	}
}
