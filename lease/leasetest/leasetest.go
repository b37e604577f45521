// Package leasetest is the conformance suite every lease.Backend must pass.
// A backend's own tests call Run against the real store:
//
//	func TestConformance(t *testing.T) {
//		leasetest.Run(t, leasetest.Config{
//			NewStore: func(t *testing.T) func() lease.Backend {
//				ns := uniqueNamespace(t)
//				return func() lease.Backend { return connect(t, ns) }
//			},
//			LoseData: func(t *testing.T, b lease.Backend) { flushTheStore(t, b) },
//		})
//	}
//
// The suite checks the Backend contract directly (grants, token growth,
// compare-and-set renew and release on owner and token, expiry, watch
// signals, batches, tokens after the store lost its data, losses the store
// pushes) and through a lease.Manager (exclusivity under contention over
// several connections, names the store never sees because the Manager
// refuses them, the longest names kept apart, release semantics, loss at
// the local deadline, prompt wake-up of waiters, a release racing
// renewals, a semaphore's bound on its holders), where the store keeps
// waiters in line, FIFO hand-off (arrival order, waiters that give up or
// die, a holder that dies), and the operator's capabilities
// (driver.Lister: the leases under a prefix with their holders and
// waiters; driver.Revoker: a grant ended from another process, its owner
// refused, its Manager's lease ended at its next renewal, the next token
// greater).
//
// CheckLostByDeadline serves a backend's own fault tests (a store that
// stopped answering): it checks a lost lease's deadline by the rule and
// allows for a late timer.
//
// # Capabilities
//
// Some checks need a capability not every store has. A backend that lacks
// one declares it in Config.Lacks with the reason, and the check is skipped
// by name (t.Skip, so "go test -v" lists it as SKIP, never as PASS). A
// capability that is neither present nor declared missing fails the check:
// nothing is skipped silently.
package leasetest

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fencekit/fencekit/fence"
	"github.com/fencekit/fencekit/lease"
	"github.com/fencekit/fencekit/lease/driver"
)

// Capability names something a backend may be unable to do.
type Capability string

const (
	// Watch: the backend implements driver.Watcher (waiters woken on release).
	Watch Capability = "watch"
	// BatchRenew: the backend implements driver.BatchRenewer.
	BatchRenew Capability = "batch-renew"
	// DataLoss: Config.LoseData is set, so the suite can check that tokens
	// keep growing after the store lost its data (docs/design.md, invariant 2).
	DataLoss Capability = "data-loss"
	// PushLoss: Config.EndSession is set, so the suite can check that a
	// loss the store pushes (a session ended at the store) ends the lease
	// at once.
	PushLoss Capability = "push-loss"
	// Inspect: the backend implements driver.Inspector (who holds a lease).
	Inspect Capability = "inspect"
	// Queue: the backend keeps waiters in line (driver.Limits.Queues), so
	// that a Manager can grant in arrival order (lease.Options.FIFO).
	Queue Capability = "queue"
)

// Config describes the store under test.
type Config struct {
	// NewStore prepares an isolated namespace of the store for one subtest
	// (registering its cleanup with t) and returns a function that connects
	// a new Backend to it. Each call of connect should open its own
	// connection where the store has connections, so that the suite can
	// contend across clients. connect is called from the test goroutine
	// only. Required.
	NewStore func(t *testing.T) (connect func() lease.Backend)

	// ShortTTL is the TTL of the checks that wait for a lease to expire.
	// Default: 500 ms (long enough that a loaded 2-core machine does not
	// starve a renewal past it), or the backend's Limits.MinTTL if that is
	// longer.
	ShortTTL time.Duration
	// LongTTL is a TTL no check outlives. Default 30 s, or the backend's
	// Limits.MaxTTL if that is shorter.
	LongTTL time.Duration

	// LoseData makes the store lose every grant and every token counter of
	// the namespace that b is connected to (FLUSHALL, a restart without
	// persistence, a truncated table, a wiped data directory), as an
	// operator or a failure would. Nil unless Lacks names DataLoss.
	LoseData func(t *testing.T, b lease.Backend)

	// EndSession ends, at the store, the session that backend b's grants
	// live in (pg_terminate_backend of its pinned connection, a ZooKeeper
	// session expiry). Nil unless Lacks names PushLoss.
	EndSession func(t *testing.T, b lease.Backend)

	// Lacks maps each capability the backend does not have to the reason.
	Lacks map[Capability]string
}

// Run runs the whole suite as parallel subtests of t.
func Run(t *testing.T, cfg Config) {
	if cfg.NewStore == nil {
		t.Fatal("leasetest: Config.NewStore is nil")
	}
	tests := []struct {
		name string
		fn   func(*testing.T, *suite)
	}{
		{"GrantMintsToken", testGrantMintsToken},
		{"LimitsAreHonest", testLimits},
		{"HeldByAnotherOwner", testHeldByAnotherOwner},
		{"SameOwnerAcquireIsIdempotent", testSameOwnerIdempotent},
		{"TokensStrictlyGrow", testTokensGrow},
		{"RenewComparesOwnerAndToken", testRenewCompares},
		{"ReleaseComparesOwnerAndToken", testReleaseCompares},
		{"EndedOwnerIsRefused", testEndedOwnerIsRefused},
		{"ExpiresAfterTTL", testExpiresAfterTTL},
		{"RenewKeepsLeaseAlive", testRenewKeepsAlive},
		{"NamesDoNotCollide", testNamesDoNotCollide},
		{"LongestNamesAreKeptApart", testLongestNamesAreKeptApart},
		{"ManagerRefusesInvalidNames", testManagerRefusesInvalidNames},
		{"WatchSignalsRelease", testWatchSignalsRelease},
		{"RenewBatchComparesOwnerAndToken", testRenewBatch},
		{"TokensGrowAfterDataLoss", testTokensGrowAfterDataLoss},
		{"StoreEndedSessionIsPushed", testPushedLoss},
		{"ManagerExclusiveUnderContention", testExclusiveUnderContention},
		{"ManagerReleaseSemantics", testReleaseSemantics},
		{"ManagerLosesAtLocalDeadline", testLosesAtLocalDeadline},
		{"ManagerWakesWaiterOnRelease", testWakesWaiter},
		{"ManagerReleaseRacingRenewIsClean", testReleaseRacingRenew},
		{"HolderReportsTheCurrentGrant", testHolder},
		{"RunHoldsTheLeaseForTheWork", testRun},
		{"RunReportsALossDuringTheWork", testRunLost},
		{"ElectionHandsLeadershipOver", testElection},
		{"ObserveReportsEachLeader", testObserve},
		{"RefusalNamesTheHolder", testRefusalNamesHolder},
		{"LineGrantsInArrivalOrder", testLineOrder},
		{"LineDropsAWaiterThatGaveUp", testLineAbandon},
		{"LineDropsAWaiterThatDied", testLineDeadWaiter},
		{"ManagerFIFOGrantsInArrivalOrder", testManagerFIFO},
		{"ManagerFIFOSurvivesAHolderThatDied", testLineHolderDies},
		{"ListShowsHoldersAndWaiters", testList},
		{"RevokeEndsExactlyTheNamedGrant", testRevoke},
		{"ManagerLosesARevokedLease", testRevokedLeaseEnds},
	}
	// The data-loss check wipes the store: it runs alone, after the others.
	var destructive []func(*testing.T)
	t.Run("group", func(t *testing.T) {
		for _, tc := range tests {
			if tc.name == "TokensGrowAfterDataLoss" {
				destructive = append(destructive, func(t *testing.T) {
					t.Run(tc.name, func(t *testing.T) { tc.fn(t, newSuite(t, cfg)) })
				})
				continue
			}
			t.Run(tc.name, func(t *testing.T) {
				t.Parallel()
				tc.fn(t, newSuite(t, cfg))
			})
		}
	})
	// The semaphore check runs alone, after the group: its contention must
	// not slow the group's timing checks (expiry, local deadlines) on a
	// loaded machine, nor they its own.
	t.Run("SemaphoreBoundsHolders", func(t *testing.T) { testSemaphoreBoundsHolders(t, newSuite(t, cfg)) })
	for _, fn := range destructive {
		fn(t)
	}
}

