// Package faultnet is the network fault equipment the tests share: a
// request that reaches the server and is applied while its reply is lost,
// a request held back and delivered late, a partition. It needs only the
// standard library, so that every module's tests can use it.
//
//   - Wire wraps a client's connections (as its dial function) and loses
//     the reply to one request it picks, by the protocol's framing: the
//     server has applied the request when its reply starts, so the loss
//     happens after the fact, never instead of it.
//   - Proxy is a TCP proxy for a client that takes only an address: it
//     drops or holds what passes in either direction, and its connections
//     to the server may go through a Wire.
//   - ReplyLoser is an http.RoundTripper that sends a request, reads its
//     whole reply and loses it.
package faultnet

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"time"
)

// ErrReplyLost matches the error a Wire's connection, or a ReplyLoser,
// returns for the reply it lost.
var ErrReplyLost = errors.New("faultnet: the reply was lost (injected by the test)")

// lostEOF is what a Wire's connection returns for the reply it lost: the
// end of a connection the peer closed (it matches io.EOF, on which
// go-redis, for one, resends the command), and ErrReplyLost.
type lostEOF struct{}

func (lostEOF) Error() string { return ErrReplyLost.Error() + ": EOF" }

func (lostEOF) Is(target error) bool { return target == ErrReplyLost || target == io.EOF }

// Wire wraps the TCP connections of a client (as its dial function). It
// counts the requests the client sends (writes to the connection, so
// anything that reaches the server), and, once armed, loses one reply: it
// reads the reply (the server has applied its request by then), never
// passes it on, closes the connection and returns an error matching
// ErrReplyLost and io.EOF, as a network that failed at that moment would. Which reply is the
// protocol's business: Message frames what the server sends, Request picks
// the request and Cut recognises its reply.
type Wire struct {
	// Message reads one whole message of the server's protocol (a
	// PostgreSQL backend message, a MySQL packet). Nil: what one Read of
	// the connection returns.
	Message func(r io.Reader) ([]byte, error)
	// Request, while the wire is armed, is shown each write of the
	// client and reports whether it is the request whose reply to lose;
	// only then are that connection's messages shown to Cut. Nil: every
	// write is a candidate, and Cut sees the last one.
	Request func(b []byte) bool
	// Cut reports whether msg starts the reply to lose, given the request
	// (see Request); to lose a reply of several messages, it reads the
	// rest of it from r first. Nil: the first message after the request.
	Cut func(msg, req []byte, r io.Reader) (bool, error)
	// Hold keeps the request Request picks instead of sending it (the
	// client hears nothing until its own deadline); Held returns it, for
	// the test to deliver later. Needs Request.
	Hold bool
	// Multiplexed is for a connection that carries several calls at once
	// (HTTP/2): every request Request picks on it under an Arm is a
	// candidate, and the first reply Cut finds to any of them is lost.
	// (Another call carrying the match may be written before the picked
	// one's reply arrives, or a picked call be cancelled and never
	// answered.) Cut must then decide from msg and req alone, without
	// reading from r. Without it, the last request Request picks is the
	// one.
	Multiplexed bool
	// RefuseAfterCut, when positive, makes Dial refuse new connections
	// for that long after a reply was lost, so that a client that
	// reconnects at once meets a network that is still down.
	RefuseAfterCut time.Duration
	// Requests counts the client's writes.
	Requests atomic.Int64

	armed atomic.Bool
	arms  atomic.Int64 // Arm calls: a request picked under an earlier one is stale
	cuts  atomic.Int64

	mu          sync.Mutex
	held        []byte
	refuseUntil time.Time
}

// Arm makes the wire lose the next reply Cut picks (or, with Hold, keep
// the next request Request picks).
func (w *Wire) Arm() {
	w.arms.Add(1)
	w.armed.Store(true)
}

// Disarm makes the wire pass everything again.
func (w *Wire) Disarm() { w.armed.Store(false) }

// Armed reports whether the wire is still waiting for the reply to lose.
func (w *Wire) Armed() bool { return w.armed.Load() }

// Cuts returns how many replies the wire lost (and, with Hold, requests
// it kept) so far: a test that must have lost one checks it, so that it
// cannot pass without the fault.
func (w *Wire) Cuts() int64 { return w.cuts.Load() }

