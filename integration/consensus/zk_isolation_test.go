package consensus

import (
	"sync"
	"testing"
	"time"

	"github.com/fencekit/fencekit/integration/internal/guarded"
	"github.com/fencekit/fencekit/internal/testkit"
	"github.com/fencekit/fencekit/internal/testkit/faultnet"
	"github.com/fencekit/fencekit/internal/zktest"
	"github.com/fencekit/fencekit/lease"
	"github.com/fencekit/fencekit/lease/leasetest"
	"github.com/fencekit/fencekit/lease/zklease"
)

// renewCount records the send time of the last successful renewal, and
// how many there were.
type renewCount struct {
	lease.NopObserver
	mu   sync.Mutex
	last time.Time
	n    int
}

func (r *renewCount) Renewed(e lease.RenewedEvent) {
	if e.Err == nil {
		r.mu.Lock()
		r.last, r.n = e.Sent, r.n+1
		r.mu.Unlock()
	}
}

func (r *renewCount) lastSent() (time.Time, int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.last, r.n
}

// The holder's connection is blackholed (a proxy, in-process, in front of
// the only member the holder can reach): nothing it sends arrives, nothing
// comes back, the TCP connection stays open. Its lease's local deadline is
// the last renewal's send time + TTL - safety margin, and its context is
// cancelled then (within a late timer's slack); another client, on
// the other members, acquires once the ensemble expired the holder's
// session, with a greater token; and the old holder's late writes through
// sqlguard and blobguard are rejected as stale. Three rounds.
func TestIsolatedHolderLosesBeforeExpiryAndIsFenced(t *testing.T) {
	ens := zktest.Start(t, 3, zktest.Config{})
	const ttl = 3 * time.Second
	for round := range 3 {
		name := "isolated"
		root := zktest.Root(t)
		fs := newResource(t)

		proxy := faultnet.StartProxy(t, ens.Members[0].Addr(), nil)
		log := &renewCount{}
		holderB := newZKBackend(t, []string{proxy.Addr}, zklease.WithRoot(root), zklease.WithSessionTimeout(ttl))
		holder := testkit.NewManager(t, holderB, ttl, lease.WithObserver(log))
		otherB := newZKBackend(t, []string{ens.Members[1].Addr(), ens.Members[2].Addr()}, zklease.WithRoot(root), zklease.WithSessionTimeout(ttl))
		other := testkit.NewManager(t, otherB, ttl, lease.WithPollInterval(10*time.Second))

		ctx := testkit.Context(t)
		l, err := holder.TryAcquire(ctx, name)
		if err != nil {
			t.Fatalf("holder: %v", err)
		}
		// The holder writes while it holds the lease.
		if err := guarded.WriteRow(ctx, fs, "A", l.Token()); err != nil {
			t.Fatalf("A's first row write: %v", err)
		}
		if err := guarded.WriteObject(ctx, fs, "A", l.Token()); err != nil {
			t.Fatalf("A's first object write: %v", err)
		}
		type got struct {
			l   *lease.Lease
			at  time.Time
			err error
		}
		otherGot := make(chan got, 1)
		go func() {
			l, err := other.Acquire(ctx, name)
			otherGot <- got{l, time.Now(), err}
		}()
		for {
			if _, n := log.lastSent(); n >= 2 {
				break
			}
			time.Sleep(20 * time.Millisecond)
		}

		blackholed := time.Now()
		proxy.Blackhole()
		select {
		case <-l.Done():
		case <-time.After(3 * ttl):
			t.Fatalf("round %d: the isolated holder's lease was not lost within 3 TTLs", round)
		}
		lostAt := time.Now()
		lastSent, _ := log.lastSent()
		if !leasetest.CheckLostByDeadline(t, l, lastSent, lostAt, holder.Options().SafetyMargin, leasetest.LateTimerSlack) {
			t.Fatalf("round %d: the isolated holder's lease did not end by its local deadline", round)
		}
		var g got
		select {
		case g = <-otherGot:
		case <-time.After(4 * ttl):
			t.Fatalf("round %d: the other client did not acquire within 4 TTLs of the blackhole", round)
		}
		if g.err != nil {
			t.Fatalf("round %d: other's Acquire: %v", round, g.err)
		}
		// The claim: the other client is granted the lease only after the
		// holder's local deadline. Compare with that deadline, which is
		// exact, not with lostAt, when this goroutine saw Done (up to
		// LateTimerSlack after the deadline): a correct grant may come in
		// between. g.at is read after the grant, so g.at at or before the
		// deadline proves a grant before it.
		if dl := l.Deadline(); !g.at.After(dl) {
			t.Fatalf("round %d: the other client acquired %v before the holder's local deadline", round, dl.Sub(g.at))
		}
		if g.l.Token() <= l.Token() {
			t.Fatalf("round %d: token %d after %d", round, g.l.Token(), l.Token())
		}
		// The new holder writes; the old one, unaware, writes after it.
		if err := guarded.WriteRow(ctx, fs, "B", g.l.Token()); err != nil {
			t.Fatalf("B's row write: %v", err)
		}
		if err := guarded.WriteObject(ctx, fs, "B", g.l.Token()); err != nil {
			t.Fatalf("B's object write: %v", err)
		}
		requireStale(t, "A's late row write", guarded.WriteRow(ctx, fs, "A", l.Token()))
		requireStale(t, "A's late object write", guarded.WriteObject(ctx, fs, "A", l.Token()))
		if rowBy, rowTok, objBy, objTok := stored(t, fs); rowBy != "B" || rowTok != g.l.Token() || objBy != "B" || objTok != g.l.Token() {
			t.Fatalf("stored: row by %q (%d), object by %q (%d); want B's with token %d", rowBy, rowTok, objBy, objTok, g.l.Token())
		}
		t.Logf("round %d: blackholed %v after the last renewal was sent; holder lost its lease %v after the blackhole (%v before send + TTL); the other client acquired %v after the loss (%v after the blackhole)",
			round, blackholed.Sub(lastSent).Round(time.Millisecond), lostAt.Sub(blackholed).Round(time.Millisecond), lastSent.Add(ttl).Sub(lostAt).Round(time.Millisecond),
			g.at.Sub(lostAt).Round(time.Millisecond), g.at.Sub(blackholed).Round(time.Millisecond))

		// Heal: the holder's client reconnects, finds its session expired
		// and opens a new one; Release reports the lease lost.
		proxy.Restore()
		if err := l.Release(ctx); err == nil {
			t.Fatalf("round %d: Release of the lost lease returned nil", round)
		}
		if err := g.l.Release(ctx); err != nil {
			t.Fatalf("round %d: B's Release: %v", round, err)
		}
		_ = holderB.Close()
		proxy.Close()
	}
}
