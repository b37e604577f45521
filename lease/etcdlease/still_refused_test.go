package etcdlease_test

import (
	"errors"
	"testing"
	"time"

	"github.com/fencekit/fencekit/internal/testkit"
	"github.com/fencekit/fencekit/lease/driver"
	"github.com/fencekit/fencekit/lease/etcdlease"
)

// A queued attempt that etcd would refuse as it refused the owner's last
// one is answered without a request: the owner's place was confirmed
// lately and the name's watch, created at or before that refusal, has seen
// no change of the key since. Any change (here a hand-over) sends the next
// attempts to etcd again, and so does a place that needs keeping alive.
// The waiters' Backend runs on a clock that stands still until the test
// moves it: the ages of places are the Backend's own timing, so a slow
// machine cannot age a place between two steps, and the eighth of the TTL
// is checked on both sides of it.
func TestQueuedAttemptAnsweredByTheWatch(t *testing.T) {
	cl := cluster(t)
	p := prefix(t)
	holder := newBackend(t, cl.Client(), p)
	// The waiters' requests and their watch go to one member, so that the
	// watch begins at that member's revision, which the linearizable read
	// below brings past the write elsewhere (with every member as an
	// endpoint, the watch could go to a member that had not yet applied
	// it, and begin at or before w1's refusal, where it proves the
	// refusal still holds).
	cc := newCounting(cl.Client(cl.Endpoints(0)...))
	waiters := newBackend(t, cc, p)
	clock := newStepClock()
	etcdlease.SetClock(waiters, clock.now)
	ctx := testkit.Context(t)
	// Places need keeping alive after ttl/8 by the clock; etcd keeps them
	// for ttl of real time, longer than the test takes however slowly it
	// runs.
	const ttl = 60 * time.Second
	req := func(owner string) driver.Request {
		return driver.Request{Name: "job", Owner: owner, TTL: ttl, Queue: true}
	}
	refused := func(owner string) {
		t.Helper()
		if _, err := waiters.Acquire(ctx, req(owner)); !errors.Is(err, driver.ErrNotAcquired) {
			t.Fatalf("%s's Acquire while held: %v, want ErrNotAcquired", owner, err)
		}
	}
	sent := func(what string, want int) {
		t.Helper()
		if n := cc.take(); total(n) != want {
			t.Fatalf("%s sent %v, want %d request(s)", what, n, want)
		}
	}

	g0, err := holder.Acquire(ctx, req("holder"))
	if err != nil {
		t.Fatal(err)
	}
	refused("w1")
	// A write elsewhere: the watch begins at a later revision than w1's
	// refusal, so it cannot tell what came between.
	if _, err := cl.Client().Put(ctx, p+"elsewhere", "x"); err != nil {
		t.Fatal(err)
	}
	if _, err := cc.Get(ctx, p+"elsewhere"); err != nil {
		t.Fatal(err)
	}
	woken, stop, err := waiters.Watch(ctx, "job")
	if err != nil {
		t.Fatal(err)
	}
	defer stop()
	cc.take()
	refused("w1")
	sent("w1's attempt after the watch began, refused before it", 2) // the transaction and the place's keep-alive
	refused("w2")
	cc.take()
	refused("w2")
	sent("w2's attempt again", 0)
	refused("w1")
	sent("w1's attempt again", 0)

	// A change of the key (the hand-over to w1) sends the next attempts to
	// etcd: w1 takes the grant, w2 is refused by etcd.
	if err := holder.Release(ctx, g0); err != nil {
		t.Fatal(err)
	}
	select {
	case <-woken:
	case <-time.After(30 * time.Second): // no measure of promptness: with the bug, never
		t.Fatal("the hand-over woke no waiter")
	}
	cc.take()
	g1, err := waiters.Acquire(ctx, req("w1"))
	if err != nil {
		t.Fatalf("w1's Acquire after the hand-over: %v", err)
	}
	refused("w2")
	if n := cc.take(); n["txn"] != 2 {
		t.Fatalf("w1's grant and w2's attempt sent %v, want a transaction each", n)
	}
	refused("w2")
	sent("w2's attempt after its refusal by etcd", 0)

	// A place confirmed less than an eighth of its TTL ago needs no
	// keep-alive yet; one confirmed an eighth ago does.
	clock.advance(ttl/8 - time.Millisecond)
	refused("w2")
	sent("w2's attempt just inside an eighth of the TTL", 0)
	clock.advance(time.Millisecond)
	refused("w2")
	if n := cc.take(); n["txn"] != 1 || n["keepalive"] != 1 {
		t.Fatalf("w2's attempt with a place to keep alive sent %v, want the transaction and a keep-alive", n)
	}
	if err := waiters.Release(ctx, g1); err != nil {
		t.Fatal(err)
	}
}