// suite is one check's view of the store.
type suite struct {
	cfg      Config
	connect  func() lease.Backend
	limits   driver.Limits
	short    time.Duration
	long     time.Duration
	probe    lease.Backend // the first backend connected, for capabilities
	probeSet bool
}

func newSuite(t *testing.T, cfg Config) *suite {
	s := &suite{cfg: cfg, connect: cfg.NewStore(t)}
	s.probe = s.connect()
	s.limits = s.probe.Limits()
	res := s.limits.Resolution
	if res <= 0 {
		res = time.Millisecond
	}
	s.short = cfg.ShortTTL
	if s.short == 0 {
		s.short = max(500*time.Millisecond, s.limits.MinTTL)
	}
	s.short = roundUp(s.short, res)
	s.long = cfg.LongTTL
	if s.long == 0 {
		s.long = 30 * time.Second
		if s.limits.MaxTTL > 0 {
			s.long = min(s.long, s.limits.MaxTTL)
		}
	}
	s.long = roundUp(s.long, res)
	return s
}

func roundUp(d, res time.Duration) time.Duration {
	if r := d % res; r != 0 {
		d += res - r
	}
	return d
}

// backend returns the first backend of this check, then new ones.
func (s *suite) backend() lease.Backend {
	if !s.probeSet {
		s.probeSet = true
		return s.probe
	}
	return s.connect()
}

// need skips the check, by name, if the backend declares that it lacks c,
// and fails it if the backend neither has c nor declares its lack.
func (s *suite) need(t *testing.T, c Capability, has bool) {
	t.Helper()
	reason, lacks := s.cfg.Lacks[c]
	switch {
	case has && lacks:
		t.Fatalf("leasetest: the backend has capability %q but Config.Lacks says it does not (%s)", c, reason)
	case has:
	case lacks:
		t.Skipf("capability %q not tested: the backend lacks it: %s", c, reason)
	default:
		t.Fatalf("leasetest: the backend lacks capability %q and Config.Lacks does not say why; this check cannot pass silently", c)
	}
}

var seq atomic.Int64

// name returns a lease name unique within the process.
func name(t *testing.T) string {
	return fmt.Sprintf("%s-%d", t.Name(), seq.Add(1))
}

func req(name, owner string, ttl time.Duration) driver.Request {
	return driver.Request{Name: name, Owner: owner, TTL: ttl}
}

func ctxT(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	t.Cleanup(cancel)
	return ctx
}

func mustAcquire(t *testing.T, b lease.Backend, r driver.Request) driver.Grant {
	t.Helper()
	g, err := b.Acquire(ctxT(t), r)
	if err != nil {
		t.Fatalf("Acquire(%q, owner %q): %v", r.Name, r.Owner, err)
	}
	if g.Token == fence.None {
		t.Fatalf("Acquire(%q) granted token 0", r.Name)
	}
	if g.Name != r.Name || g.Owner != r.Owner {
		t.Fatalf("Acquire(%q, %q) returned a grant of %q to %q", r.Name, r.Owner, g.Name, g.Owner)
	}
	if g.TTL < r.TTL {
		t.Fatalf("Acquire(%q) granted a TTL of %v, shorter than the %v asked for", r.Name, g.TTL, r.TTL)
	}
	return g
}

func release(t *testing.T, b lease.Backend, g driver.Grant) {
	t.Helper()
	if err := b.Release(ctxT(t), g); err != nil {
		t.Fatalf("Release(%q, token %d): %v", g.Name, g.Token, err)
	}
}

func testGrantMintsToken(t *testing.T, s *suite) {
	b := s.backend()
	n := name(t)
	g := mustAcquire(t, b, req(n, "a", s.long))
	release(t, b, g)
}

func testLimits(t *testing.T, s *suite) {
	lim := s.limits
	if lim.MinTTL < 0 || lim.MaxTTL < 0 || lim.Resolution < 0 {
		t.Fatalf("negative limits: %+v", lim)
	}
	if lim.MaxTTL > 0 && lim.MaxTTL < lim.MinTTL {
		t.Fatalf("MaxTTL %v < MinTTL %v", lim.MaxTTL, lim.MinTTL)
	}
	// A Manager accepts the suite's TTLs, and the store grants them.
	if _, err := lease.NewManager(s.backend(), s.short); err != nil {
		t.Fatalf("NewManager with the short TTL %v: %v", s.short, err)
	}
	g := mustAcquire(t, s.backend(), req(name(t), "a", s.short))
	if s.limits.Resolution > 0 && g.TTL%s.limits.Resolution != 0 {
		t.Errorf("granted TTL %v is not a multiple of the declared resolution %v", g.TTL, s.limits.Resolution)
	}
}

func testHeldByAnotherOwner(t *testing.T, s *suite) {
	b1, b2 := s.backend(), s.connect()
	n := name(t)
	g := mustAcquire(t, b1, req(n, "a", s.long))
	_, err := b2.Acquire(ctxT(t), req(n, "b", s.long))
	if !errors.Is(err, lease.ErrNotAcquired) {
		t.Fatalf("second owner's Acquire = %v, want ErrNotAcquired", err)
	}
	var na *lease.NotAcquiredError
	if errors.As(err, &na) && (na.RetryAfter < 0 || na.RetryAfter > g.TTL) {
		t.Fatalf("RetryAfter = %v, want within [0, %v]", na.RetryAfter, g.TTL)
	}
}

