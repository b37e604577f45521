package etcdlease_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/fencekit/fencekit/fence"
	"github.com/fencekit/fencekit/internal/testkit"
	"github.com/fencekit/fencekit/lease/driver"
	"github.com/fencekit/fencekit/lease/etcdlease"
)

// A Release of a grant made in line hands the name to the first waiter in
// line in its own transaction: the key holds the waiter's owner on the
// etcd lease of its place as soon as Release returns, the waiter's token is
// minted by that write, and the waiter's acquire takes the grant without a
// write of its own (no key under the backend's prefix changes).
func TestReleaseHandsOverToFirstInLine(t *testing.T) {
	cl := cluster(t)
	p := prefix(t)
	admin := cl.Client()
	holder := newBackend(t, cl.Client(), p)
	wcli := &writeCounting{Client: cl.Client()}
	waiters := newBackend(t, wcli, p)
	ctx := testkit.Context(t)
	// The places in line live on etcd leases of this TTL, which the test
	// calls of the backend do not keep alive: long enough that w2's place
	// (queued first) outlives the whole test on a loaded machine; with
	// 5 s it expired, and took the handed key with it, before w2's
	// Acquire.
	const ttl = 60 * time.Second
	req := func(owner string) driver.Request {
		return driver.Request{Name: "job", Owner: owner, TTL: ttl, Queue: true}
	}
	key := holder.Key("job")
	read := func(k string) *clientv3.GetResponse {
		t.Helper()
		resp, err := admin.Get(ctx, k)
		if err != nil {
			t.Fatalf("Get %q: %v", k, err)
		}
		return resp
	}
	// lastWrite is the highest mod revision of any key under the prefix.
	lastWrite := func() int64 {
		t.Helper()
		resp, err := admin.Get(ctx, p, clientv3.WithPrefix(), clientv3.WithSort(clientv3.SortByModRevision, clientv3.SortDescend), clientv3.WithLimit(1))
		if err != nil || len(resp.Kvs) == 0 {
			t.Fatalf("reading the last write under %q: %v (%d keys)", p, err, len(resp.Kvs))
		}
		return resp.Kvs[0].ModRevision
	}

	g0, err := holder.Acquire(ctx, req("holder"))
	if err != nil {
		t.Fatalf("holder's Acquire: %v", err)
	}
	rev0 := read(key).Kvs[0].ModRevision
	for _, w := range []string{"w1", "w2"} {
		if _, err := waiters.Acquire(ctx, req(w)); !errors.Is(err, driver.ErrNotAcquired) {
			t.Fatalf("%s's Acquire while held: %v, want ErrNotAcquired", w, err)
		}
	}
	place := read(waiters.LineKey("job", "w1"))
	if len(place.Kvs) != 1 {
		t.Fatalf("w1 has no place in line: %v", place.Kvs)
	}
	woken, stop, err := waiters.Watch(ctx, "job")
	if err != nil {
		t.Fatalf("Watch: %v", err)
	}
	defer stop()

	if err := holder.Release(ctx, g0); err != nil {
		t.Fatalf("Release: %v", err)
	}
	kv := read(key).Kvs
	if len(kv) != 1 || string(kv[0].Value) != "w1" || kv[0].Lease != place.Kvs[0].Lease {
		t.Fatalf("after Release the key is %v, want it held by w1 on its place's etcd lease %x", kv, place.Kvs[0].Lease)
	}
	if n := len(read(waiters.LineKey("job", "w1")).Kvs); n != 0 {
		t.Fatalf("w1's place is still in line after the hand-over")
	}
	handedAt := kv[0].ModRevision
	select {
	case <-woken:
	case <-time.After(ttl):
		t.Fatalf("the hand-over woke no waiter within %v", ttl)
	}

	before := lastWrite()
	wcli.writes.Store(0)
	g1, err := waiters.Acquire(ctx, req("w1"))
	if err != nil {
		t.Fatalf("w1's Acquire after the hand-over: %v", err)
	}
	if want := g0.Token + fence.Token(handedAt-rev0); g1.Token != want {
		t.Fatalf("w1's token is %d, want %d (the hand-over's revision %d on the holder's base)", g1.Token, want, handedAt)
	}
	if after := lastWrite(); after != before {
		t.Fatalf("w1's Acquire wrote: the last write under the prefix went from revision %d to %d", before, after)
	}
	if n := wcli.writes.Load(); n != 0 {
		t.Fatalf("w1's Acquire sent %d transaction(s) that can write (a consensus round each), want only a read", n)
	}
	if _, err := waiters.Acquire(ctx, req("w2")); !errors.Is(err, driver.ErrNotAcquired) {
		t.Fatalf("w2's Acquire while w1 holds: %v, want ErrNotAcquired", err)
	}
	if err := waiters.Renew(ctx, g1); err != nil {
		t.Fatalf("Renew of the handed grant: %v", err)
	}

	// The next Release hands the name to w2, and a Release of a line
	// whose first place is gone releases as without a line.
	if err := waiters.Release(ctx, g1); err != nil {
		t.Fatalf("w1's Release: %v", err)
	}
	if kv := read(key).Kvs; len(kv) != 1 || string(kv[0].Value) != "w2" {
		t.Fatalf("after w1's Release the key is %v, want it held by w2", kv)
	}
	g2, err := waiters.Acquire(ctx, req("w2"))
	if err != nil {
		t.Fatalf("w2's Acquire after the hand-over: %v", err)
	}
	if g2.Token <= g1.Token {
		t.Fatalf("w2's token %d is not above w1's %d", g2.Token, g1.Token)
	}
	if err := waiters.Release(ctx, g2); err != nil {
		t.Fatalf("w2's Release: %v", err)
	}
	if kv := read(key).Kvs; len(kv) != 0 {
		t.Fatalf("after the last Release with an empty line the key is %v, want it deleted", kv)
	}
}

