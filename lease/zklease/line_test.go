package zklease_test

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-zookeeper/zk"

	"github.com/fencekit/fencekit/internal/testkit"
	"github.com/fencekit/fencekit/internal/testkit/zktest"
	"github.com/fencekit/fencekit/lease"
	"github.com/fencekit/fencekit/lease/driver"
	"github.com/fencekit/fencekit/lease/zklease"
)

// The line of waiters (driver.Limits.Queues), on a private ensemble: the
// checks beyond the conformance suite's, on ZooKeeper's own mechanisms
// (place nodes, their server stamps, watches, session expiry).

const lineTTL = 6 * time.Second

func queuedReq(name, owner string, ttl time.Duration) driver.Request {
	return driver.Request{Name: name, Owner: owner, TTL: ttl, Queue: true}
}

// linePlaces returns the owners of the places in name's line, in
// sequence order: the place nodes of the holder queue behind its lowest
// node (which holds the name, a grant or a place the name is kept for).
func linePlaces(t *testing.T, admin adminClient, root, name string) []string {
	t.Helper()
	dir := zklease.ParentPath(root, name)
	kids, _, err := admin.Children(dir)
	if errors.Is(err, zk.ErrNoNode) {
		return nil
	}
	if err != nil {
		t.Fatalf("list %s: %v", dir, err)
	}
	slices.SortFunc(kids, func(a, b string) int {
		return strings.Compare(a[strings.LastIndexByte(a, '-'):], b[strings.LastIndexByte(b, '-'):])
	})
	var owners []string
	for i, k := range kids {
		if i == 0 {
			continue
		}
		data, _, err := admin.Get(dir + "/" + k)
		if errors.Is(err, zk.ErrNoNode) {
			continue
		}
		if err != nil {
			t.Fatalf("get %s/%s: %v", dir, k, err)
		}
		s, isPlace := strings.CutPrefix(string(data), "\x00")
		if !isPlace {
			continue
		}
		_, owner, _ := strings.Cut(s, "\n")
		owners = append(owners, owner)
	}
	return owners
}

func mustRefuse(t *testing.T, b *zklease.Backend, r driver.Request, why string) *driver.NotAcquiredError {
	t.Helper()
	g, err := b.Acquire(testkit.Context(t), r)
	if err == nil {
		t.Fatalf("%s: %q granted token %d, want a refusal", why, r.Owner, g.Token)
	}
	if !errors.Is(err, driver.ErrNotAcquired) {
		t.Fatalf("%s: %q: %v, want ErrNotAcquired", why, r.Owner, err)
	}
	var na *driver.NotAcquiredError
	if !errors.As(err, &na) {
		return &driver.NotAcquiredError{}
	}
	return na
}

