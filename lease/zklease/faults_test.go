package zklease_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/fencekit/fencekit/internal/testkit"
	"github.com/fencekit/fencekit/internal/testkit/faultnet"
	"github.com/fencekit/fencekit/internal/testkit/zktest"
	"github.com/fencekit/fencekit/lease"
	"github.com/fencekit/fencekit/lease/zklease"
)

// watchedBackend tells, on watched (buffered), that a Watch of its Backend
// returned: by then the backend's ticket is in the queue and its
// predecessor is watched (Watch's contract). A signal nobody took yet is
// not repeated, so that a Watch never blocks on the test. Every other
// method is the Backend's own.
type watchedBackend struct {
	*zklease.Backend
	watched chan string
}

func (w watchedBackend) Watch(ctx context.Context, name string) (<-chan struct{}, func(), error) {
	sig, stop, err := w.Backend.Watch(ctx, name)
	if err == nil {
		select {
		case w.watched <- name:
		default:
		}
	}
	return sig, stop, err
}

// A release wakes one waiting backend, not all of them: four backends wait
// (each its own session and ticket), the holder releases, and exactly one
// predecessor notification reaches them, at the backend whose ticket was
// next. Then each releases in turn, and each hand-off again notifies one.
func TestReleaseNotifiesOneWaiter(t *testing.T) {
	ens := zktest.Start(t, 3, zktest.Config{})
	root := zktest.Root(t)
	const ttl = 4 * time.Second
	holder := testkit.NewManager(t, newBackend(t, ens.Servers(), zklease.WithRoot(root), zklease.WithSessionTimeout(ttl)), ttl)
	ctx := testkit.Context(t)
	h, err := holder.TryAcquire(ctx, "herd")
	if err != nil {
		t.Fatal(err)
	}
	admin := adminConn(t, ens.Servers())
	parent := zklease.ParentPath(root, "herd")
	const waiters = 4
	var backends []*zklease.Backend
	type got struct {
		i int
		l *lease.Lease
	}
	acquired := make(chan got, waiters)
	for i := range waiters {
		b := newBackend(t, ens.Servers(), zklease.WithRoot(root), zklease.WithSessionTimeout(ttl))
		backends = append(backends, b)
		wb := watchedBackend{Backend: b, watched: make(chan string, 1)}
		m := testkit.NewManager(t, wb, ttl, lease.WithPollInterval(10*time.Second))
		go func() {
			l, err := m.Acquire(ctx, "herd")
			if err != nil {
				t.Errorf("waiter %d: %v", i, err)
				l = nil
			}
			acquired <- got{i, l}
		}()
		// The hand-off order asserted below is the order of the tickets'
		// sequence numbers, so waiter i+1 starts only once waiter i's
		// ticket is in the queue, however slowly waiter i runs. Its
		// refused first attempt creates a node too, and deletes it before
		// Watch queues the ticket: a count of nodes alone could be that
		// one, so first wait for Watch to return, then for the queue to
		// hold the holder's node and one ticket per waiter, no more (a
		// member may lag behind the one that served the waiter: poll).
		select {
		case <-wb.watched:
		case <-time.After(30 * time.Second):
			t.Fatalf("waiter %d did not subscribe within 30s", i)
		}
		want := i + 2
		var kids []string
		for start := time.Now(); ; time.Sleep(10 * time.Millisecond) {
			kids, _, err = admin.Children(parent)
			if err != nil {
				t.Fatalf("list %s: %v", parent, err)
			}
			if len(kids) == want {
				break
			}
			if time.Since(start) > 30*time.Second {
				t.Fatalf("after waiter %d queued, %s holds %d nodes %v, want %d (the holder's and one ticket per waiter)", i, parent, len(kids), kids, want)
			}
		}
	}
	total := func() (n int64) {
		for _, b := range backends {
			n += b.Notified()
		}
		return n
	}
	if n := total(); n != 0 {
		t.Fatalf("%d notifications before any release", n)
	}
	release := func(l *lease.Lease) {
		if err := l.Release(ctx); err != nil {
			t.Fatal(err)
		}
	}
	release(h)
	for k := 1; k <= waiters; k++ {
		var g got
		select {
		case g = <-acquired:
		case <-time.After(30 * time.Second): // a bound for "never", no measure of promptness
			t.Fatalf("hand-off %d: no waiter acquired within 30s", k)
		}
		if g.l == nil {
			t.FailNow()
		}
		time.Sleep(100 * time.Millisecond) // let any stray notification arrive
		if n := total(); n != int64(k) {
			t.Fatalf("after %d hand-offs the waiting backends got %d predecessor notifications; want one per hand-off", k, n)
		}
		if g.i != k-1 {
			t.Errorf("hand-off %d went to waiter %d, want %d (queue order)", k, g.i, k-1)
		}
		release(g.l)
	}
}