// writeCounting counts the transactions sent that hold a put or a delete
// in any branch: etcd proposes those to the cluster (one consensus round)
// whichever branch runs; a read-only one is answered without a proposal.
type writeCounting struct {
	*clientv3.Client
	writes atomic.Int64
}

func (c *writeCounting) Txn(ctx context.Context) clientv3.Txn {
	return &countedTxn{Txn: c.Client.Txn(ctx), c: c}
}

type countedTxn struct {
	clientv3.Txn
	c     *writeCounting
	write bool
}

func (t *countedTxn) If(cs ...clientv3.Cmp) clientv3.Txn { t.Txn = t.Txn.If(cs...); return t }
func (t *countedTxn) Then(ops ...clientv3.Op) clientv3.Txn {
	t.write = t.write || writes(ops)
	t.Txn = t.Txn.Then(ops...)
	return t
}
func (t *countedTxn) Else(ops ...clientv3.Op) clientv3.Txn {
	t.write = t.write || writes(ops)
	t.Txn = t.Txn.Else(ops...)
	return t
}
func (t *countedTxn) Commit() (*clientv3.TxnResponse, error) {
	if t.write {
		t.c.writes.Add(1)
	}
	return t.Txn.Commit()
}

func writes(ops []clientv3.Op) bool {
	for _, op := range ops {
		if op.IsPut() || op.IsDelete() {
			return true
		}
		if op.IsTxn() {
			_, then, els := op.Txn()
			if writes(then) || writes(els) {
				return true
			}
		}
	}
	return false
}

