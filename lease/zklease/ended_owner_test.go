package zklease_test

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fencekit/fencekit/internal/testkit"
	"github.com/fencekit/fencekit/internal/testkit/faultnet"
	"github.com/fencekit/fencekit/internal/testkit/zktest"
	"github.com/fencekit/fencekit/lease"
	"github.com/fencekit/fencekit/lease/driver"
	"github.com/fencekit/fencekit/lease/leasetest"
	"github.com/fencekit/fencekit/lease/zklease"
)

// ZooKeeper opcodes, as go-zookeeper writes them (opMulti is in
// faults_test.go).
const opDelete = 2

// A clean release whose answer is lost (the connection breaks after the
// server applied it; the backend sends it again after the reconnect, in the
// same session, and finds the node gone) is a release
// (leasetest.CheckReleaseReplyLost), and the resend goes out in the same
// session. Before the release recorded its owner as ended in the same
// transaction, the resent delete got "no node" and every round was
// reported as lost ("expired or was lost"), 3 rounds of 3.
func TestReleaseWhoseAnswerIsLostIsARelease(t *testing.T) {
	ens := zktest.Start(t, 3, zktest.Config{})
	root := zktest.Root(t)
	// The release's delete (or multi), applied, its answer lost; the
	// client's reconnect is refused for a while.
	w := faultnet.ZooKeeper(opDelete, opMulti)
	w.RefuseAfterCut = 500 * time.Millisecond
	b := newBackend(t, ens.Servers(), zklease.WithRoot(root), zklease.WithSessionTimeout(6*time.Second), zklease.WithDialer(w.DialTimeout))
	session, _ := b.Session()
	leasetest.CheckReleaseReplyLost(t, leasetest.ReplyLoss{
		Backend: b,
		Other:   newBackend(t, ens.Servers(), zklease.WithRoot(root), zklease.WithSessionTimeout(6*time.Second)),
		Fault:   w,
		Name:    "job",
		TTL:     4 * time.Second,
	})
	if now, _ := b.Session(); now != session {
		t.Fatalf("the session changed (0x%x to 0x%x): the resend was meant to go out in the same session", session, now)
	}
}

// heldWrites is a dialer whose connections, when armed, hold the next
// request of an opcode until released: a request delayed in the network.
type heldWrites struct {
	mu   sync.Mutex
	op   int32
	gate chan struct{}
	held chan struct{}
}

// hold arms the next write of op; it returns a channel closed once that
// write is held, and release, which lets it go.
func (h *heldWrites) hold(op int32) (held <-chan struct{}, release func()) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.op, h.gate, h.held = op, make(chan struct{}), make(chan struct{})
	gate := h.gate
	var once sync.Once
	return h.held, func() { once.Do(func() { close(gate) }) }
}

func (h *heldWrites) dial(network, addr string, timeout time.Duration) (net.Conn, error) {
	c, err := net.DialTimeout(network, addr, timeout)
	if err != nil {
		return nil, err
	}
	return &heldConn{Conn: c, h: h}, nil
}

type heldConn struct {
	net.Conn
	h *heldWrites
}

func (c *heldConn) Write(p []byte) (int, error) {
	if len(p) >= 12 {
		op := int32(binary.BigEndian.Uint32(p[8:12]))
		c.h.mu.Lock()
		gate, held := c.h.gate, c.h.held
		hit := gate != nil && op == c.h.op
		if hit {
			c.h.gate, c.h.held = nil, nil
		}
		c.h.mu.Unlock()
		if hit {
			close(held)
			<-gate
		}
	}
	return c.Conn.Write(p)
}