// A server that grants a shorter session timeout than the lease's TTL gets
// no grant: the session could end before the lease's local deadline.
func TestShorterGrantedSessionTimeoutIsRefused(t *testing.T) {
	ens := zktest.Start(t, 1, zktest.Config{MaxSessionTimeout: 2 * time.Second})
	root := zktest.Root(t)
	b := newBackend(t, ens.Servers(), zklease.WithRoot(root), zklease.WithSessionTimeout(4*time.Second))
	m := testkit.NewManager(t, b, 4*time.Second)
	_, err := m.TryAcquire(testkit.Context(t), "short")
	if !errors.Is(err, zklease.ErrSessionTimeout) {
		t.Fatalf("TryAcquire with a 4s TTL on a session the server bounded to 2s = %v, want ErrSessionTimeout", err)
	}
	if _, granted := b.Session(); granted != 2*time.Second {
		t.Fatalf("granted session timeout %v, want the server's maximum 2s", granted)
	}
	// Nothing was left behind: a TTL within the granted timeout works.
	ok := testkit.NewManager(t, newBackend(t, ens.Servers(), zklease.WithRoot(root), zklease.WithSessionTimeout(2*time.Second)), 2*time.Second)
	l, err := ok.TryAcquire(testkit.Context(t), "short")
	if err != nil {
		t.Fatalf("TryAcquire with a 2s TTL: %v", err)
	}
	_ = l.Release(testkit.Context(t))
}

const opMulti = 14 // a ZooKeeper opcode (see opDelete)

// A create whose answer is lost leaves no node behind: when the caller
// still waits, the backend finds its node by its GUID and grants it; when
// the caller gave up, the node is deleted once the connection is back, so
// another client gets the lease at once.
func TestLostCreateAnswerLeavesNoOrphan(t *testing.T) {
	ens := zktest.Start(t, 3, zktest.Config{})
	root := zktest.Root(t)
	admin := adminConn(t, ens.Servers())
	const ttl = 6 * time.Second
	// The create (a multi), applied, its answer lost; the client's
	// reconnect is refused for a while.
	d := faultnet.ZooKeeper(opMulti)
	d.RefuseAfterCut = time.Second
	b := newBackend(t, ens.Servers(), zklease.WithRoot(root), zklease.WithSessionTimeout(ttl), zklease.WithDialer(d.DialTimeout))
	m := testkit.NewManager(t, b, ttl)
	other := testkit.NewManager(t, newBackend(t, ens.Servers(), zklease.WithRoot(root), zklease.WithSessionTimeout(ttl)), ttl)
	children := func(name string) []string {
		kids, _, err := admin.Children(zklease.ParentPath(root, name))
		if err != nil {
			t.Fatalf("list: %v", err)
		}
		return kids
	}
	// Create the parents first, so that the armed create is the node's.
	for _, n := range []string{"settled", "abandoned"} {
		l, err := m.TryAcquire(testkit.Context(t), n)
		if err != nil {
			t.Fatal(err)
		}
		_ = l.Release(testkit.Context(t))
	}

	t.Run("caller waits", func(t *testing.T) {
		d.Arm()
		l, err := m.TryAcquire(testkit.Context(t), "settled")
		if d.Cuts() == 0 {
			t.Fatal("the fault was not injected")
		}
		if err != nil {
			t.Fatalf("TryAcquire across a lost create answer: %v", err)
		}
		if kids := children("settled"); len(kids) != 1 {
			t.Fatalf("nodes %v, want exactly the granted one", kids)
		}
		if err := l.Release(testkit.Context(t)); err != nil {
			t.Fatal(err)
		}
		if kids := children("settled"); len(kids) != 0 {
			t.Fatalf("nodes %v left after the release", kids)
		}
	})

	t.Run("caller gives up", func(t *testing.T) {
		// Wait for the connection to be allowed and used again.
		time.Sleep(d.RefusingFor())
		l, err := m.Acquire(testkit.Context(t), "warm")
		if err != nil {
			t.Fatal(err)
		}
		_ = l.Release(testkit.Context(t))
		drops := d.Cuts()
		d.Arm()
		ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
		defer cancel()
		_, err = m.TryAcquire(ctx, "abandoned")
		if d.Cuts() == drops {
			t.Fatal("the fault was not injected")
		}
		if !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("TryAcquire that gave up = %v, want DeadlineExceeded", err)
		}
		// The other client gets the lease once the node is settled and
		// given back (after the connection is allowed again, about 1s).
		ctx2, cancel2 := context.WithTimeout(context.Background(), ttl/2)
		defer cancel2()
		l, err = other.Acquire(ctx2, "abandoned")
		if err != nil {
			t.Fatalf("another client could not acquire within %v: an orphan node blocks it (nodes %v): %v", ttl/2, children("abandoned"), err)
		}
		if kids := children("abandoned"); len(kids) != 1 {
			t.Fatalf("nodes %v, want only the other client's", kids)
		}
		_ = l.Release(testkit.Context(t))
	})
}

