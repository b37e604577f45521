package zklease_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fencekit/fencekit/fence"
	"github.com/fencekit/fencekit/internal/testkit"
	"github.com/fencekit/fencekit/internal/testkit/zktest"
	"github.com/fencekit/fencekit/lease"
	"github.com/fencekit/fencekit/lease/leasetest"
	"github.com/fencekit/fencekit/lease/zklease"
)

// overlapChecker fails when two holders of one lease overlap, or when a
// grant's token is not greater than the one before it. Holders call enter
// right after their grant and leave right before their release.
type overlapChecker struct {
	mu      sync.Mutex
	holder  string
	last    fence.Token
	grants  int
	failure error
}

func (c *overlapChecker) enter(who string, tok fence.Token) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.holder != "" {
		c.failure = errors.Join(c.failure, fmt.Errorf("%s granted token %d while %s holds the lease", who, tok, c.holder))
	}
	if tok <= c.last {
		c.failure = errors.Join(c.failure, fmt.Errorf("%s granted token %d after token %d", who, tok, c.last))
	}
	c.holder, c.last = who, tok
	c.grants++
}

func (c *overlapChecker) leave() {
	c.mu.Lock()
	c.holder = ""
	c.mu.Unlock()
}

func (c *overlapChecker) fail(err error) {
	c.mu.Lock()
	c.failure = errors.Join(c.failure, err)
	c.mu.Unlock()
}

func (c *overlapChecker) err() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.failure
}

// Exclusivity under contention from clients connected to different members:
// one backend (session) per member, three workers on each, taking the same
// lease in turns with blocking Acquire. The checker sees every grant.
func TestExclusiveAcrossMembers(t *testing.T) {
	ens := zktest.Start(t, 3, zktest.Config{})
	root := zktest.Root(t)
	const ttl = 4 * time.Second
	var managers []*lease.Manager
	for _, m := range ens.Members {
		b := newBackend(t, []string{m.Addr()}, zklease.WithRoot(root), zklease.WithSessionTimeout(ttl))
		// Polling is off (10 s): only watches can hand the lease over.
		managers = append(managers, testkit.NewManager(t, b, ttl, lease.WithPollInterval(10*time.Second)))
	}
	const perMember, rounds = 3, 8
	var chk overlapChecker
	ctx := testkit.Context(t)
	var wg sync.WaitGroup
	for i, m := range managers {
		for w := range perMember {
			who := fmt.Sprintf("member%d/worker%d", i+1, w)
			wg.Add(1)
			go func() {
				defer wg.Done()
				for range rounds {
					l, err := m.Acquire(ctx, "contended")
					if err != nil {
						chk.fail(fmt.Errorf("%s: Acquire: %w", who, err))
						return
					}
					chk.enter(who, l.Token())
					time.Sleep(2 * time.Millisecond)
					if err := l.Err(); err != nil {
						chk.fail(fmt.Errorf("%s: lease ended while held: %w", who, err))
					}
					chk.leave()
					if err := l.Release(ctx); err != nil {
						chk.fail(fmt.Errorf("%s: Release: %w", who, err))
						return
					}
				}
			}()
		}
	}
	wg.Wait()
	if err := chk.err(); err != nil {
		t.Fatal(err)
	}
	if want := len(managers) * perMember * rounds; chk.grants != want {
		t.Fatalf("%d grants, want %d", chk.grants, want)
	}
}