// The waiter handed the name takes it with the read alone, no keep-alive,
// when its place's etcd lease was confirmed less than a quarter of the TTL
// ago (by its last refused attempt): the grant then counts from that
// confirmation's send time (Grant.Sent), before the release, which etcd's
// lease guarantees. When the place's lease was confirmed longer ago, a
// keep-alive goes beside the read and the grant counts from the attempt.
// The waiters' Backend runs on a clock that moves only when the test moves
// it (the place's age is the Backend's own timing): "recent" does not move
// it, "stale" moves it by a quarter of the TTL; etcd keeps the place for
// the TTL of real time, longer than the test takes however slowly it runs.
func TestHandOverCountsFromPlaceKeepAlive(t *testing.T) {
	cl := cluster(t)
	const ttl = 60 * time.Second
	for _, tc := range []struct {
		name     string
		age      time.Duration // the place's age by the clock at the hand-over
		fromKept bool
	}{
		{"recent", 0, true},
		{"stale", ttl / 4, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := prefix(t)
			holder := newBackend(t, cl.Client(), p)
			cc := newCounting(cl.Client())
			waiters := newBackend(t, cc, p)
			clock := newStepClock()
			etcdlease.SetClock(waiters, clock.now)
			ctx := testkit.Context(t)
			req := func(owner string) driver.Request {
				return driver.Request{Name: "job", Owner: owner, TTL: ttl, Queue: true}
			}
			g0, err := holder.Acquire(ctx, req("holder"))
			if err != nil {
				t.Fatalf("holder's Acquire: %v", err)
			}
			confirmed := clock.now() // the send time of the place's lease grant, by the clock
			if _, err := waiters.Acquire(ctx, req("w1")); !errors.Is(err, driver.ErrNotAcquired) {
				t.Fatalf("w1's Acquire while held: %v, want ErrNotAcquired", err)
			}
			woken, stop, err := waiters.Watch(ctx, "job")
			if err != nil {
				t.Fatalf("Watch: %v", err)
			}
			defer stop()
			clock.advance(tc.age)
			if err := holder.Release(ctx, g0); err != nil {
				t.Fatalf("Release: %v", err)
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
			got := cc.take()
			if tc.fromKept {
				if got["txn"] != 1 || total(got) != 1 {
					t.Fatalf("w1's Acquire sent %v, want one transaction and no keep-alive", got)
				}
				if !g1.Sent.Equal(confirmed) {
					t.Fatalf("Grant.Sent = %v, want the send time of the place's lease grant, %v", g1.Sent, confirmed)
				}
			} else {
				if got["txn"] != 1 || got["keepalive"] != 1 || total(got) != 2 {
					t.Fatalf("w1's Acquire sent %v, want one transaction and one keep-alive", got)
				}
				if !g1.Sent.IsZero() {
					t.Fatalf("Grant.Sent = %v (%v after the place's lease grant), want zero: the grant counts from the attempt", g1.Sent, g1.Sent.Sub(confirmed))
				}
			}
			if g1.TTL < ttl {
				t.Fatalf("Grant.TTL = %v, want at least %v", g1.TTL, ttl)
			}
			if err := waiters.Release(ctx, g1); err != nil {
				t.Fatalf("w1's Release: %v", err)
			}
		})
	}
}

// A Release whose own Backend keeps the place of the first waiter in line
// (every place that was ahead of it at its last refusal has left since, as
// the Backend's watch saw) hands the name over without reading the line
// first: one transaction. With another process's waiter ahead, it reads
// the line as before.
func TestReleaseHandsOverToALocalFirstWithoutARead(t *testing.T) {
	cl := cluster(t)
	const ttl = 5 * time.Second
	req := func(owner string) driver.Request {
		return driver.Request{Name: "job", Owner: owner, TTL: ttl, Queue: true}
	}
	ctx := testkit.Context(t)
	holds := func(t *testing.T, b interface{ Key(string) string }, owner string) {
		t.Helper()
		resp, err := cl.Client().Get(ctx, b.Key("job"))
		if err != nil || len(resp.Kvs) != 1 || string(resp.Kvs[0].Value) != owner {
			t.Fatalf("the key is %v (%v), want it handed to %s", resp.Kvs, err, owner)
		}
	}

	t.Run("local", func(t *testing.T) {
		cc := newCounting(cl.Client())
		b := newBackend(t, cc, prefix(t))
		g0, err := b.Acquire(ctx, req("holder"))
		if err != nil {
			t.Fatal(err)
		}
		for _, w := range []string{"w1", "w2"} {
			if _, err := b.Acquire(ctx, req(w)); !errors.Is(err, driver.ErrNotAcquired) {
				t.Fatalf("%s's Acquire while held: %v, want ErrNotAcquired", w, err)
			}
		}
		woken, stop, err := b.Watch(ctx, "job")
		if err != nil {
			t.Fatal(err)
		}
		defer stop()
		cc.take()
		if err := b.Release(ctx, g0); err != nil {
			t.Fatal(err)
		}
		holds(t, b, "w1")
		if n := cc.take(); n["get"] != 0 || n["txn"] != 1 {
			t.Fatalf("the Release sent %v, want one transaction and no read of the line", n)
		}
		select {
		case <-woken:
		case <-time.After(ttl):
			t.Fatalf("the hand-over woke no waiter within %v", ttl)
		}
		g1, err := b.Acquire(ctx, req("w1"))
		if err != nil {
			t.Fatal(err)
		}
		// w2 had w1's place ahead; the watch saw it leave with the hand-over.
		cc.take()
		if err := b.Release(ctx, g1); err != nil {
			t.Fatal(err)
		}
		holds(t, b, "w2")
		if n := cc.take(); n["get"] != 0 {
			t.Fatalf("w1's Release sent %v, want no read of the line", n)
		}
	})

	t.Run("remote-ahead", func(t *testing.T) {
		p := prefix(t)
		cc := newCounting(cl.Client())
		b := newBackend(t, cc, p)
		remote := newBackend(t, cl.Client(), p)
		g0, err := b.Acquire(ctx, req("holder"))
		if err != nil {
			t.Fatal(err)
		}
		if _, err := remote.Acquire(ctx, req("r1")); !errors.Is(err, driver.ErrNotAcquired) {
			t.Fatalf("r1's Acquire while held: %v, want ErrNotAcquired", err)
		}
		if _, err := b.Acquire(ctx, req("w1")); !errors.Is(err, driver.ErrNotAcquired) {
			t.Fatalf("w1's Acquire while held: %v, want ErrNotAcquired", err)
		}
		cc.take()
		if err := b.Release(ctx, g0); err != nil {
			t.Fatal(err)
		}
		holds(t, b, "r1")
		if n := cc.take(); n["get"] != 1 {
			t.Fatalf("the Release sent %v, want the read of the line (another process's waiter is first)", n)
		}
	})
}

