package main

import (
	"context"
	"errors"
	"net"
	"sync"
	"sync/atomic"
	"time"
)

// The faults a verify worker injects into its own connections, on the
// parent's command: every connection the worker opens to the lease store
// or to the guard's store goes through a faultNet, which can drop or delay
// what passes in either direction, or reset every connection. A dropped
// request or reply is lost as in a network partition: the stream is then
// broken, so the connection is closed when the fault ends (a client whose
// own timeout fired first has closed it already). Delays keep the bytes
// and their order.

// Fault kinds a worker injects (faultCmd.Kind).
const (
	faultDropRequests  = "drop-requests"
	faultDropReplies   = "drop-replies"
	faultDelayRequests = "delay-requests"
	faultDelayReplies  = "delay-replies"
	faultReset         = "reset"
)

// Fault targets: the connections to the lease store or to the guard's.
const (
	targetLease = "lease"
	targetGuard = "guard"
)

// errInjected is the error of a connection a fault broke.
var errInjected = errors.New("connection broken by fencekit verify (injected fault)")

// netFault is a fault in force on a target's connections.
type netFault struct {
	kind    string
	until   time.Time
	latency time.Duration
}

// faultNet is the worker's network: it opens connections and injects the
// faults in force.
type faultNet struct {
	mu     sync.Mutex
	faults map[string]netFault
	conns  map[string]map[*faultConn]struct{}
	timers map[string]*time.Timer
}

func newFaultNet() *faultNet {
	return &faultNet{faults: map[string]netFault{}, conns: map[string]map[*faultConn]struct{}{}, timers: map[string]*time.Timer{}}
}

// dialer returns the dial function of target's connections.
func (n *faultNet) dialer(target string) dialFunc {
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		if f, ok := n.current(target); ok && (f.kind == faultDropRequests || f.kind == faultDropReplies) {
			// A partitioned network: the handshake gets no answer.
			t := time.NewTimer(time.Until(f.until))
			defer t.Stop()
			select {
			case <-ctx.Done():
				return nil, ctx.Err()
			case <-t.C:
				return nil, &net.OpError{Op: "dial", Net: network, Err: errInjected}
			}
		}
		c, err := (&net.Dialer{}).DialContext(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		fc := &faultConn{Conn: c, net: n, target: target}
		n.mu.Lock()
		if n.conns[target] == nil {
			n.conns[target] = map[*faultConn]struct{}{}
		}
		n.conns[target][fc] = struct{}{}
		n.mu.Unlock()
		return fc, nil
	}
}

// current returns the fault in force on target, if any.
func (n *faultNet) current(target string) (netFault, bool) {
	n.mu.Lock()
	defer n.mu.Unlock()
	f, ok := n.faults[target]
	if !ok || !time.Now().Before(f.until) {
		return netFault{}, false
	}
	return f, true
}

// inject puts a fault on target's connections for d (a reset is at once).
// A fault already in force on the target is replaced.
func (n *faultNet) inject(target, kind string, d, latency time.Duration) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if kind == faultReset {
		for c := range n.conns[target] {
			c.breakNow()
		}
		return
	}
	n.faults[target] = netFault{kind: kind, until: time.Now().Add(d), latency: latency}
	if t := n.timers[target]; t != nil {
		t.Stop()
	}
	n.timers[target] = time.AfterFunc(d, func() { n.heal(target) })
}

// heal ends the fault on target and closes the connections it broke.
func (n *faultNet) heal(target string) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if f, ok := n.faults[target]; ok && !time.Now().Before(f.until) {
		delete(n.faults, target)
	}
	for c := range n.conns[target] {
		if c.broken.Load() {
			c.breakNow()
		}
	}
}

// stop ends every fault and forgets the connections.
func (n *faultNet) stop() {
	n.mu.Lock()
	defer n.mu.Unlock()
	for _, t := range n.timers {
		t.Stop()
	}
	clear(n.faults)
}

func (n *faultNet) forget(c *faultConn) {
	n.mu.Lock()
	delete(n.conns[c.target], c)
	n.mu.Unlock()
}

// faultConn is one connection of a faultNet.
type faultConn struct {
	net.Conn
	net    *faultNet
	target string
	// broken: a fault dropped bytes of this connection's stream; it is
	// closed when the fault ends.
	broken atomic.Bool
	closed atomic.Bool
}

func (c *faultConn) Read(p []byte) (int, error) {
	for {
		n, err := c.Conn.Read(p)
		if c.closed.Load() {
			return 0, errInjected
		}
		f, ok := c.net.current(c.target)
		switch {
		case ok && f.kind == faultDropReplies && n > 0:
			c.broken.Store(true)
			if err != nil {
				return 0, err
			}
			continue // the reply is lost; wait for more, or for the close
		case ok && f.kind == faultDelayReplies && n > 0:
			time.Sleep(f.latency)
		}
		return n, err
	}
}

func (c *faultConn) Write(p []byte) (int, error) {
	if c.closed.Load() {
		return 0, errInjected
	}
	if f, ok := c.net.current(c.target); ok {
		switch f.kind {
		case faultDropRequests:
			c.broken.Store(true)
			return len(p), nil // sent into the void
		case faultDelayRequests:
			time.Sleep(f.latency)
		}
	}
	if c.broken.Load() {
		return 0, errInjected
	}
	return c.Conn.Write(p)
}

func (c *faultConn) Close() error {
	c.net.forget(c)
	c.closed.Store(true)
	return c.Conn.Close()
}

// breakNow closes the connection under its user, as a reset does.
func (c *faultConn) breakNow() {
	c.closed.Store(true)
	_ = c.Conn.Close()
}