// Held returns the request the wire kept (Hold), or nil.
func (w *Wire) Held() []byte {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.held
}

// RefusingFor returns how long Dial still refuses connections.
func (w *Wire) RefusingFor() time.Duration {
	w.mu.Lock()
	defer w.mu.Unlock()
	return time.Until(w.refuseUntil)
}

// Dial dials addr and wraps the connection.
func (w *Wire) Dial(ctx context.Context, network, addr string) (net.Conn, error) {
	if wait := w.RefusingFor(); wait > 0 {
		return nil, fmt.Errorf("faultnet: refusing connections for %v (injected by the test)", wait)
	}
	c, err := (&net.Dialer{KeepAlive: 5 * time.Minute}).DialContext(ctx, network, addr)
	if err != nil {
		return nil, err
	}
	return &wireConn{Conn: c, w: w}, nil
}

// DialTimeout is Dial with a timeout instead of a context.
func (w *Wire) DialTimeout(network, addr string, timeout time.Duration) (net.Conn, error) {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	return w.Dial(ctx, network, addr)
}

type wireConn struct {
	net.Conn
	w       *Wire
	req     atomic.Pointer[request] // the request whose reply Cut looks for
	mu      sync.Mutex              // serialises reads
	pending []byte                  // the rest of the last message read
}

// request is a request a wireConn wrote: the last one (arm 0), or the one
// Request picked under the arm-th Arm.
type request struct {
	b    []byte
	arm  int64
	prev *request // the one picked before it under the same Arm (Multiplexed)
}

func (c *wireConn) Write(p []byte) (int, error) {
	c.w.Requests.Add(1)
	switch {
	case c.w.Request == nil:
		c.req.Store(&request{b: append([]byte(nil), p...)})
	case c.w.armed.Load() && c.w.Request(p):
		if c.w.Hold {
			if !c.w.armed.Swap(false) {
				break
			}
			c.w.mu.Lock()
			c.w.held = append([]byte(nil), p...)
			c.w.mu.Unlock()
			c.w.cuts.Add(1)
			return len(p), nil // nothing is sent, so nothing comes back
		}
		r := &request{b: append([]byte(nil), p...), arm: c.w.arms.Load()}
		if prev := c.req.Load(); c.w.Multiplexed && prev != nil && prev.arm == r.arm {
			r.prev = prev
		}
		c.req.Store(r)
	}
	return c.Conn.Write(p)
}

// CloseWrite shuts down the writing side, when the connection can.
func (c *wireConn) CloseWrite() error {
	if hc, ok := c.Conn.(interface{ CloseWrite() error }); ok {
		return hc.CloseWrite()
	}
	return c.Conn.Close()
}

// Read passes the server's messages on whole, showing each to Cut while
// the wire is armed and the connection carries the request.
func (c *wireConn) Read(p []byte) (int, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(c.pending) == 0 {
		var msg []byte
		if c.w.Message != nil {
			m, err := c.w.Message(c.Conn)
			if err != nil {
				return 0, err
			}
			msg = m
		} else {
			n, err := c.Conn.Read(p)
			if n == 0 {
				return 0, err
			}
			msg = p[:n]
		}
		if err := c.cut(msg); err != nil {
			return 0, err
		}
		if c.w.Message == nil {
			return len(msg), nil
		}
		c.pending = msg
	}
	n := copy(p, c.pending)
	c.pending = c.pending[n:]
	return n, nil
}

// cut loses msg, and the connection with it, if it is the reply to lose.
func (c *wireConn) cut(msg []byte) error {
	req := c.req.Load()
	if !c.w.armed.Load() || req == nil || (c.w.Request != nil && req.arm != c.w.arms.Load()) {
		return nil
	}
	cut := true
	if c.w.Cut != nil {
		cut = false
		for q := req; q != nil && !cut; q = q.prev {
			var err error
			if cut, err = c.w.Cut(msg, q.b, c.Conn); err != nil {
				return err
			}
		}
	}
	if !cut || !c.w.armed.Swap(false) {
		return nil
	}
	if c.w.Request != nil {
		c.req.Store(nil)
	}
	c.Conn.Close()
	c.w.mu.Lock()
	c.w.refuseUntil = time.Now().Add(c.w.RefuseAfterCut)
	c.w.mu.Unlock()
	c.w.cuts.Add(1)
	return lostEOF{}
}
