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
// CheckLostByDeadline and CheckReleaseReplyLost serve a backend's own
// fault tests. The first (a store that stopped answering) checks a lost
// lease's deadline by the rule and allows for a late timer; the second
// (a release applied, its reply lost, the request sent again) checks that
// the release is a release, through a fault the backend's tests set up
// in the store's protocol (ReplyFault).
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
	"fmt"
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

func newManager(t *testing.T, b lease.Backend, ttl time.Duration, opts ...lease.Option) *lease.Manager {
	t.Helper()
	m, err := lease.NewManager(b, ttl, opts...)
	if err != nil {
		t.Fatalf("NewManager: %v", err)
	}
	return m
}