// The leader is killed while a lease is held and two clients wait for it,
// each on another member. No two holders overlap, the holder's session
// survives the failover (its lease stays valid), the holder releases once
// the ensemble has a new leader, and the waiters then acquire in turn with
// tokens greater than every token before the kill (a new epoch). Three
// rounds, each killing the current leader; the killed member is started
// again before the next.
func TestLeaderKilledWhileHeld(t *testing.T) {
	ens := zktest.Start(t, 3, zktest.Config{})
	root := zktest.Root(t)
	const ttl = 6 * time.Second
	for round := range 3 {
		name := fmt.Sprintf("failover-%d", round)
		leader := ens.Leader(10 * time.Second)
		var others []*zktest.Member
		for _, m := range ens.Members {
			if m != leader {
				others = append(others, m)
			}
		}
		// The holder is connected to the leader (its connection dies with
		// it); the waiters to the other two members.
		// go-zookeeper shuffles its servers: a dialer refuses the other
		// members until the holder is connected to the leader.
		var pinned atomic.Bool
		pinned.Store(true)
		dial := func(network, addr string, timeout time.Duration) (net.Conn, error) {
			if pinned.Load() && addr != leader.Addr() {
				return nil, errors.New("test: connecting to the leader first")
			}
			return net.DialTimeout(network, addr, timeout)
		}
		holderB := newBackend(t, ens.Servers(), zklease.WithRoot(root), zklease.WithSessionTimeout(ttl), zklease.WithDialer(dial))
		holderM := testkit.NewManager(t, holderB, ttl)
		var chk overlapChecker
		ctx := testkit.Context(t)
		h, err := holderM.TryAcquire(ctx, name)
		if err != nil {
			t.Fatalf("round %d: holder: %v", round, err)
		}
		chk.enter("holder", h.Token())
		if _, id := holderB.Session(); id == 0 {
			t.Fatal("no session")
		}
		if srv, _, _ := holderB.SessionCredentials(); srv != leader.Addr() {
			t.Fatalf("round %d: the holder connected to %s, not the leader %s", round, srv, leader.Addr())
		}
		pinned.Store(false)

		type acquired struct {
			who string
			l   *lease.Lease
			at  time.Time
			err error
		}
		got := make(chan acquired, 2)
		for i, m := range others {
			b := newBackend(t, []string{m.Addr()}, zklease.WithRoot(root), zklease.WithSessionTimeout(ttl))
			wm := testkit.NewManager(t, b, ttl, lease.WithPollInterval(10*time.Second))
			who := fmt.Sprintf("waiter%d", i+1)
			go func() {
				l, err := wm.Acquire(ctx, name)
				got <- acquired{who, l, time.Now(), err}
			}()
		}
		time.Sleep(300 * time.Millisecond) // both waiters queued

		killed := time.Now()
		leader.Kill()
		newLeader := ens.Leader(30 * time.Second)
		elected := time.Since(killed)
		if err := h.Err(); err != nil {
			t.Fatalf("round %d: the holder's lease ended across the failover (its session should have moved): %v", round, err)
		}
		chk.leave()
		if err := h.Release(ctx); err != nil {
			t.Fatalf("round %d: holder's Release after the failover: %v", round, err)
		}
		released := time.Since(killed)
		var first time.Duration
		for i := range 2 {
			var a acquired
			select {
			case a = <-got:
			case <-time.After(30 * time.Second):
				t.Fatalf("round %d: waiter %d did not acquire within 30s of the release", round, i+1)
			}
			if a.err != nil {
				t.Fatalf("round %d: %s: %v", round, a.who, a.err)
			}
			chk.enter(a.who, a.l.Token())
			if i == 0 {
				first = a.at.Sub(killed)
			}
			chk.leave()
			if err := a.l.Release(ctx); err != nil {
				t.Fatalf("round %d: %s: Release: %v", round, a.who, err)
			}
		}
		// A grant whose node is created after the failover carries the new
		// epoch. (The waiters' nodes were queued before the kill: their
		// tokens are greater than the holder's, in its epoch.)
		l, err := holderM.TryAcquire(ctx, name)
		if err != nil {
			t.Fatalf("round %d: TryAcquire after the failover: %v", round, err)
		}
		chk.enter("after", l.Token())
		chk.leave()
		if epoch(l.Token()) <= epoch(h.Token()) {
			t.Errorf("round %d: token %#x granted after the failover is of epoch %d, not later than the holder's %#x (epoch %d)",
				round, uint64(l.Token()), epoch(l.Token()), uint64(h.Token()), epoch(h.Token()))
		}
		if err := l.Release(ctx); err != nil {
			t.Fatal(err)
		}
		if err := chk.err(); err != nil {
			t.Fatalf("round %d: %v", round, err)
		}
		t.Logf("round %d: leader %d killed; member %d leads after %v; holder released %v after the kill; first waiter acquired %v after the kill",
			round, leader.ID, newLeader.ID, elected.Round(time.Millisecond), released.Round(time.Millisecond), first.Round(time.Millisecond))
		leader.Start()
		ens.WaitReady(60 * time.Second)
	}
}

// epoch is the ZooKeeper epoch in a czxid token (its high 32 bits).
func epoch(t fence.Token) uint64 { return uint64(t) >> 32 }

