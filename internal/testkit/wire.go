package testkit

import (
	"context"
	"errors"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"time"
)

// ErrReplyLost is the error a Wire's connection returns when it lost a
// reply.
var ErrReplyLost = errors.New("testkit: the reply was lost (injected by the test)")

// Wire wraps the TCP connections of a database client (as its dial
// function): it counts the requests the client sends (writes to the
// connection, so anything that reaches the server), and, once armed,
// loses the first reply Cut picks: it reads that reply (the server has
// applied its statement by then), never passes it on, and closes the
// connection, as a network that failed at that moment would. The
// guards' conformance tests use it for guardtest.Config.LoseReply and
// CountIO, each with its protocol's framing.
type Wire struct {
	// Message reads one whole message of the server's protocol (a
	// PostgreSQL backend message, a MySQL packet).
	Message func(r io.Reader) ([]byte, error)
	// Cut reports whether msg starts the reply to lose, given the last
	// request the client wrote; to lose a reply of several messages, it
	// reads the rest of it from r first.
	Cut func(msg, lastRequest []byte, r io.Reader) (bool, error)
	// Requests counts the client's writes.
	Requests atomic.Int64

	armed atomic.Bool
}

// Arm makes the wire lose the next reply Cut picks.
func (w *Wire) Arm() { w.armed.Store(true) }

// Dial dials addr and wraps the connection.
func (w *Wire) Dial(ctx context.Context, network, addr string) (net.Conn, error) {
	c, err := (&net.Dialer{KeepAlive: 5 * time.Minute}).DialContext(ctx, network, addr)
	if err != nil {
		return nil, err
	}
	return &wireConn{Conn: c, w: w}, nil
}

type wireConn struct {
	net.Conn
	w       *Wire
	mu      sync.Mutex
	last    atomic.Pointer[[]byte] // the last request written
	pending []byte                 // the rest of the last message read
}

func (c *wireConn) Write(p []byte) (int, error) {
	c.w.Requests.Add(1)
	last := append([]byte(nil), p...)
	c.last.Store(&last)
	return c.Conn.Write(p)
}

// Read passes the server's messages on whole, showing each to Cut while
// the wire is armed.
func (c *wireConn) Read(p []byte) (int, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(c.pending) == 0 {
		msg, err := c.w.Message(c.Conn)
		if err != nil {
			return 0, err
		}
		if c.w.armed.Load() {
			var last []byte
			if l := c.last.Load(); l != nil {
				last = *l
			}
			cut, err := c.w.Cut(msg, last, c.Conn)
			if err != nil {
				return 0, err
			}
			if cut && c.w.armed.Swap(false) {
				c.Conn.Close()
				return 0, ErrReplyLost
			}
		}
		c.pending = msg
	}
	n := copy(p, c.pending)
	c.pending = c.pending[n:]
	return n, nil
}
