package zklease_test

import (
	"context"
	"errors"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/go-zookeeper/zk"

	"github.com/fencekit/fencekit/internal/testkit"
	"github.com/fencekit/fencekit/internal/testkit/zktest"
	"github.com/fencekit/fencekit/lease"
	"github.com/fencekit/fencekit/lease/zklease"
)

// lateDialer's connections deliver everything the client writes to the
// server delay late, in order, without slowing the client down (a link with
// a long latency, as toxiproxy's latency toxic on the upstream stream); the
// server's answers come back at once. When the client closes a connection,
// its reads end at once and the writes still in the link are delivered
// before the server sees the close.
type lateDialer struct {
	delay time.Duration
	stop  chan struct{} // closed when the test ends: the links close
}

func newLateDialer(t *testing.T, delay time.Duration) *lateDialer {
	d := &lateDialer{delay: delay, stop: make(chan struct{})}
	t.Cleanup(func() { close(d.stop) })
	return d
}

func (d *lateDialer) dial(network, addr string, timeout time.Duration) (net.Conn, error) {
	c, err := net.DialTimeout(network, addr, timeout)
	if err != nil {
		return nil, err
	}
	lc := &lateConn{Conn: c, delay: d.delay, q: make(chan lateChunk, 4096), stop: d.stop}
	go lc.pump()
	return lc, nil
}

type lateChunk struct {
	at   time.Time
	data []byte // nil: close
}

type lateConn struct {
	net.Conn
	delay time.Duration
	q     chan lateChunk
	stop  chan struct{}

	mu     sync.Mutex
	closed bool
}

func (c *lateConn) Write(p []byte) (int, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return 0, net.ErrClosed
	}
	c.q <- lateChunk{at: time.Now().Add(c.delay), data: append([]byte(nil), p...)}
	return len(p), nil
}

func (c *lateConn) Close() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return nil
	}
	c.closed = true
	if tc, ok := c.Conn.(*net.TCPConn); ok {
		_ = tc.CloseRead()
	}
	c.q <- lateChunk{at: time.Now().Add(c.delay)}
	return nil
}

func (c *lateConn) SetWriteDeadline(time.Time) error { return nil }

func (c *lateConn) SetDeadline(t time.Time) error { return c.Conn.SetReadDeadline(t) }

func (c *lateConn) pump() {
	defer c.Conn.Close()
	broken := false
	for {
		var ch lateChunk
		select {
		case ch = <-c.q:
		case <-c.stop:
			return
		}
		t := time.NewTimer(time.Until(ch.at))
		select {
		case <-t.C:
		case <-c.stop:
			t.Stop()
			return
		}
		if ch.data == nil {
			return
		}
		if !broken {
			if _, err := c.Conn.Write(ch.data); err != nil {
				broken = true
			}
		}
	}
}

// A waiter whose every request reaches ZooKeeper late (a late acquire
// seen from the other side) must not keep the others out: W's requests are
// delayed by more than the lease's validity, so its Manager abandons every
// attempt and W never holds the lease; meanwhile B acquires (blocking),
// holds 50 ms and releases, over and over. Each of B's waits must stay
// within one of W's request delays plus a TTL.
//
// Two mechanisms kept B out. With the delay under go-zookeeper's receive
// timeout (2/3 of the session timeout), a create of W's that the caller no
// longer waited for headed the queue until W had listed the queue and then
// given the node back: two delays. With the delay over it, W heard no
// answer at all (each connection was dropped before its first answer),
// yet every request was applied: a create's node, whose name W never
// learnt, headed the queue for good, and W's reconnects kept its session,
// and so the node, alive (B's 15 s Acquire failed). Now a create whose
// caller left is given back at once, and a create that cannot be settled
// within the TTL ends its session at the store (blindclose.go).
func TestLateWaiterDoesNotKeepOthersOut(t *testing.T) {
	for _, delay := range []time.Duration{1500 * time.Millisecond, 2500 * time.Millisecond} {
		t.Run(delay.String(), func(t *testing.T) { testLateWaiter(t, delay) })
	}
}