// An acquire request that reaches the store after its owner was ended is
// refused, so that it cannot leave a grant nobody holds:
//
//   - "released": an owner released is refused, through any backend;
//   - "abandoned, create delayed": an attempt's create is delayed in the
//     network while the owner is abandoned and another holder takes and
//     releases the name; when the create arrives, the store refuses it (the
//     create's transaction checks the owner's record) and the name stays
//     free. Before the records existed, the create was granted: a ghost
//     grant, holding the name for nobody;
//   - "abandoned in the same backend": ZooKeeper settles this one without
//     the records: the abandoned attempt keeps the name's operation lock
//     until the store answers, gives back its grant, and only then does
//     Abandon run; the name is free and no node is left.
func TestLateAcquireOfAnEndedOwnerIsRefused(t *testing.T) {
	ens := zktest.Start(t, 3, zktest.Config{})
	root := zktest.Root(t)
	const ttl = 4 * time.Second
	var h heldWrites
	late := newBackend(t, ens.Servers(), zklease.WithRoot(root), zklease.WithSessionTimeout(6*time.Second), zklease.WithDialer(h.dial))
	b := newBackend(t, ens.Servers(), zklease.WithRoot(root), zklease.WithSessionTimeout(6*time.Second))
	admin := adminConn(t, ens.Servers())
	req := func(name, owner string) driver.Request { return driver.Request{Name: name, Owner: owner, TTL: ttl} }
	nodes := func(name string) []string {
		kids, _, err := admin.Children(zklease.ParentPath(root, name))
		if err != nil {
			t.Fatalf("list: %v", err)
		}
		return kids
	}
	var owners atomic.Int32
	freeNow := func(t *testing.T, name string) {
		t.Helper()
		// A new owner each time: a released owner is refused.
		g, err := b.Acquire(testkit.Context(t), req(name, fmt.Sprintf("other-%d", owners.Add(1))))
		if err != nil {
			t.Fatalf("the name is not free after the late request (nodes %v): %v", nodes(name), err)
		}
		if err := b.Release(testkit.Context(t), g); err != nil {
			t.Fatal(err)
		}
	}

	t.Run("released", func(t *testing.T) {
		g, err := late.Acquire(testkit.Context(t), req("released", "o1"))
		if err != nil {
			t.Fatal(err)
		}
		if err := late.Release(testkit.Context(t), g); err != nil {
			t.Fatal(err)
		}
		for _, via := range []*zklease.Backend{late, b} {
			if g, err := via.Acquire(testkit.Context(t), req("released", "o1")); !errors.Is(err, lease.ErrNotAcquired) {
				t.Fatalf("Acquire of the released owner = %+v, %v; want ErrNotAcquired", g, err)
			}
		}
		freeNow(t, "released")
	})

	t.Run("abandoned, create delayed", func(t *testing.T) {
		// The parent exists, so the held write is the node's create.
		freeNow(t, "delayed")
		held, release := h.hold(opMulti)
		defer release()
		type result struct {
			g   driver.Grant
			err error
		}
		res := make(chan result, 1)
		go func() {
			g, err := late.Acquire(testkit.Context(t), req("delayed", "first"))
			res <- result{g, err}
		}()
		select {
		case <-held:
		case <-time.After(10 * time.Second):
			t.Fatal("the create was not held")
		}
		// The Manager abandons the attempt; another holder takes the name
		// and releases it, all before the create arrives.
		if err := b.Abandon(testkit.Context(t), req("delayed", "first")); err != nil {
			t.Fatalf("Abandon: %v", err)
		}
		g, err := b.Acquire(testkit.Context(t), req("delayed", "next"))
		if err != nil {
			t.Fatal(err)
		}
		if err := b.Release(testkit.Context(t), g); err != nil {
			t.Fatal(err)
		}
		release()
		r := <-res
		if !errors.Is(r.err, lease.ErrNotAcquired) {
			t.Fatalf("the late create of the abandoned owner = %+v, %v; want ErrNotAcquired", r.g, r.err)
		}
		if kids := nodes("delayed"); len(kids) != 0 {
			t.Fatalf("nodes %v left after the refused create", kids)
		}
		freeNow(t, "delayed")
	})

	t.Run("abandoned in the same backend", func(t *testing.T) {
		freeNow(t, "same")
		held, release := h.hold(opMulti)
		defer release()
		ctx, cancel := context.WithCancel(context.Background())
		errc := make(chan error, 1)
		go func() {
			_, err := late.Acquire(ctx, req("same", "first"))
			errc <- err
		}()
		<-held
		cancel() // the caller stops waiting with the create in flight
		if err := <-errc; !errors.Is(err, context.Canceled) {
			t.Fatalf("Acquire whose caller left = %v, want context.Canceled", err)
		}
		abandoned := make(chan error, 1)
		go func() { abandoned <- late.Abandon(testkit.Context(t), req("same", "first")) }()
		time.Sleep(100 * time.Millisecond) // Abandon waits behind the attempt
		release()
		if err := <-abandoned; err != nil {
			t.Fatalf("Abandon: %v", err)
		}
		if kids := nodes("same"); len(kids) != 0 {
			t.Fatalf("nodes %v left after the abandoned attempt", kids)
		}
		freeNow(t, "same")
	})
}