func testSameOwnerIdempotent(t *testing.T, s *suite) {
	b := s.backend()
	n := name(t)
	g1 := mustAcquire(t, b, req(n, "a", s.long))
	g2 := mustAcquire(t, b, req(n, "a", s.long))
	if g1.Token != g2.Token {
		t.Fatalf("a retried Acquire by the same owner returned token %d, then %d; want the same", g1.Token, g2.Token)
	}
	release(t, b, g2)
}

func testTokensGrow(t *testing.T, s *suite) {
	b := s.backend()
	n := name(t)
	var last fence.Token
	for i := range 30 {
		g := mustAcquire(t, b, req(n, fmt.Sprintf("o%d", i), s.long))
		if g.Token <= last {
			t.Fatalf("grant %d: token %d is not greater than the previous %d", i, g.Token, last)
		}
		last = g.Token
		release(t, b, g)
	}
}

func testRenewCompares(t *testing.T, s *suite) {
	b := s.backend()
	n := name(t)
	g := mustAcquire(t, b, req(n, "a", s.long))
	other := g
	other.Owner = "b"
	if err := b.Renew(ctxT(t), other); !errors.Is(err, lease.ErrNotHeld) {
		t.Fatalf("Renew by another owner = %v, want ErrNotHeld", err)
	}
	for _, tok := range []fence.Token{g.Token - 1, g.Token + 1} {
		wrong := g
		wrong.Token = tok
		if err := b.Renew(ctxT(t), wrong); !errors.Is(err, lease.ErrNotHeld) {
			t.Fatalf("Renew by the owner with token %d (granted %d) = %v, want ErrNotHeld", tok, g.Token, err)
		}
	}
	if err := b.Renew(ctxT(t), g); err != nil {
		t.Fatalf("Renew by the owner: %v", err)
	}
	release(t, b, g)
	// A renew after release must not re-create the lease.
	if err := b.Renew(ctxT(t), g); !errors.Is(err, lease.ErrNotHeld) {
		t.Fatalf("Renew after release = %v, want ErrNotHeld", err)
	}
	g2 := mustAcquire(t, b, req(n, "c", s.long))
	if g2.Token <= g.Token {
		t.Fatalf("token after release %d <= earlier token %d", g2.Token, g.Token)
	}
	release(t, b, g2)
}

func testReleaseCompares(t *testing.T, s *suite) {
	b := s.backend()
	n := name(t)
	g := mustAcquire(t, b, req(n, "a", s.long))
	other := g
	other.Owner = "b"
	if err := b.Release(ctxT(t), other); !errors.Is(err, lease.ErrNotHeld) {
		t.Fatalf("Release by another owner = %v, want ErrNotHeld", err)
	}
	wrong := g
	wrong.Token = g.Token + 1
	if err := b.Release(ctxT(t), wrong); !errors.Is(err, lease.ErrNotHeld) {
		t.Fatalf("Release by the owner with token %d (granted %d) = %v, want ErrNotHeld", wrong.Token, g.Token, err)
	}
	if _, err := s.connect().Acquire(ctxT(t), req(n, "c", s.long)); !errors.Is(err, lease.ErrNotAcquired) {
		t.Fatalf("after a foreign Release the lease must still be held; Acquire = %v", err)
	}
	release(t, b, g)
	// The same request again (a retry whose first reply was lost) is a
	// release, not a loss, and frees nothing of anyone else's.
	g2 := mustAcquire(t, s.connect(), req(n, "c", s.long))
	if err := b.Release(ctxT(t), g); err != nil {
		t.Fatalf("Release retried after it was applied = %v, want nil (a release, never ErrNotHeld)", err)
	}
	if _, err := s.connect().Acquire(ctxT(t), req(n, "d", s.long)); !errors.Is(err, lease.ErrNotAcquired) {
		t.Fatalf("a retried Release must not free the next holder's grant; Acquire = %v", err)
	}
	release(t, b, g2)
}

// testEndedOwnerIsRefused: an owner the store ended by Release or Abandon
// is never granted the name again, so a late acquire request of an attempt
// nobody waits for cannot leave a grant nobody holds.
func testEndedOwnerIsRefused(t *testing.T, s *suite) {
	b := s.backend()
	n := name(t)
	g := mustAcquire(t, b, req(n, "a", s.long))
	release(t, b, g)
	if g2, err := s.connect().Acquire(ctxT(t), req(n, "a", s.long)); !errors.Is(err, lease.ErrNotAcquired) {
		t.Fatalf("Acquire by an owner the store released = %v (grant %+v), want ErrNotAcquired", err, g2)
	}

	// Abandon before the request arrives: refused when it does.
	late := req(n, "late", s.long)
	if err := b.Abandon(ctxT(t), late); err != nil {
		t.Fatalf("Abandon of an owner that holds nothing: %v", err)
	}
	if g2, err := s.connect().Acquire(ctxT(t), late); !errors.Is(err, lease.ErrNotAcquired) {
		t.Fatalf("Acquire by an abandoned owner = %v (grant %+v), want ErrNotAcquired", err, g2)
	}

	// Abandon after the store granted: the grant ends at once, the owner
	// stays refused, and another owner gets the name with a greater token.
	ghost := req(n, "ghost", s.long)
	gg := mustAcquire(t, b, ghost)
	if err := s.connect().Abandon(ctxT(t), ghost); err != nil {
		t.Fatalf("Abandon of a granted owner: %v", err)
	}
	nb := s.connect()
	next := mustAcquire(t, nb, req(n, "next", s.long))
	if next.Token <= gg.Token {
		t.Fatalf("token after an abandoned grant %d <= its token %d", next.Token, gg.Token)
	}
	if err := b.Renew(ctxT(t), gg); !errors.Is(err, lease.ErrNotHeld) {
		t.Fatalf("Renew of an abandoned grant = %v, want ErrNotHeld", err)
	}
	if _, err := b.Acquire(ctxT(t), ghost); !errors.Is(err, lease.ErrNotAcquired) {
		t.Fatalf("Acquire by an abandoned owner = %v, want ErrNotAcquired", err)
	}
	// Abandon of an owner that does not hold the name leaves the holder be.
	if err := b.Abandon(ctxT(t), req(n, "someone", s.long)); err != nil {
		t.Fatalf("Abandon: %v", err)
	}
	if err := nb.Renew(ctxT(t), next); err != nil {
		t.Fatalf("Abandon of another owner freed the holder's grant: Renew = %v", err)
	}
	release(t, nb, next)
}