// FIFO Managers, each on its own session, waiting behind a holder, get the
// lease in the order they joined; the places are nodes in that order in
// the holder queue, behind the holder's, with no ticket of theirs besides
// (a ticket would stand between the first waiter and the name), the holder's
// release wakes the first waiter through its watch (the poll interval is
// TTL/2), and each grant takes the owner out of the line.
func TestLineManagersInArrivalOrder(t *testing.T) {
	ens := zktest.Shared(t, 1)
	root := zktest.Root(t)
	admin := adminConn(t, ens.Servers())
	ctx := testkit.Context(t)
	const n = "order"
	holder := newBackend(t, ens.Servers(), zklease.WithRoot(root), zklease.WithSessionTimeout(lineTTL))
	h, err := holder.Acquire(ctx, driver.Request{Name: n, Owner: "holder", TTL: lineTTL})
	if err != nil {
		t.Fatal(err)
	}
	const waiters = 4
	var (
		mu     sync.Mutex
		order  []int
		tokens []uint64
		wg     sync.WaitGroup
		bs     []*zklease.Backend
	)
	errs := make(chan error, waiters)
	for i := range waiters {
		b := newBackend(t, ens.Servers(), zklease.WithRoot(root), zklease.WithSessionTimeout(lineTTL))
		bs = append(bs, b)
		m := testkit.NewManager(t, b, lineTTL, lease.WithFIFO(), lease.WithIdentity(fmt.Sprintf("w%d", i)))
		wg.Go(func() {
			l, err := m.Acquire(ctx, n)
			if err != nil {
				errs <- fmt.Errorf("waiter %d: %w", i, err)
				return
			}
			mu.Lock()
			order, tokens = append(order, i), append(tokens, uint64(l.Token()))
			mu.Unlock()
			if err := l.Release(ctx); err != nil {
				errs <- fmt.Errorf("waiter %d: Release: %w", i, err)
			}
		})
		// Wait until waiter i has its place (the line has i+1 places).
		for len(linePlaces(t, admin, root, n)) < i+1 {
			time.Sleep(5 * time.Millisecond)
		}
	}
	places := linePlaces(t, admin, root, n)
	for i, owner := range places {
		if !strings.HasPrefix(owner, fmt.Sprintf("w%d/", i)) {
			t.Fatalf("places in line %v: want w0.. w%d in sequence order", places, waiters-1)
		}
	}
	// Let every waiter subscribe (its Watch follows its first refusal).
	for _, b := range bs {
		for !strings.Contains(b.DebugName(n), "subs 1") {
			time.Sleep(5 * time.Millisecond)
		}
	}
	if kids, _, err := admin.Children(zklease.ParentPath(root, n)); err != nil || len(kids) != 1+waiters {
		t.Fatalf("holder queue %v (%v): want the holder's node and the %d places, no ticket of a queued waiter", kids, err, waiters)
	}
	before := bs[0].Notified()
	released := time.Now()
	if err := holder.Release(ctx, h); err != nil {
		t.Fatal(err)
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	if !slices.Equal(order, []int{0, 1, 2, 3}) {
		t.Fatalf("granted in the order %v, want [0 1 2 3]", order)
	}
	for i := 1; i < len(tokens); i++ {
		if tokens[i] <= tokens[i-1] || tokens[0] <= uint64(h.Token) {
			t.Fatalf("tokens %v after the holder's %d: want them strictly growing", tokens, h.Token)
		}
	}
	if bs[0].Notified() == before {
		t.Fatalf("the first waiter was not woken by a watch (granted after %v)", time.Since(released))
	}
	if p := linePlaces(t, admin, root, n); len(p) != 0 {
		t.Fatalf("places left in line after every waiter was granted: %v", p)
	}
}

// A place ahead lapses by the server's stamps: one whose last write is
// older than its TTL (read from its data) at the stamp of the waiter's own
// write is deleted and passed, when a node before it remains (it is not
// the lowest). A place that is the lowest node holds the name as a grant
// would: a live one keeps it for its owner (Ahead, RetryAfter), and a
// lapsed one is not deleted by another waiter (its owner may hold it
// without knowing yet); it leaves with its backend or its session. The
// ghost places here are written by a plain client, which refreshes or
// stops at will.
func TestLinePlaceLapsesByServerTime(t *testing.T) {
	ens := zktest.Shared(t, 1)
	root := zktest.Root(t)
	admin := adminConn(t, ens.Servers())
	ctx := testkit.Context(t)
	const n = "lapse"
	w := newBackend(t, ens.Servers(), zklease.WithRoot(root), zklease.WithSessionTimeout(lineTTL))
	holder := newBackend(t, ens.Servers(), zklease.WithRoot(root), zklease.WithSessionTimeout(lineTTL))
	h, err := holder.Acquire(ctx, driver.Request{Name: n, Owner: "holder", TTL: lineTTL})
	if err != nil {
		t.Fatal(err)
	}
	dir := zklease.ParentPath(root, n)
	ghostData := func(ttl time.Duration, owner string) []byte {
		return []byte(fmt.Sprintf("\x00%d\n%s", ttl.Milliseconds(), owner))
	}
	ghost, err := admin.Create(dir+"/"+strings.Repeat("0", 32)+"-", ghostData(time.Minute, "ghost"), zk.FlagEphemeralSequential, zk.WorldACL(zk.PermAll))
	if err != nil {
		t.Fatalf("create a place by hand: %v", err)
	}
	live := queuedReq(n, "live", lineTTL)
	mustRefuse(t, w, live, "a waiter behind the holder and a live place")
	if p := linePlaces(t, admin, root, n); !slices.Equal(p, []string{"ghost", "live"}) {
		t.Fatalf("line %v, want [ghost live]", p)
	}
	// The ghost's owner refreshes it with a TTL of 300 ms, then stops.
	if _, err := admin.Set(ghost, ghostData(300*time.Millisecond, "ghost"), -1); err != nil {
		t.Fatal(err)
	}
	time.Sleep(600 * time.Millisecond)
	mustRefuse(t, w, live, "the waiter behind the holder and a lapsed place")
	if ok, _, _ := admin.Exists(ghost); ok {
		t.Fatal("the lapsed place behind the holder is still there")
	}
	if err := holder.Release(ctx, h); err != nil {
		t.Fatal(err)
	}
	g, err := w.Acquire(ctx, live)
	if err != nil {
		t.Fatalf("the waiter after the holder released: %v", err)
	}
	if err := w.Release(ctx, g); err != nil {
		t.Fatal(err)
	}
	// A place at the head of the queue: the name is kept for it.
	head, err := admin.Create(dir+"/"+strings.Repeat("1", 32)+"-", ghostData(time.Minute, "head"), zk.FlagEphemeralSequential, zk.WorldACL(zk.PermAll))
	if err != nil {
		t.Fatalf("create a place by hand: %v", err)
	}
	late := queuedReq(n, "late", lineTTL)
	na := mustRefuse(t, w, late, "a waiter behind a live place, the name free")
	if na.Ahead != 1 || na.RetryAfter <= 0 || na.RetryAfter > time.Minute {
		t.Fatalf("refusal %+v: want Ahead 1 and RetryAfter within the place's 60 s", na)
	}
	if _, err := admin.Set(head, ghostData(300*time.Millisecond, "head"), -1); err != nil {
		t.Fatal(err)
	}
	time.Sleep(600 * time.Millisecond)
	mustRefuse(t, w, late, "a waiter behind a lapsed place at the head")
	if ok, _, _ := admin.Exists(head); !ok {
		t.Fatal("a lapsed place at the head of the queue was deleted by another waiter")
	}
	// Its owner's session ends (here: the client deletes it).
	if err := admin.Delete(head, -1); err != nil {
		t.Fatal(err)
	}
	g, err = w.Acquire(ctx, late)
	if err != nil {
		t.Fatalf("the waiter once the head's place was gone: %v", err)
	}
	if err := w.Release(ctx, g); err != nil {
		t.Fatal(err)
	}
}

// A holder whose session the ensemble expired (its process died) leaves no
// stuck line: the first waiter, watching the holder's node, is granted,
// the one behind it stays refused until then, and after. A waiter whose
// session expired leaves the line at once (its place went with it), long
// before its TTL.
func TestLineAfterSessionExpiry(t *testing.T) {
	ens := zktest.Shared(t, 1)
	root := zktest.Root(t)
	admin := adminConn(t, ens.Servers())
	ctx := testkit.Context(t)
	const n = "expiry"
	newB := func() *zklease.Backend {
		return newBackend(t, ens.Servers(), zklease.WithRoot(root), zklease.WithSessionTimeout(lineTTL))
	}
	holder, w0, w1, w2 := newB(), newB(), newB(), newB()
	h, err := holder.Acquire(ctx, driver.Request{Name: n, Owner: "holder", TTL: lineTTL})
	if err != nil {
		t.Fatal(err)
	}
	r0, r1, r2 := queuedReq(n, "w0", lineTTL), queuedReq(n, "w1", lineTTL), queuedReq(n, "w2", lineTTL)
	mustRefuse(t, w0, r0, "w0 behind the holder")
	mustRefuse(t, w1, r1, "w1 behind w0")
	mustRefuse(t, w2, r2, "w2 behind w1")
	endSession(t, holder)
	var g driver.Grant
	for deadline := time.Now().Add(lineTTL); ; {
		mustRefuse(t, w1, r1, "w1 while w0 is first")
		g, err = w0.Acquire(ctx, r0)
		if err == nil {
			break
		}
		if !errors.Is(err, driver.ErrNotAcquired) || time.Now().After(deadline) {
			t.Fatalf("w0 after the holder's session expired: %v", err)
		}
		time.Sleep(20 * time.Millisecond)
	}
	if g.Token <= h.Token {
		t.Fatalf("w0 granted token %d after the holder's %d", g.Token, h.Token)
	}
	if p := linePlaces(t, admin, root, n); !slices.Equal(p, []string{"w1", "w2"}) {
		t.Fatalf("line after w0's grant: %v, want [w1 w2]", p)
	}
	// w1 dies: its session expires; its place goes at once, not after
	// its TTL (6 s): w2 is first.
	endSession(t, w1)
	if err := w0.Release(ctx, g); err != nil {
		t.Fatal(err)
	}
	g2, err := w2.Acquire(ctx, r2)
	if err != nil {
		t.Fatalf("w2, behind a waiter whose session expired, after the holder released: %v", err)
	}
	if g2.Token <= g.Token {
		t.Fatalf("w2 granted token %d after %d", g2.Token, g.Token)
	}
	if err := w2.Release(ctx, g2); err != nil {
		t.Fatal(err)
	}
}

// Abandon removes the waiter's place at once; the abandoned owner's later
// request neither is granted nor joins the line again; an acquire without
// Queue cannot pass a waiter.
func TestLineAbandonAndUnqueued(t *testing.T) {
	ens := zktest.Shared(t, 1)
	root := zktest.Root(t)
	admin := adminConn(t, ens.Servers())
	ctx := testkit.Context(t)
	const n = "abandon"
	w := newBackend(t, ens.Servers(), zklease.WithRoot(root), zklease.WithSessionTimeout(lineTTL))
	holder := newBackend(t, ens.Servers(), zklease.WithRoot(root), zklease.WithSessionTimeout(lineTTL))
	h, err := holder.Acquire(ctx, driver.Request{Name: n, Owner: "holder", TTL: lineTTL})
	if err != nil {
		t.Fatal(err)
	}
	r := queuedReq(n, "quitter", lineTTL)
	mustRefuse(t, w, r, "behind the holder")
	if p := linePlaces(t, admin, root, n); !slices.Equal(p, []string{"quitter"}) {
		t.Fatalf("line %v, want [quitter]", p)
	}
	if err := w.Abandon(ctx, r); err != nil {
		t.Fatal(err)
	}
	if p := linePlaces(t, admin, root, n); len(p) != 0 {
		t.Fatalf("line after Abandon: %v, want empty", p)
	}
	if err := holder.Release(ctx, h); err != nil {
		t.Fatal(err)
	}
	mustRefuse(t, w, r, "the abandoned owner, the name free")
	if p := linePlaces(t, admin, root, n); len(p) != 0 {
		t.Fatalf("line after the abandoned owner asked again: %v, want empty", p)
	}
	// An acquire without Queue queues behind the waiters too (their
	// places are nodes of the holder queue): the holder's release hands
	// the name to the first waiter at once, whose token is its place's.
	h2, err := holder.Acquire(ctx, driver.Request{Name: n, Owner: "holder-2", TTL: lineTTL})
	if err != nil {
		t.Fatal(err)
	}
	second := queuedReq(n, "second", lineTTL)
	mustRefuse(t, w, second, "a waiter behind holder-2")
	if err := holder.Release(ctx, h2); err != nil {
		t.Fatal(err)
	}
	if g, err := holder.Acquire(ctx, driver.Request{Name: n, Owner: "bypass", TTL: lineTTL}); err == nil {
		t.Fatalf("an acquire without Queue, the holder gone and one waiter in line, was granted token %d", g.Token)
	} else if !errors.Is(err, driver.ErrNotAcquired) {
		t.Fatalf("an acquire without Queue behind a waiter: %v", err)
	}
	g, err := w.Acquire(ctx, second)
	if err != nil {
		t.Fatalf("the waiter after holder-2 released: %v", err)
	}
	if g.Token <= h2.Token {
		t.Fatalf("token %d after holder-2's %d", g.Token, h2.Token)
	}
	_ = w.Release(ctx, g)
}

// The first waiter's grant, once the holder released, is a read: its
// token is the czxid of its place, made when it joined, and the ensemble
// applies no write between the release and the grant (a node created
// before the grant and one created after it have consecutive czxids).
func TestLineHandOffIsARead(t *testing.T) {
	ens := zktest.Start(t, 1, zktest.Config{})
	root := zktest.Root(t)
	admin := adminConn(t, ens.Servers())
	ctx := testkit.Context(t)
	const n = "handoff"
	holder := newBackend(t, ens.Servers(), zklease.WithRoot(root), zklease.WithSessionTimeout(lineTTL))
	w := newBackend(t, ens.Servers(), zklease.WithRoot(root), zklease.WithSessionTimeout(lineTTL))
	h, err := holder.Acquire(ctx, driver.Request{Name: n, Owner: "holder", TTL: lineTTL})
	if err != nil {
		t.Fatal(err)
	}
	r := queuedReq(n, "first", lineTTL)
	mustRefuse(t, w, r, "the waiter behind the holder")
	// The waiter's place: the node behind the holder's.
	var place zk.Stat
	dir := zklease.ParentPath(root, n)
	kids, _, err := admin.Children(dir)
	if err != nil {
		t.Fatal(err)
	}
	slices.SortFunc(kids, func(a, b string) int {
		return strings.Compare(a[strings.LastIndexByte(a, '-'):], b[strings.LastIndexByte(b, '-'):])
	})
	if len(kids) == 2 {
		_, st, err := admin.Exists(dir + "/" + kids[1])
		if err != nil {
			t.Fatal(err)
		}
		place = *st
	}
	if err := holder.Release(ctx, h); err != nil {
		t.Fatal(err)
	}
	marker := func() int64 {
		t.Helper()
		p, err := admin.Create(root+"/marker-", nil, zk.FlagEphemeralSequential, zk.WorldACL(zk.PermAll))
		if err != nil {
			t.Fatal(err)
		}
		_, st, err := admin.Exists(p)
		if err != nil {
			t.Fatal(err)
		}
		return st.Czxid
	}
	before := marker()
	g, err := w.Acquire(ctx, r)
	if err != nil {
		t.Fatalf("the first waiter after the holder released: %v", err)
	}
	after := marker()
	if after != before+1 {
		t.Errorf("the ensemble applied %d writes during the hand-off grant, want none", after-before-1)
	}
	if uint64(g.Token) != uint64(place.Czxid) {
		t.Errorf("granted token %d, want the czxid %d of the waiter's place (holder queue %v)", g.Token, place.Czxid, kids)
	}
	if err := w.Release(ctx, g); err != nil {
		t.Fatal(err)
	}
}

// An acquire without Queue, refused on a backend whose queued waiters are
// subscribed, leaves no ticket in the queue: a ticket becomes a grant only
// through an acquire without Queue, so at the head it would keep the name
// from the queued waiters behind it.
func TestLineUnqueuedLeavesNoTicket(t *testing.T) {
	ens := zktest.Shared(t, 1)
	root := zktest.Root(t)
	ctx := testkit.Context(t)
	const n = "noticket"
	holder := newBackend(t, ens.Servers(), zklease.WithRoot(root), zklease.WithSessionTimeout(lineTTL))
	b := newBackend(t, ens.Servers(), zklease.WithRoot(root), zklease.WithSessionTimeout(lineTTL))
	h, err := holder.Acquire(ctx, driver.Request{Name: n, Owner: "holder", TTL: lineTTL})
	if err != nil {
		t.Fatal(err)
	}
	r1, r2 := queuedReq(n, "w1", lineTTL), queuedReq(n, "w2", lineTTL)
	mustRefuse(t, b, r1, "w1 behind the holder")
	_, stop, err := b.Watch(ctx, n) // as a FIFO Manager's waiter does
	if err != nil {
		t.Fatal(err)
	}
	defer stop()
	mustRefuse(t, b, driver.Request{Name: n, Owner: "try", TTL: lineTTL}, "an acquire without Queue behind the line")
	mustRefuse(t, b, r2, "w2 behind w1")
	if err := holder.Release(ctx, h); err != nil {
		t.Fatal(err)
	}
	g1, err := b.Acquire(ctx, r1)
	if err != nil {
		t.Fatalf("w1 after the holder released: %v", err)
	}
	if err := b.Release(ctx, g1); err != nil {
		t.Fatal(err)
	}
	g2, err := b.Acquire(ctx, r2)
	if err != nil {
		t.Fatalf("w2 after w1 released (%s): %v", b.DebugName(n), err)
	}
	_ = b.Release(ctx, g2)
}

// A waiter recorded as ended by another client (its record made while its
// place waits behind a holder) leaves the line at its next attempt, which
// is refused: the place would otherwise keep the name for no one once it
// heads the queue.
func TestLineEndedWaiterLeaves(t *testing.T) {
	ens := zktest.Shared(t, 1)
	root := zktest.Root(t)
	admin := adminConn(t, ens.Servers())
	ctx := testkit.Context(t)
	const n = "ended"
	holder := newBackend(t, ens.Servers(), zklease.WithRoot(root), zklease.WithSessionTimeout(lineTTL))
	b := newBackend(t, ens.Servers(), zklease.WithRoot(root), zklease.WithSessionTimeout(lineTTL))
	h, err := holder.Acquire(ctx, driver.Request{Name: n, Owner: "holder", TTL: lineTTL})
	if err != nil {
		t.Fatal(err)
	}
	rw, r2 := queuedReq(n, "w", lineTTL), queuedReq(n, "w2", lineTTL)
	mustRefuse(t, b, rw, "w behind the holder")
	mustRefuse(t, b, r2, "w2 behind w")
	// The record, as another client's Abandon of w makes it (the
	// Abandon's deletes of w's nodes have not come yet).
	if _, err := admin.Create(zklease.EndedPath(root, n, "w"), nil, zk.FlagEphemeral, zk.WorldACL(zk.PermAll)); err != nil {
		t.Fatal(err)
	}
	mustRefuse(t, b, rw, "w, ended, behind the holder")
	if p := linePlaces(t, admin, root, n); !slices.Equal(p, []string{"w2"}) {
		t.Fatalf("line after the ended waiter's attempt: %v, want [w2]", p)
	}
	if err := holder.Release(ctx, h); err != nil {
		t.Fatal(err)
	}
	g, err := b.Acquire(ctx, r2)
	if err != nil {
		t.Fatalf("w2 after the holder released, behind an ended waiter: %v", err)
	}
	_ = b.Release(ctx, g)
}

// A subscription made before this Backend saw a queued attempt of the
// name (a FIFO Manager's first attempt failed and its name's state was
// forgotten, then its waiter watched) put a ticket in the holder queue.
// Only an acquire without Queue claims a ticket, so the queued waiter's
// place behind it would be refused for as long as the subscription lasts:
// the queued attempt gives the ticket back.
func TestLineQueuedAttemptDropsWatchTicket(t *testing.T) {
	ens := zktest.Shared(t, 1)
	root := zktest.Root(t)
	ctx := testkit.Context(t)
	const n = "watchticket"
	holder := newBackend(t, ens.Servers(), zklease.WithRoot(root), zklease.WithSessionTimeout(lineTTL))
	b := newBackend(t, ens.Servers(), zklease.WithRoot(root), zklease.WithSessionTimeout(lineTTL))
	h, err := holder.Acquire(ctx, driver.Request{Name: n, Owner: "holder", TTL: lineTTL})
	if err != nil {
		t.Fatal(err)
	}
	_, stop, err := b.Watch(ctx, n) // before any queued attempt on b
	if err != nil {
		t.Fatal(err)
	}
	defer stop()
	r1 := queuedReq(n, "w1", lineTTL)
	mustRefuse(t, b, r1, "w1 behind the holder")
	if err := holder.Release(ctx, h); err != nil {
		t.Fatal(err)
	}
	g1, err := b.Acquire(ctx, r1)
	if err != nil {
		t.Fatalf("w1 after the holder released (%s): %v", b.DebugName(n), err)
	}
	_ = b.Release(ctx, g1)
}