// A Backend that hands the name to one of its own waiters knows it as its
// Release returns: the waiter's next attempt takes the grant (a read, no
// write) even while the watch of the name has not delivered the overwrite,
// which would otherwise leave the attempt refused as the last one was
// (stillRefused). The watch's events are held back here until the end.
func TestReleaseHandsOverToOwnWaiterBeforeItsWatchSees(t *testing.T) {
	cl := cluster(t)
	p := prefix(t)
	cli := &heldWatch{writeCounting: &writeCounting{Client: cl.Client()}, hold: make(chan struct{})}
	b := newBackend(t, cli, p)
	t.Cleanup(func() { close(cli.hold) }) // before the Backend's Close
	ctx := testkit.Context(t)
	req := func(owner string) driver.Request {
		return driver.Request{Name: "job", Owner: owner, TTL: 60 * time.Second, Queue: true}
	}
	g1, err := b.Acquire(ctx, req("w1"))
	if err != nil {
		t.Fatalf("w1's Acquire: %v", err)
	}
	_, stop, err := b.Watch(ctx, "job")
	if err != nil {
		t.Fatalf("Watch: %v", err)
	}
	defer stop()
	if _, err := b.Acquire(ctx, req("w2")); !errors.Is(err, driver.ErrNotAcquired) {
		t.Fatalf("w2's Acquire while w1 holds: %v, want ErrNotAcquired", err)
	}
	if err := b.Release(ctx, g1); err != nil {
		t.Fatalf("w1's Release: %v", err)
	}
	kv, err := cl.Client().Get(ctx, b.Key("job"))
	if err != nil || len(kv.Kvs) != 1 || string(kv.Kvs[0].Value) != "w2" {
		t.Fatalf("after w1's Release the key is %v (%v), want it held by w2", kv, err)
	}
	cli.writes.Store(0)
	g2, err := b.Acquire(ctx, req("w2"))
	if err != nil {
		t.Fatalf("w2's Acquire after the hand-over, its watch not told yet: %v", err)
	}
	if want := g1.Token + fence.Token(kv.Kvs[0].ModRevision-kv.Kvs[0].CreateRevision); g2.Token != want {
		t.Fatalf("w2's token is %d, want %d (minted by the hand-over's write)", g2.Token, want)
	}
	if n := cli.writes.Load(); n != 0 {
		t.Fatalf("w2's Acquire sent %d transaction(s) that can write, want only a read", n)
	}
}

// heldWatch delivers each watch's first response (etcd's confirmation
// that it was created) and holds back the rest until hold is closed.
type heldWatch struct {
	*writeCounting
	hold chan struct{}
}

func (c *heldWatch) Watch(ctx context.Context, key string, opts ...clientv3.OpOption) clientv3.WatchChan {
	in := c.writeCounting.Watch(ctx, key, opts...)
	out := make(chan clientv3.WatchResponse)
	go func() {
		defer close(out)
		for first := true; ; first = false {
			resp, ok := <-in
			if !ok {
				return
			}
			if !first {
				select {
				case <-c.hold:
				case <-ctx.Done():
					return
				}
			}
			select {
			case out <- resp:
			case <-ctx.Done():
				return
			}
		}
	}()
	return out
}