func testExpiresAfterTTL(t *testing.T, s *suite) {
	b := s.backend()
	n := name(t)
	g := mustAcquire(t, b, req(n, "a", s.short))
	other := s.connect()
	// The store may keep the grant a little longer than its TTL (its own
	// clock, its expiry sweep): poll for up to three TTLs.
	deadline := time.Now().Add(g.TTL + 2*g.TTL + time.Second)
	time.Sleep(g.TTL)
	var g2 driver.Grant
	for {
		var err error
		g2, err = other.Acquire(ctxT(t), req(n, "b", s.long))
		if err == nil {
			break
		}
		if !errors.Is(err, lease.ErrNotAcquired) || time.Now().After(deadline) {
			t.Fatalf("Acquire %v after a grant with TTL %v: %v", time.Since(deadline.Add(-3*g.TTL-time.Second)), g.TTL, err)
		}
		time.Sleep(g.TTL / 20)
	}
	if g2.Token <= g.Token {
		t.Fatalf("token after expiry %d <= expired token %d", g2.Token, g.Token)
	}
	// The old owner must not get the lease back by renewing.
	if err := b.Renew(ctxT(t), g); !errors.Is(err, lease.ErrNotHeld) {
		t.Fatalf("Renew by the expired owner = %v, want ErrNotHeld", err)
	}
	if err := b.Release(ctxT(t), g); !errors.Is(err, lease.ErrNotHeld) {
		t.Fatalf("Release by the expired owner = %v, want ErrNotHeld", err)
	}
	release(t, other, g2)
}

// testRenewKeepsAlive: renewing a grant every quarter of its TTL keeps it
// for three TTLs: the store never refuses a renew, and never grants the
// name to another owner, while the last confirmed request was sent less
// than a TTL before (the store then certainly still held the grant). A
// loaded machine can stretch a quarter TTL past a whole one; the store may
// then rightly let the grant expire, and that round proves nothing: it
// starts again with a new owner. The test fails on a violation, or when no
// round keeps pace within a minute.
func testRenewKeepsAlive(t *testing.T, s *suite) {
	b1, b2 := s.backend(), s.connect()
	n := name(t)
	giveUp := time.Now().Add(time.Minute)
	for round := 0; !renewRound(t, b1, b2, n, s.short, round); round++ {
		if time.Now().After(giveUp) {
			t.Fatalf("no round of renewals kept pace with the TTL %v within a minute (%d rounds): the machine is too loaded to tell", s.short, round+1)
		}
	}
}

// renewRound is one round of testRenewKeepsAlive; it reports whether the
// round was conclusive.
func renewRound(t *testing.T, b1, b2 lease.Backend, n string, ttl time.Duration, round int) bool {
	t.Helper()
	confirmed := time.Now() // send time of the last request the store confirmed
	g := mustAcquire(t, b1, req(n, fmt.Sprintf("a%d", round), ttl))
	end := time.Now().Add(3 * g.TTL)
	for time.Now().Before(end) {
		time.Sleep(ttl / 4)
		sent := time.Now()
		if err := b1.Renew(ctxT(t), g); err != nil {
			if since := time.Since(confirmed); errors.Is(err, lease.ErrNotHeld) && since >= ttl {
				t.Logf("round %d: the renew returned %v after the last confirmed request was sent, past the TTL %v: the grant may have expired; starting again", round, since, ttl)
				return false
			}
			t.Fatalf("Renew %v after the last confirmed request was sent (TTL %v): %v", time.Since(confirmed), ttl, err)
		}
		confirmed = sent
		g2, err := b2.Acquire(ctxT(t), req(n, fmt.Sprintf("b%d", round), ttl))
		if err == nil {
			since := time.Since(confirmed)
			release(t, b2, g2)
			if since >= ttl {
				t.Logf("round %d: another owner was granted the name %v after the last confirmed renew was sent, past the TTL %v; starting again", round, since, ttl)
				return false
			}
			t.Fatalf("a renewed lease was granted to another owner %v after the last confirmed renew was sent (TTL %v)", since, ttl)
		}
		if !errors.Is(err, lease.ErrNotAcquired) {
			t.Fatalf("Acquire by another owner = %v, want ErrNotAcquired", err)
		}
	}
	release(t, b1, g)
	return true
}

func testNamesDoNotCollide(t *testing.T, s *suite) {
	b := s.backend()
	base := name(t)
	names := []string{base + "a{b}c", base + "a%7Bb%7Dc", base + "}", base + "{", base + "ünï/cødé", base + "a:b", base + "a b", base + "a/b", base + "a//b", base + "/", base + ".."}
	// Each name with its own owner: names that shared a key would refuse
	// the second owner.
	var gs []driver.Grant
	for i, n := range names {
		gs = append(gs, mustAcquire(t, b, req(n, fmt.Sprintf("owner-%d", i), s.long)))
	}
	for _, g := range gs {
		release(t, b, g)
	}
}

func testWatchSignalsRelease(t *testing.T, s *suite) {
	b := s.backend()
	w, ok := b.(driver.Watcher)
	s.need(t, Watch, ok)
	n := name(t)
	g := mustAcquire(t, b, req(n, "a", s.long))
	sig, stop, err := w.Watch(ctxT(t), n)
	if err != nil {
		t.Fatalf("Watch: %v", err)
	}
	defer stop()
	release(t, s.connect(), g)
	select {
	case <-sig:
	case <-time.After(5 * time.Second):
		t.Fatal("no signal within 5s of a release")
	}
}

func testRenewBatch(t *testing.T, s *suite) {
	b := s.backend()
	br, ok := b.(driver.BatchRenewer)
	s.need(t, BatchRenew, ok)
	n := name(t)
	mine := mustAcquire(t, b, req(n+"-mine", "a", s.long))
	theirs := mustAcquire(t, b, req(n+"-theirs", "b", s.long))
	stolen := theirs
	stolen.Owner = "a"
	wrongTok := mine
	wrongTok.Token++
	gone := driver.Grant{Name: n + "-gone", Owner: "a", Token: mine.Token, TTL: s.long}
	errs, err := RenewBatch(ctxT(t), br, []driver.Grant{mine, stolen, gone, wrongTok, mine})
	if err != nil {
		t.Fatal(err)
	}
	if errs[0] != nil || errs[4] != nil {
		t.Fatalf("RenewBatch of a held lease: %v, %v", errs[0], errs[4])
	}
	for i, what := range map[int]string{1: "another owner's lease", 2: "a missing lease", 3: "the right owner with the wrong token"} {
		if !errors.Is(errs[i], lease.ErrNotHeld) {
			t.Errorf("RenewBatch of %s = %v, want ErrNotHeld", what, errs[i])
		}
	}
	if _, err := b.Acquire(ctxT(t), req(gone.Name, "z", s.long)); err != nil {
		t.Fatalf("a batch renew must not create a lease; Acquire: %v", err)
	}
}

// RenewBatch calls br.RenewBatch and collects the outcomes in order. It
// returns an error if the backend broke the contract: a grant reported
// twice or not at all, an index out of range, or a done call after
// RenewBatch returned.
func RenewBatch(ctx context.Context, br driver.BatchRenewer, gs []driver.Grant) ([]error, error) {
	var (
		mu       sync.Mutex
		errs     = make([]error, len(gs))
		seen     = make([]int, len(gs))
		returned bool
		bad      []error
	)
	br.RenewBatch(ctx, gs, func(i int, err error) {
		mu.Lock()
		defer mu.Unlock()
		switch {
		case returned:
			bad = append(bad, fmt.Errorf("RenewBatch reported grant %d after it returned", i))
		case i < 0 || i >= len(gs):
			bad = append(bad, fmt.Errorf("RenewBatch reported index %d of %d grants", i, len(gs)))
		default:
			seen[i]++
			errs[i] = err
		}
	})
	mu.Lock()
	defer mu.Unlock()
	returned = true
	for i, n := range seen {
		if n != 1 {
			bad = append(bad, fmt.Errorf("RenewBatch reported grant %d %d times, want once", i, n))
		}
	}
	return errs, errors.Join(bad...)
}