// The whole ensemble restarted: tokens granted afterwards are greater than
// every token granted before, for the same names, through the backend that
// was connected across the restart and through a new one.
func TestTokensGrowAcrossEnsembleRestart(t *testing.T) {
	ens := zktest.Start(t, 3, zktest.Config{})
	root := zktest.Root(t)
	const ttl = 4 * time.Second
	b := newBackend(t, ens.Servers(), zklease.WithRoot(root), zklease.WithSessionTimeout(ttl))
	m := testkit.NewManager(t, b, ttl)
	names := []string{"restart-a", "restart-b", "restart/c"}
	var before fence.Token
	for range 3 {
		for _, n := range names {
			l, err := m.TryAcquire(testkit.Context(t), n)
			if err != nil {
				t.Fatalf("TryAcquire(%q): %v", n, err)
			}
			before = max(before, l.Token())
			if err := l.Release(testkit.Context(t)); err != nil {
				t.Fatal(err)
			}
		}
	}
	for restart := range 2 {
		ens.Restart()
		fresh := testkit.NewManager(t, newBackend(t, ens.Servers(), zklease.WithRoot(root), zklease.WithSessionTimeout(ttl)), ttl)
		after := before
		for _, mgr := range []*lease.Manager{m, fresh} {
			for _, n := range names {
				l := acquireEventually(t, mgr, n)
				if l.Token() <= before {
					t.Errorf("restart %d: %q: token %#x after the restart is not greater than %#x before it", restart, n, uint64(l.Token()), uint64(before))
				}
				after = max(after, l.Token())
				if err := l.Release(testkit.Context(t)); err != nil {
					t.Fatal(err)
				}
			}
		}
		t.Logf("restart %d: tokens up to %#x (epoch %d) before, up to %#x (epoch %d) after", restart, uint64(before), epoch(before), uint64(after), epoch(after))
		before = after
	}
}

// acquireEventually retries while a restarted ensemble settles.
func acquireEventually(t *testing.T, m *lease.Manager, name string) *lease.Lease {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	l, err := m.Acquire(ctx, name)
	if err != nil {
		t.Fatalf("Acquire(%q) after the restart: %v", name, err)
	}
	return l
}

// The leader is killed together with the only way its holder has to the
// ensemble (the holder knows no other member): the holder cannot reconnect,
// its lease is lost at its local deadline, the new leader expires its
// session, and a waiter on another member acquires after the loss, with a
// greater token. Two rounds.
func TestLeaderKilledWithItsHolder(t *testing.T) {
	ens := zktest.Start(t, 3, zktest.Config{})
	root := zktest.Root(t)
	const ttl = 3 * time.Second
	for round := range 2 {
		name := fmt.Sprintf("leader-and-holder-%d", round)
		leader := ens.Leader(10 * time.Second)
		var other *zktest.Member
		for _, m := range ens.Members {
			if m != leader {
				other = m
				break
			}
		}
		log := &testkit.RenewEvents{}
		holder := testkit.NewManager(t, newBackend(t, []string{leader.Addr()}, zklease.WithRoot(root), zklease.WithSessionTimeout(ttl)), ttl, lease.WithObserver(log))
		wb := watchedBackend{Backend: newBackend(t, []string{other.Addr()}, zklease.WithRoot(root), zklease.WithSessionTimeout(ttl)), watched: make(chan string, 1)}
		waiter := testkit.NewManager(t, wb, ttl, lease.WithPollInterval(10*time.Second))
		ctx := testkit.Context(t)
		h, err := holder.TryAcquire(ctx, name)
		if err != nil {
			t.Fatalf("round %d: holder: %v", round, err)
		}
		gotCh := testkit.AcquireAsync(ctx, waiter, name)
		for {
			if _, n := log.LastSucceeded(); n >= 1 {
				break
			}
			time.Sleep(20 * time.Millisecond)
		}
		// The waiter is queued (its Watch returned: its ticket is behind
		// the holder's node, which it watches) before the kill, however
		// slowly it ran.
		select {
		case <-wb.watched:
		case <-time.After(30 * time.Second):
			t.Fatalf("round %d: the waiter did not queue within 30s", round)
		}
		killed := time.Now()
		leader.Kill()
		select {
		case <-h.Done():
		case <-time.After(3 * ttl):
			t.Fatalf("round %d: the holder's lease was not lost within 3 TTLs of losing its only member", round)
		}
		lostAt := time.Now()
		lastSent, _ := log.LastSucceeded()
		if !leasetest.CheckLostByDeadline(t, h, lastSent, lostAt, holder.Options().SafetyMargin, leasetest.LateTimerSlack) {
			t.Fatalf("round %d: the holder's lease did not end by its local deadline", round)
		}
		g := testkit.ExpectTakeover(t, fmt.Sprintf("round %d: the waiter", round), h, gotCh, 30*time.Second)
		t.Logf("round %d: leader %d killed with its holder; the holder lost its lease %v after the kill (%v before send + TTL); the waiter acquired %v after the kill, %v after the holder's loss",
			round, leader.ID, lostAt.Sub(killed).Round(time.Millisecond), lastSent.Add(ttl).Sub(lostAt).Round(time.Millisecond),
			g.At.Sub(killed).Round(time.Millisecond), g.At.Sub(lostAt).Round(time.Millisecond))
		if err := g.Lease.Release(ctx); err != nil {
			t.Fatal(err)
		}
		leader.Start()
		ens.WaitReady(60 * time.Second)
	}
}