func testLateWaiter(t *testing.T, delay time.Duration) {
	ens := zktest.Shared(t, 1)
	root := zktest.Root(t)
	const (
		ttl     = time.Second
		session = 3 * time.Second
		run     = 10 * time.Second
	)
	late := newLateDialer(t, delay)
	bW := newBackend(t, ens.Servers(), zklease.WithRoot(root), zklease.WithSessionTimeout(session), zklease.WithIdentity("w"),
		zklease.WithDialer(late.dial))
	bB := newBackend(t, ens.Servers(), zklease.WithRoot(root), zklease.WithSessionTimeout(session), zklease.WithIdentity("b"))
	mW := testkit.NewManager(t, bW, ttl, lease.WithPollInterval(100*time.Millisecond))
	mB := testkit.NewManager(t, bB, ttl, lease.WithPollInterval(100*time.Millisecond))
	admin := adminConn(t, ens.Servers())

	const name = "late-waiter"
	wctx, wcancel := context.WithCancel(context.Background())
	wdone := make(chan error, 1)
	go func() {
		l, err := mW.Acquire(wctx, name)
		if err == nil {
			t.Logf("W was granted the lease (token %d)", l.Token())
			_ = l.Release(context.Background())
		}
		wdone <- err
	}()
	defer func() {
		wcancel()
		<-wdone
	}()

	// One of W's request delays and a TTL: a late create of W's may head
	// the queue until W's give-back arrives, one delay after W heard the
	// answer, or until the session's end arrives, one delay after the
	// backend waited a TTL for an answer. Fixed, B waited at most about
	// 1.4 s (delay 1.5 s) and 1.8 s (2.5 s); before, 3 s (two delays: a
	// listing and then the give-back) and for ever (no answer heard, so
	// the node was never given back, and the reconnects kept the session).
	bound := delay + ttl
	var (
		waits []time.Duration
		worst time.Duration
	)
	end := time.Now().Add(run)
	for time.Now().Before(end) {
		s := time.Now()
		ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
		l, err := mB.Acquire(ctx, name)
		cancel()
		w := time.Since(s)
		if err != nil {
			dumpQueue(t, admin, zklease.ParentPath(root, name), bW, bB)
			t.Fatalf("B was kept out for %v: %v (waits so far %v)", w.Round(time.Millisecond), err, waits)
		}
		waits = append(waits, w.Round(time.Millisecond))
		worst = max(worst, w)
		if w > bound {
			dumpQueue(t, admin, zklease.ParentPath(root, name), bW, bB)
		}
		time.Sleep(50 * time.Millisecond)
		_ = l.Release(context.Background())
		time.Sleep(200 * time.Millisecond)
	}
	t.Logf("TTL %v, W's requests %v late: B's waits %v; worst %v", ttl, delay, waits, worst.Round(time.Millisecond))
	if worst > bound {
		t.Errorf("B was kept out for %v by a waiter that never held the lease, more than %v (W's request delay %v + TTL %v)", worst.Round(time.Millisecond), bound, delay, ttl)
	}
}

// dumpQueue logs the queue of a lease name, for a failure's diagnosis.
func dumpQueue(t *testing.T, c *zk.Conn, parent string, bs ...*zklease.Backend) {
	for _, b := range bs {
		id, _ := b.Session()
		t.Logf("backend %s: session 0x%x: %s", b.Options().Identity, id, b.DebugName("late-waiter"))
	}
	kids, _, err := c.Children(parent)
	if err != nil && !errors.Is(err, zk.ErrNoNode) {
		t.Logf("queue %s: %v", parent, err)
		return
	}
	for _, k := range kids {
		data, st, err := c.Get(parent + "/" + k)
		if err != nil {
			t.Logf("  %s: %v", k, err)
			continue
		}
		t.Logf("  %s: %q session 0x%x czxid %d age %v", k, data, st.EphemeralOwner, st.Czxid, time.Since(time.UnixMilli(st.Ctime)).Round(time.Millisecond))
	}
}