func testTokensGrowAfterDataLoss(t *testing.T, s *suite) {
	s.need(t, DataLoss, s.cfg.LoseData != nil)
	b := s.backend()
	base := name(t)
	before := map[string]driver.Grant{}
	for i := range 5 {
		n := fmt.Sprintf("%s-%d", base, i)
		// A few grants each, so that counters are well above their start.
		for j := range 3 {
			g := mustAcquire(t, b, req(n, fmt.Sprintf("o%d", j), s.long))
			if j < 2 {
				release(t, b, g)
			}
			before[n] = g
		}
	}
	s.cfg.LoseData(t, b)
	b2 := s.connect()
	for n, old := range before {
		g := mustAcquireEventually(t, b2, req(n, "after", s.long))
		if g.Token <= old.Token {
			t.Errorf("%s: token %d after the store lost its data, not greater than %d granted before", n, g.Token, old.Token)
		}
		// The holder from before the loss cannot renew into the new grant.
		if err := b.Renew(ctxT(t), old); !errors.Is(err, lease.ErrNotHeld) {
			t.Errorf("%s: the old holder's Renew after the loss = %v, want ErrNotHeld", n, err)
		}
		release(t, b2, g)
	}
}

// mustAcquireEventually retries transient errors for a while (a store that
// was just restarted may refuse connections for a moment).
func mustAcquireEventually(t *testing.T, b lease.Backend, r driver.Request) driver.Grant {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		_, err := b.Acquire(ctxT(t), r)
		if err == nil {
			return mustAcquire(t, b, r) // the same owner again: idempotent, and checked
		}
		if time.Now().After(deadline) {
			t.Fatalf("Acquire(%q) after the data loss: %v", r.Name, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func testPushedLoss(t *testing.T, s *suite) {
	s.need(t, PushLoss, s.cfg.EndSession != nil)
	b := s.backend()
	m := newManager(t, b, s.long, lease.WithoutAutoRenew())
	l, err := m.TryAcquire(ctxT(t), name(t))
	if err != nil {
		t.Fatalf("TryAcquire: %v", err)
	}
	ended := time.Now()
	s.cfg.EndSession(t, b)
	select {
	case <-l.Done():
	case <-time.After(s.long / 2):
		t.Fatalf("the store ended the session, and the lease was not lost within %v (no heartbeat runs; the backend must push the loss)", s.long/2)
	}
	t.Logf("loss pushed %v after the session was ended", time.Since(ended))
	var le *lease.LostError
	if !errors.As(l.Err(), &le) {
		t.Fatalf("Err = %v, want a LostError", l.Err())
	}
	// Another client gets the lease.
	other := newManager(t, s.connect(), s.long)
	ctx, cancel := context.WithTimeout(ctxT(t), s.long+10*time.Second)
	defer cancel()
	l2, err := other.Acquire(ctx, l.Name())
	if err != nil {
		t.Fatalf("another client cannot acquire after the session ended: %v", err)
	}
	if l2.Token() <= l.Token() {
		t.Fatalf("token %d after %d", l2.Token(), l.Token())
	}
	_ = l2.Release(ctxT(t))
}

func newManager(t *testing.T, b lease.Backend, ttl time.Duration, opts ...lease.Option) *lease.Manager {
	t.Helper()
	m, err := lease.NewManager(b, ttl, opts...)
	if err != nil {
		t.Fatalf("NewManager: %v", err)
	}
	return m
}

// testExclusiveUnderContention: many goroutines over two connections take
// the same lease in turns; a checker fails if two holders ever overlap and
// requires tokens to grow in grant order.
func testExclusiveUnderContention(t *testing.T, s *suite) {
	n := name(t)
	managers := []*lease.Manager{newManager(t, s.backend(), s.long), newManager(t, s.connect(), s.long)}
	const workers, rounds = 8, 12
	var (
		mu      sync.Mutex
		holder  = -1
		last    fence.Token
		grants  int
		failure error
	)
	fail := func(err error) {
		mu.Lock()
		failure = errors.Join(failure, err)
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

func testReleaseSemantics(t *testing.T, s *suite) {
	m := newManager(t, s.backend(), s.long)
	other := newManager(t, s.connect(), s.long)
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

func testLosesAtLocalDeadline(t *testing.T, s *suite) {
	m := newManager(t, s.backend(), s.short, lease.WithoutAutoRenew())
	n := name(t)
	var (
		l             *lease.Lease
		err           error
		before, after time.Time
	)
	// A grant whose reply came later than the short TTL is given back (the
	// Manager's rule, not this check's subject): on a loaded machine, ask
	// again, a few times.
	for range 5 {
		before = time.Now()
		l, err = m.TryAcquire(ctxT(t), n)
		after = time.Now()
		var held *driver.NotAcquiredError
		if err == nil || !errors.Is(err, lease.ErrNotAcquired) || errors.As(err, &held) {
			break
		}
		t.Logf("TryAcquire: %v; asking again", err)
	}
	if err != nil {
		t.Fatalf("TryAcquire: %v", err)
	}
	validity := l.TTL() - m.Options().SafetyMargin
	if dl := l.Deadline(); dl.Before(before.Add(validity)) || dl.After(after.Add(validity)) {
		t.Fatalf("deadline %v after the call began and %v after it returned; want the send time + %v (TTL - safety margin)", dl.Sub(before), dl.Sub(after), validity)
	}
	dl := l.Deadline()
	select {
	case <-l.Done():
	case <-time.After(time.Until(dl) + 10*time.Second):
		t.Fatal("lease not lost 10s after its deadline passed without renewal")
	}
	if lostAt := time.Now(); lostAt.Before(dl) {
		t.Fatalf("lost %v before its deadline", dl.Sub(lostAt))
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

func testWakesWaiter(t *testing.T, s *suite) {
	b := s.backend()
	_, ok := b.(driver.Watcher)
	s.need(t, Watch, ok)
	n := name(t)
	// Expiry and polling would take seconds: only a release signal can
	// wake the waiter quickly.
	poll := lease.WithPollInterval(10 * time.Second)
	holder, err := newManager(t, b, s.long, poll).TryAcquire(ctxT(t), n)
	if err != nil {
		t.Fatalf("TryAcquire: %v", err)
	}
	waiter := newManager(t, s.connect(), s.long, poll)
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
	if wake > 2*time.Second {
		t.Fatalf("waiter acquired %v after the release; it should be woken at once (poll interval 10s)", wake)
	}
}

// countingBackend records, per lease name, when the last release was sent
// and how many renew requests were sent after it.
type countingBackend struct {
	lease.Backend
	mu       sync.Mutex
	releases map[string]bool
	late     int
}

func (c *countingBackend) Renew(ctx context.Context, g driver.Grant) error {
	c.mu.Lock()
	if c.releases[g.Name] {
		c.late++
	}
	c.mu.Unlock()
	return c.Backend.Renew(ctx, g)
}

func (c *countingBackend) Release(ctx context.Context, g driver.Grant) error {
	c.mu.Lock()
	c.releases[g.Name] = true
	c.mu.Unlock()
	return c.Backend.Release(ctx, g)
}

// testReleaseRacingRenew: leases renewed as often as the Manager allows,
// released at random moments. A clean release is never reported as a loss,
// and no renew request is sent once the release was sent. (The batch path
// is covered by the lease package's own tests: a wrapper here would hide
// the backend's RenewBatch.)
func testReleaseRacingRenew(t *testing.T, s *suite) {
	cb := &countingBackend{Backend: s.backend(), releases: map[string]bool{}}
	// A long TTL, so that no lease can expire meanwhile: every loss
	// reported is false. Renewals as often as the short TTL would need.
	m := newManager(t, cb, s.long, lease.WithRenewInterval(max(time.Millisecond, s.short/8)), lease.WithRenewBatchWindow(lease.NoBatching))
	base := name(t)
	var lostReleases atomic.Int64
	var wg sync.WaitGroup
	const workers, rounds = 4, 25
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range rounds {
				l, err := m.TryAcquire(ctxT(t), fmt.Sprintf("%s-%d-%d", base, w, i))
				if err != nil {
					t.Errorf("TryAcquire: %v", err)
					return
				}
				time.Sleep(time.Duration(i%5) * m.Options().RenewInterval / 2)
				if err := l.Release(ctxT(t)); err != nil {
					lostReleases.Add(1)
					t.Errorf("a release of a held lease, racing its renewals, returned %v", err)
				}
			}
		}()
	}
	wg.Wait()
	cb.mu.Lock()
	defer cb.mu.Unlock()
	if cb.late > 0 {
		t.Errorf("%d renew requests were sent after their lease's release had been sent", cb.late)
	}
	if n := lostReleases.Load(); n > 0 {
		t.Errorf("%d of %d clean releases were reported as failures", n, workers*rounds)
	}
}

func testHolder(t *testing.T, s *suite) {
	b := s.backend()
	in, ok := b.(driver.Inspector)
	s.need(t, Inspect, ok)
	n := name(t)
	if _, err := in.Holder(ctxT(t), n); !errors.Is(err, lease.ErrNotHeld) {
		t.Fatalf("Holder of a free lease = %v, want ErrNotHeld", err)
	}
	m := newManager(t, b, s.long, lease.WithIdentity("inspected"))
	l, err := m.TryAcquire(ctxT(t), n)
	if err != nil {
		t.Fatal(err)
	}
	h, err := newManager(t, s.connect(), s.long).Holder(ctxT(t), n)
	if err != nil {
		t.Fatalf("Holder: %v", err)
	}
	if h.Name != n || h.Owner != l.Owner() || h.Token != l.Token() || h.Identity() != "inspected" {
		t.Fatalf("Holder = %+v (identity %q), want owner %q, token %d, identity inspected", h, h.Identity(), l.Owner(), l.Token())
	}
	if h.Remaining < 0 || h.Remaining > l.TTL() {
		t.Fatalf("Holder.Remaining = %v, want within [0, %v]", h.Remaining, l.TTL())
	}
	if err := l.Release(ctxT(t)); err != nil {
		t.Fatal(err)
	}
	if _, err := in.Holder(ctxT(t), n); !errors.Is(err, lease.ErrNotHeld) {
		t.Fatalf("Holder after release = %v, want ErrNotHeld", err)
	}
}

func testRun(t *testing.T, s *suite) {
	m := newManager(t, s.backend(), s.long)
	other := newManager(t, s.connect(), s.long)
	n := name(t)
	var (
		ran   bool
		token fence.Token
	)
	boom := errors.New("the job failed")
	err := m.Run(ctxT(t), n, func(ctx context.Context, l *lease.Lease) error {
		ran, token = true, l.Token()
		if tok, ok := fence.FromContext(ctx); !ok || tok != l.Token() {
			t.Errorf("the work's context carries token %d, %v; want %d", tok, ok, l.Token())
		}
		if _, err := other.TryAcquire(ctxT(t), n); !errors.Is(err, lease.ErrNotAcquired) {
			t.Errorf("another holder got the lease while Run's work ran: %v", err)
		}
		if err := other.TryRun(ctxT(t), n, func(context.Context, *lease.Lease) error {
			t.Error("TryRun ran its function while the lease was held")
			return nil
		}); !errors.Is(err, lease.ErrNotAcquired) {
			t.Errorf("TryRun of a held lease = %v, want ErrNotAcquired", err)
		}
		return boom
	})
	if !ran || token == fence.None {
		t.Fatal("Run did not run the work with a token")
	}
	if !errors.Is(err, boom) || errors.Is(err, lease.ErrLost) {
		t.Fatalf("Run = %v, want the work's error alone", err)
	}
	// Released: another holder gets it at once, with a newer token.
	l, err := other.TryAcquire(ctxT(t), n)
	if err != nil {
		t.Fatalf("the lease was not released after Run: %v", err)
	}
	if l.Token() <= token {
		t.Fatalf("token %d after Run's %d", l.Token(), token)
	}
	_ = l.Release(ctxT(t))
	// The caller's context ends the work.
	ctx, cancel := context.WithCancel(ctxT(t))
	err = m.Run(ctx, n, func(ctx context.Context, _ *lease.Lease) error {
		cancel()
		<-ctx.Done()
		return ctx.Err()
	})
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("Run whose caller cancelled = %v, want context.Canceled", err)
	}
}

func testRunLost(t *testing.T, s *suite) {
	m := newManager(t, s.backend(), s.short, lease.WithoutAutoRenew())
	n := name(t)
	var workErr error
	err := m.Run(ctxT(t), n, func(ctx context.Context, l *lease.Lease) error {
		select {
		case <-ctx.Done(): // nobody renews: lost at the deadline
			workErr = context.Cause(ctx)
			return nil
		case <-time.After(s.short + 10*time.Second):
			return errors.New("the work's context did not end when the lease was lost")
		}
	})
	var le *lease.LostError
	if !errors.As(err, &le) || le.Reason != lease.LostExpired {
		t.Fatalf("Run of work that outlived its lease = %v, want a LostError (expired)", err)
	}
	if !errors.Is(workErr, lease.ErrLost) {
		t.Fatalf("the work's context cause = %v, want ErrLost", workErr)
	}
}

func testElection(t *testing.T, s *suite) {
	n := name(t)
	type term struct {
		who   string
		token fence.Token
	}
	var (
		mu    sync.Mutex
		terms []term
	)
	ctx, cancel := context.WithCancel(ctxT(t))
	defer cancel()
	elections := map[string]*lease.Election{}
	var wg sync.WaitGroup
	for _, who := range []string{"a", "b"} {
		m := newManager(t, s.connect(), s.long, lease.WithIdentity(who), lease.WithPollInterval(50*time.Millisecond))
		e, err := lease.NewElection(m, n, lease.WithBackoff(10*time.Millisecond, 50*time.Millisecond))
		if err != nil {
			t.Fatal(err)
		}
		elections[who] = e
		wg.Add(1)
		go func() {
			defer wg.Done()
			err := e.Run(ctx, func(ctx context.Context, l *lease.Lease) error {
				mu.Lock()
				terms = append(terms, term{who, l.Token()})
				mu.Unlock()
				<-ctx.Done()
				return nil
			})
			if !errors.Is(err, context.Canceled) {
				t.Errorf("%s: Run = %v, want context.Canceled", who, err)
			}
		}()
	}
	waitTerms := func(k int) []term {
		deadline := time.Now().Add(s.long + 10*time.Second)
		for time.Now().Before(deadline) {
			mu.Lock()
			got := append([]term(nil), terms...)
			mu.Unlock()
			if len(got) >= k {
				return got
			}
			time.Sleep(5 * time.Millisecond)
		}
		t.Fatalf("fewer than %d terms", k)
		return nil
	}
	first := waitTerms(1)[0]
	leader := elections[first.who]
	if l := leader.Lease(); l == nil || l.Token() != first.token {
		t.Fatalf("the leader's Election.Lease() = %v, want its term's lease", l)
	}
	if h, err := leader.Leader(ctxT(t)); err == nil {
		if h.Identity() != first.who || h.Token != first.token {
			t.Errorf("Leader() = %+v, want %s with token %d", h, first.who, first.token)
		}
	} else if !errors.Is(err, errors.ErrUnsupported) {
		t.Errorf("Leader(): %v", err)
	}
	// Hand over by resigning, a few times; tokens grow term after term and
	// no two terms overlap (each work waits for its context to end).
	for k := 2; k <= 4; k++ {
		mu.Lock()
		cur := terms[len(terms)-1]
		mu.Unlock()
		if err := elections[cur.who].Resign(ctxT(t)); err != nil {
			t.Fatalf("Resign: %v", err)
		}
		got := waitTerms(k)
		if got[k-1].token <= got[k-2].token {
			t.Fatalf("term %d has token %d after %d", k, got[k-1].token, got[k-2].token)
		}
	}
	cancel()
	wg.Wait()
}

// LateTimerSlack is how late, by default, a lease's context may be
// cancelled after its local deadline in the checks of CheckLostByDeadline:
// the Manager's timer fires at the deadline, but on a loaded machine (two
// cores running a three-node ensemble under the race detector) the Go
// runtime runs it tens of milliseconds late. The bound still catches a
// lease that ends only when its store's error arrives (a TCP timeout, a
// session expiry: seconds).
const LateTimerSlack = 250 * time.Millisecond

// CheckLostByDeadline checks a lease l that was lost because its store
// stopped answering, after the store last confirmed a request sent at
// lastSent (RenewedEvent.Sent), with the Manager's safety margin margin:
//
//   - its local deadline is no later than lastSent + l.TTL() - margin (the
//     lease package's rule, exact: no timing involved);
//   - from that deadline on, l.Err and l.Context().Err report it lost (they
//     read the clock, whenever the cancellation runs);
//   - Done closed (at doneAt, read by the caller when it returned) no
//     earlier than half the margin before the deadline (the Manager's most
//     for a large group) and no more than slack after it (LateTimerSlack is
//     a generous default).
//
// It reports each failure with t.Errorf and returns false if any.
func CheckLostByDeadline(t testing.TB, l *lease.Lease, lastSent, doneAt time.Time, margin, slack time.Duration) bool {
	t.Helper()
	ok := true
	want := lastSent.Add(l.TTL() - margin)
	dl := l.Deadline()
	if dl.After(want) {
		t.Errorf("%s: local deadline %v after the last confirmed send + TTL %v - safety margin %v", l.Name(), dl.Sub(want), l.TTL(), margin)
		ok = false
	}
	if early := dl.Sub(doneAt); early > margin/2 {
		// The Manager may serve a large group of deadlines early, by at
		// most half the margin; a store that stopped answering pushes
		// nothing.
		t.Errorf("%s: Done closed %v before the local deadline", l.Name(), early)
		ok = false
	}
	if err := l.Err(); !errors.Is(err, lease.ErrLost) {
		t.Errorf("%s: Err past the local deadline = %v, want ErrLost", l.Name(), err)
		ok = false
	}
	if l.Context().Err() == nil {
		t.Errorf("%s: the lease's context is not done past its local deadline", l.Name())
		ok = false
	}
	if late := doneAt.Sub(dl); late > slack {
		t.Errorf("%s: Done closed %v after the local deadline (last confirmed send + TTL %v - safety margin %v); allowed %v for a late timer", l.Name(), late, l.TTL(), margin, slack)
		ok = false
	}
	return ok
}

// testObserve: a follower that does not campaign hears of each leader, in
// order, once per change, over its own connection.
func testObserve(t *testing.T, s *suite) {
	_, ok := s.backend().(driver.Inspector)
	s.need(t, Inspect, ok)
	n := name(t)
	follower := newManager(t, s.connect(), s.long, lease.WithPollInterval(20*time.Millisecond))
	e, err := lease.NewElection(follower, n)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(ctxT(t))
	defer cancel()
	reports := make(chan lease.Holder, 64)
	done := make(chan error, 1)
	go func() {
		done <- e.Observe(ctx, func(h lease.Holder) { reports <- h })
	}()
	// next returns the next report, failing the test when none comes.
	next := func(what string) lease.Holder {
		t.Helper()
		select {
		case h := <-reports:
			return h
		case <-time.After(s.long + 10*time.Second):
			t.Fatalf("no report of %s", what)
			return lease.Holder{}
		}
	}
	if h := next("the free lease"); h.Owner != "" || h.Token != fence.None {
		t.Fatalf("first report %+v, want no leader", h)
	}
	for _, who := range []string{"a", "b"} {
		l, err := newManager(t, s.connect(), s.long, lease.WithIdentity(who)).TryAcquire(ctxT(t), n)
		if err != nil {
			t.Fatal(err)
		}
		h := next("leader " + who)
		if h.Owner == "" { // the "no one" between two leaders
			h = next("leader " + who)
		}
		if h.Name != n || h.Owner != l.Owner() || h.Token != l.Token() || h.Identity() != who {
			t.Fatalf("report %+v, want leader %s (owner %q, token %d)", h, who, l.Owner(), l.Token())
		}
		if err := l.Release(ctxT(t)); err != nil {
			t.Fatal(err)
		}
	}
	if h := next("the end of the last term"); h.Owner != "" {
		t.Fatalf("report %+v after the last release, want no leader", h)
	}
	cancel()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Fatalf("Observe = %v, want context.Canceled", err)
	}
	close(reports)
	for h := range reports {
		t.Fatalf("report %+v after nothing changed", h)
	}
}

// testRefusalNamesHolder: a blocking Acquire that gives up names the
// current holder (owner and token) in its error; a refused TryAcquire names
// it only if the backend's refusal carried it (it costs no extra request),
// and then correctly.
func testRefusalNamesHolder(t *testing.T, s *suite) {
	_, ok := s.backend().(driver.Inspector)
	s.need(t, Inspect, ok)
	n := name(t)
	l, err := newManager(t, s.connect(), s.long, lease.WithIdentity("holder")).TryAcquire(ctxT(t), n)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Release(ctxT(t))
	m := newManager(t, s.connect(), s.long, lease.WithIdentity("waiter"))
	check := func(what string, err error) {
		t.Helper()
		var na *driver.NotAcquiredError
		if !errors.As(err, &na) || na.Holder.Owner != l.Owner() || na.Holder.Token != l.Token() {
			t.Fatalf("%s = %v; want a NotAcquiredError naming owner %q, token %d", what, err, l.Owner(), l.Token())
		}
		if !strings.Contains(err.Error(), l.Owner()) || strings.Contains(err.Error(), "\n") {
			t.Fatalf("%s = %q; want one line naming the holder %q", what, err, l.Owner())
		}
	}
	_, err = m.TryAcquire(ctxT(t), n)
	var na *driver.NotAcquiredError
	if !errors.As(err, &na) {
		t.Fatalf("TryAcquire = %v; want a NotAcquiredError", err)
	}
	if na.Holder.Owner != "" {
		check("TryAcquire", err)
	}
	// Long enough for one refusal on a loaded machine: the error names
	// the holder from the store's last refusal even when the attempt in
	// flight at the end is cut short.
	ctx, cancel := context.WithTimeout(ctxT(t), time.Second)
	defer cancel()
	_, err = m.Acquire(ctx, n)
	check("Acquire", err)
}

// testSemaphoreBoundsHolders: a lease.Semaphore over the store admits
// exactly its permits. N permits are granted at once over N connections,
// each on a slot of its own; one more is refused; a released slot goes to
// the next holder with a greater token. Then workers over two connections
// take permits in turns: never more than N hold one at once, no slot has
// two holders, and each slot's tokens grow strictly in grant order. It
// needs nothing beyond Backend (a backend without Watcher is polled).
func testSemaphoreBoundsHolders(t *testing.T, s *suite) {
	const permits, workers, rounds = 2, 6, 2
	n := name(t)
	poll := lease.WithPollInterval(20 * time.Millisecond) // for backends without Watcher
	ctx := ctxT(t)
	var sems []*lease.Semaphore
	for i := range permits + 1 {
		b := s.connect()
		if i == 0 {
			b = s.backend()
		}
		sem, err := lease.NewSemaphore(newManager(t, b, s.long, poll), n, permits)
		if err != nil {
			t.Fatalf("NewSemaphore: %v", err)
		}
		sems = append(sems, sem)
	}
	slots := sems[0].Slots()

	// Full: each permit on a slot of its own, and no more.
	held := map[string]*lease.Lease{}
	for i := range permits {
		l, err := sems[i].TryAcquire(ctx)
		if err != nil {
			t.Fatalf("TryAcquire of permit %d of %d: %v", i+1, permits, err)
		}
		if !slices.Contains(slots, l.Name()) || held[l.Name()] != nil {
			t.Fatalf("permit %d granted on %q; slots %q, held %v", i+1, l.Name(), slots, held)
		}
		held[l.Name()] = l
	}
	if l, err := sems[permits].TryAcquire(ctx); !errors.Is(err, lease.ErrNotAcquired) {
		if l != nil {
			_ = l.Release(ctx)
		}
		t.Fatalf("TryAcquire of a full semaphore = %v (permit %v), want ErrNotAcquired", err, l)
	}
	freed := held[slots[1]]
	if err := freed.Release(ctx); err != nil {
		t.Fatalf("Release: %v", err)
	}
	next, err := sems[permits].TryAcquire(ctx)
	if err != nil {
		t.Fatalf("TryAcquire after a permit was released: %v", err)
	}
	if next.Name() != freed.Name() || next.Token() <= freed.Token() {
		t.Fatalf("after %q (token %d) was released, got %q token %d; want that slot with a greater token", freed.Name(), freed.Token(), next.Name(), next.Token())
	}
	last := map[string]fence.Token{slots[0]: held[slots[0]].Token(), slots[1]: next.Token()}
	for _, l := range []*lease.Lease{held[slots[0]], next} {
		if err := l.Release(ctx); err != nil {
			t.Fatalf("Release: %v", err)
		}
	}

	// Contention over two connections.
	var (
		mu      sync.Mutex
		holding = map[string]int{}
		grants  int
		failure error
	)
	fail := func(err error) {
		mu.Lock()
		failure = errors.Join(failure, err)
		mu.Unlock()
	}
	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			sem := sems[w%2]
			for range rounds {
				l, err := sem.Acquire(ctx)
				if err != nil {
					fail(fmt.Errorf("worker %d: Acquire: %w", w, err))
					return
				}
				mu.Lock()
				if other, ok := holding[l.Name()]; ok {
					failure = errors.Join(failure, fmt.Errorf("worker %d granted %q (token %d) while worker %d holds it", w, l.Name(), l.Token(), other))
				}
				if len(holding) >= permits {
					failure = errors.Join(failure, fmt.Errorf("worker %d granted %q while %d permits are held, the semaphore has %d", w, l.Name(), len(holding), permits))
				}
				if l.Token() <= last[l.Name()] {
					failure = errors.Join(failure, fmt.Errorf("%q granted token %d after token %d", l.Name(), l.Token(), last[l.Name()]))
				}
				holding[l.Name()], last[l.Name()] = w, l.Token()
				grants++
				mu.Unlock()
				time.Sleep(time.Millisecond)
				if err := l.Err(); err != nil {
					fail(fmt.Errorf("worker %d: permit ended while held: %w", w, err))
				}
				mu.Lock()
				delete(holding, l.Name())
				mu.Unlock()
				if err := l.Release(ctx); err != nil {
					fail(fmt.Errorf("worker %d: Release: %w", w, err))
					return
				}
			}
		})
	}
	wg.Wait()
	if failure != nil {
		t.Fatal(failure)
	}
	if grants != workers*rounds {
		t.Fatalf("%d grants, want %d", grants, workers*rounds)
	}
}