// After a hand-off to a waiting backend (its ticket turned into the grant),
// Holder, asked through a third backend, names the new owner and token, not
// the ticket: the owner is written right after the grant, and Holder waits
// for that write.
func TestHolderNamesTheOwnerAfterAHandOff(t *testing.T) {
	ens := zktest.Start(t, 3, zktest.Config{})
	root := zktest.Root(t)
	const ttl = 4 * time.Second
	mgr := func(id string) *lease.Manager {
		return testkit.NewManager(t, newBackend(t, ens.Servers(), zklease.WithRoot(root), zklease.WithSessionTimeout(ttl), zklease.WithIdentity("backend-"+id)),
			ttl, lease.WithIdentity(id), lease.WithPollInterval(10*time.Second))
	}
	holder, waiter, observer := mgr("holder"), mgr("waiter"), mgr("observer")
	ctx := testkit.Context(t)
	for round := range 5 {
		h, err := holder.Acquire(ctx, "inspected")
		if err != nil {
			t.Fatal(err)
		}
		got := make(chan *lease.Lease, 1)
		go func() {
			l, err := waiter.Acquire(ctx, "inspected")
			if err != nil {
				t.Errorf("waiter: %v", err)
			}
			got <- l
		}()
		time.Sleep(200 * time.Millisecond) // queued
		if hd, err := observer.Holder(ctx, "inspected"); err != nil || hd.Owner != h.Owner() || hd.Token != h.Token() {
			t.Fatalf("round %d: Holder while the first holds = %+v, %v; want %s with token %d", round, hd, err, h.Owner(), h.Token())
		}
		if err := h.Release(ctx); err != nil {
			t.Fatal(err)
		}
		w := <-got
		if w == nil {
			t.FailNow()
		}
		hd, err := observer.Holder(ctx, "inspected")
		if err != nil || hd.Owner != w.Owner() || hd.Token != w.Token() || hd.Identity() != "waiter" {
			t.Fatalf("round %d: Holder after the hand-off = %+v, %v; want %s with token %d", round, hd, err, w.Owner(), w.Token())
		}
		if err := w.Release(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := observer.Holder(ctx, "inspected"); !errors.Is(err, lease.ErrNotHeld) {
		t.Fatalf("Holder of a free lease = %v, want ErrNotHeld", err)
	}
}

// A session expired at the store ends every lease of it at once, as
// expired (the store let the grants go), with ErrSessionExpired as the
// cause; the backend carries on with a new session.
func TestExpiredSessionEndsEveryLeaseOfIt(t *testing.T) {
	ens := zktest.Start(t, 3, zktest.Config{})
	root := zktest.Root(t)
	const ttl = 6 * time.Second
	b := newBackend(t, ens.Servers(), zklease.WithRoot(root), zklease.WithSessionTimeout(ttl))
	m := testkit.NewManager(t, b, ttl, lease.WithoutAutoRenew())
	var ls []*lease.Lease
	for _, n := range []string{"one", "two", "three"} {
		l, err := m.TryAcquire(testkit.Context(t), n)
		if err != nil {
			t.Fatal(err)
		}
		ls = append(ls, l)
	}
	_, before, _ := b.SessionCredentials()
	endSession(t, b)
	for _, l := range ls {
		select {
		case <-l.Done():
		case <-time.After(ttl / 2):
			t.Fatalf("%s: not lost within %v of the session's end", l.Name(), ttl/2)
		}
		var le *lease.LostError
		if !errors.As(l.Err(), &le) || le.Reason != lease.LostExpired || !errors.Is(l.Err(), zklease.ErrSessionExpired) {
			t.Fatalf("%s: Err = %v; want a LostError (expired) caused by ErrSessionExpired", l.Name(), l.Err())
		}
	}
	// The backend is on a new session and grants again.
	l, err := m.Acquire(testkit.Context(t), "one")
	if err != nil {
		t.Fatalf("Acquire on the new session: %v", err)
	}
	if _, after, _ := b.SessionCredentials(); after == before || after == 0 {
		t.Fatalf("session 0x%x before, 0x%x after; want a new one", before, after)
	}
	if l.Token() <= ls[0].Token() {
		t.Fatalf("token %d after %d", l.Token(), ls[0].Token())
	}
	_ = l.Release(testkit.Context(t))
}

// A grant whose session the ensemble ended is released without a request:
// its node went with the session. Here the lease first ends locally (its
// deadline passes without renewals), so Release still goes to the backend;
// then the session is expired at the store and no server answers any more.
// Release must say the grant is gone at once, not wait for a server to
// be told so.
func TestReleaseAfterSessionEndedSendsNothing(t *testing.T) {
	ens := zktest.Start(t, 1, zktest.Config{})
	const ttl = time.Second
	b := newBackend(t, ens.Servers(), zklease.WithRoot(zktest.Root(t)), zklease.WithSessionTimeout(4*ttl))
	// A Release that waited for a server would return only when its
	// timeout ended, however fast the machine.
	const releaseTimeout = 30 * time.Second
	m := testkit.NewManager(t, b, ttl, lease.WithoutAutoRenew(), lease.WithReleaseTimeout(releaseTimeout))
	// Acquire, not TryAcquire: at load, the first grant of a server just
	// started can arrive past the TTL's validity and be given back; the
	// next attempt is granted.
	l, err := m.Acquire(testkit.Context(t), "job")
	if err != nil {
		t.Fatal(err)
	}
	select {
	case <-l.Done(): // the local deadline: the session lives on
	case <-time.After(3 * ttl):
		t.Fatalf("not ended within %v of a TTL of %v without renewals", 3*ttl, ttl)
	}
	_, id, _ := b.SessionCredentials()
	endSession(t, b)
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		if _, now, _ := b.SessionCredentials(); now != id {
			break // the backend learned that the session ended
		}
		if time.Now().After(deadline) {
			t.Fatal("the backend did not learn within 10s that its session was expired")
		}
	}
	for _, mem := range ens.Members {
		mem.Kill()
	}
	start := time.Now()
	err = l.Release(testkit.Context(t))
	took := time.Since(start)
	if !errors.Is(err, lease.ErrLost) {
		t.Fatalf("Release = %v; want the loss", err)
	}
	if took >= releaseTimeout {
		t.Fatalf("Release took %v with no server up, its whole timeout: it waited for one, for a node that went with its session", took)
	}
}
