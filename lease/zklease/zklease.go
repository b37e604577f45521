package zklease

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-zookeeper/zk"

	"github.com/fencekit/fencekit/lease/driver"
)

var (
	_ driver.Backend      = (*Backend)(nil)
	_ driver.Watcher      = (*Backend)(nil)
	_ driver.BatchRenewer = (*Backend)(nil)
)

var (
	// ErrInvalidOptions is matched by New's error for unusable options or
	// servers; the error lists every problem.
	ErrInvalidOptions = errors.New("zklease: invalid options")

	// ErrClosed is returned by every call after Close, and is the cause of
	// the loss of every lease the backend held when it was closed.
	ErrClosed = errors.New("zklease: backend closed")

	// ErrSessionExpired is the cause of the loss of every lease of a
	// session that the ensemble expired (the client did not reach a server
	// within the session timeout, or the session was closed at the store).
	// It matches driver.ErrExpiredAtStore, so such leases end as
	// lease.LostExpired.
	ErrSessionExpired = fmt.Errorf("zklease: ZooKeeper session expired: %w", driver.ErrExpiredAtStore)

	// ErrSessionReplaced is the cause of the loss of every lease of a
	// session when the client is found on a different session (go-zookeeper
	// opens a new session after an expiry and carries on): the old
	// session's nodes are gone. It matches driver.ErrExpiredAtStore.
	ErrSessionReplaced = fmt.Errorf("zklease: ZooKeeper session replaced by a new one: %w", driver.ErrExpiredAtStore)

	// ErrSessionTimeout is returned by Acquire and Renew when the server
	// the client is connected to granted a session timeout shorter than the
	// lease's TTL, so the session could end before the lease's deadline.
	// Lower the Manager's TTL, or raise the servers' maxSessionTimeout.
	ErrSessionTimeout = errors.New("zklease: the session timeout the server granted is shorter than the TTL")
)

// Backend holds leases in ZooKeeper, over one go-zookeeper connection and
// session. It is safe for concurrent use. Call Close when done: it ends the
// session, which deletes every node of it at the store.
type Backend struct {
	o      Options
	conn   *zk.Conn
	log    *slog.Logger
	closed chan struct{} // closed by Close
	wg     sync.WaitGroup

	mu        sync.Mutex
	isClosed  bool
	session   int64         // the session the client is on; 0 before the first one or right after an expiry
	passwd    []byte        // its password (for tests that end it at the store)
	server    string        // the server of the last connect response
	granted   time.Duration // the session timeout the last server granted; 0 until known
	names     map[string]*nameState
	ready     chan struct{}         // closed while the client is on a session
	watching  map[string]watchEntry // by watched node path
	contended map[string]contention // names found held recently (see noteContention)
	lineWatch map[string]*nameState // paths watched for queued waiters, by path (line.go)

	notified atomic.Int64 // predecessor notifications that woke a ticket (for tests)

	endedOwners endedState // the owners this backend recorded as ended (ended.go)

	doomed   int64     // a session being ended at the store (blindclose.go): no grant is made or renewed on it
	doomedAt time.Time // when its end was sent
}

// New returns a Backend connected to the ZooKeeper ensemble at servers
// (host:port each). The connection and its session are set up in the
// background (go-zookeeper's zk.Connect); the first request waits for them.
// It does no I/O itself and fails only on bad input, with an error matching
// ErrInvalidOptions that lists every problem.
//
// New takes server addresses rather than a *zk.Conn because the backend
// must read, from the server's answer on every connection, the session
// timeout the server granted and the session ID, which go-zookeeper does not
// expose; it does so through the dialer (Options.Dialer) it gives the
// client.
func New(servers []string, opts ...Option) (*Backend, error) {
	var o Options
	for _, opt := range opts {
		if opt != nil {
			opt(&o)
		}
	}
	o = o.withDefaults()
	if err := o.validate(servers); err != nil {
		return nil, err
	}
	b := &Backend{o: o, log: o.Logger, closed: make(chan struct{}), names: map[string]*nameState{}, ready: make(chan struct{}), watching: map[string]watchEntry{}, contended: map[string]contention{}, lineWatch: map[string]*nameState{}}
	conn, _, err := zk.Connect(append([]string(nil), servers...), o.SessionTimeout,
		zk.WithDialer(b.dial),
		zk.WithEventCallback(b.onEvent),
		zk.WithLogger(zkLogger{o.Logger}),
		zk.WithLogInfo(false))
	if err != nil {
		return nil, fmt.Errorf("zklease: connect: %w", err)
	}
	b.conn = conn
	return b, nil
}

// Limits implements driver.Backend. A lease's TTL is enforced by the backend
// (it deletes a grant that was not renewed within its TTL) and bounded by
// the session: TTLs are whole milliseconds from MinTTL to
// Options.SessionTimeout. The Manager renews the leases: a session alive
// does not mean that the holder's work is. It keeps waiters in line
// (Queues; see the package doc).
func (b *Backend) Limits() driver.Limits {
	return driver.Limits{MinTTL: MinTTL, MaxTTL: b.o.SessionTimeout, Resolution: time.Millisecond, Queues: true}
}

// Options returns the backend's options, with defaults filled in.
func (b *Backend) Options() Options {
	o := b.o
	o.ACL = append([]zk.ACL(nil), o.ACL...)
	return o
}

// Session returns the ID of the ZooKeeper session the client is on, and the
// session timeout the server granted it; zeros before the first session is
// established and right after one expired.
func (b *Backend) Session() (id int64, timeout time.Duration) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.session, b.granted
}

// Close ends the session (every node of it is deleted at the store, so
// every lease of this backend ends, reported as lost with ErrClosed), stops
// the backend's goroutines and closes the connection. It waits for
// operations in flight to finish. Calling it again does nothing.
func (b *Backend) Close() error {
	b.mu.Lock()
	if b.isClosed {
		b.mu.Unlock()
		return nil
	}
	b.isClosed = true
	close(b.closed)
	lost := b.dropSessionLocked(-1)
	b.mu.Unlock()
	for _, n := range lost {
		n.Lost(ErrClosed)
	}
	b.stopEnded()
	b.conn.Close()
	b.wg.Wait()
	return nil
}

// zkLogger sends go-zookeeper's log lines to slog at debug level.
type zkLogger struct{ l *slog.Logger }

func (z zkLogger) Printf(format string, args ...any) {
	z.l.Debug("zklease: go-zookeeper: " + fmt.Sprintf(format, args...))
}

// onEvent is go-zookeeper's event callback. It must not block.
func (b *Backend) onEvent(ev zk.Event) {
	if ev.Type != zk.EventSession && ev.Path != "" {
		b.onNodeEvent(ev.Path, ev.Type)
		return
	}
	if ev.Type == zk.EventSession && ev.State == zk.StateExpired {
		b.mu.Lock()
		old := b.session
		var (
			lost  []driver.Notifier
			cause error
		)
		if old != 0 {
			b.session = 0
			b.setReadyLocked(false)
			lost, cause = b.dropSessionLocked(old), ErrSessionExpired
		}
		b.mu.Unlock()
		b.reportLost(old, cause, lost)
	}
}

// onConnectResponse records the server's answer to a connect request: the
// session it put the client on (0: the session asked for has expired) and
// the timeout it granted. It runs on go-zookeeper's connection goroutine
// before the client itself reads the answer, so that no request of a new
// session is answered before the old session's leases are lost.
func (b *Backend) onConnectResponse(server string, id int64, timeout time.Duration, passwd []byte) {
	b.mu.Lock()
	old := b.session
	var (
		lost  []driver.Notifier
		cause error
	)
	switch {
	case id == 0 && old != 0:
		lost, cause = b.dropSessionLocked(old), ErrSessionExpired
	case old != 0 && id != old:
		lost, cause = b.dropSessionLocked(old), ErrSessionReplaced
	}
	b.session, b.passwd, b.server = id, append([]byte(nil), passwd...), server
	if id != 0 {
		b.granted = timeout
	}
	b.setReadyLocked(id != 0)
	b.mu.Unlock()
	if old != id && id != 0 {
		b.log.Debug("zklease: session established", "session", fmt.Sprintf("0x%x", id), "timeout", timeout, "server", server, "previous", fmt.Sprintf("0x%x", old))
	}
	b.reportLost(old, cause, lost)
}

// reportLost reports the leases of a session that ended as lost, and
// warns.
func (b *Backend) reportLost(session int64, cause error, lost []driver.Notifier) {
	if cause == nil {
		return
	}
	b.log.Warn("zklease: session ended; its leases are lost", "session", fmt.Sprintf("0x%x", session), "leases", len(lost), "cause", cause)
	for _, n := range lost {
		n.Lost(cause)
	}
}

// setReadyLocked opens or closes the gate Ready waits on; b.mu must be held.
func (b *Backend) setReadyLocked(on bool) {
	select {
	case <-b.ready:
		if !on {
			b.ready = make(chan struct{})
		}
	default:
		if on {
			close(b.ready)
		}
	}
}

// Ready waits until the client is on a session (New connects in the
// background), or until ctx ends or the backend is closed (ErrClosed). A
// first Acquire does not need it: it waits for the session itself, and
// the Manager counts that wait against the lease's TTL.
func (b *Backend) Ready(ctx context.Context) error {
	b.mu.Lock()
	ready := b.ready
	b.mu.Unlock()
	select {
	case <-ready:
		return nil
	case <-b.closed:
		return ErrClosed
	case <-ctx.Done():
		return fmt.Errorf("zklease: waiting for a session: %w", ctx.Err())
	}
}

// currentSession returns the session and its granted timeout.
func (b *Backend) currentSession() (int64, time.Duration) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.session, b.granted
}

// checkSession returns an error unless the client is on session id and the
// server granted it at least ttl.
func (b *Backend) checkSession(id int64, ttl time.Duration) error {
	b.mu.Lock()
	cur, granted, doomed := b.session, b.granted, b.doomed
	b.mu.Unlock()
	switch {
	case b.isClosedNow():
		return ErrClosed
	case cur == 0 || cur != id || id == doomed:
		return fmt.Errorf("%w (session 0x%x, the client is now on 0x%x)", ErrSessionReplaced, id, cur)
	case granted < ttl:
		return fmt.Errorf("%w: the server granted %v, the lease needs %v", ErrSessionTimeout, granted, ttl)
	}
	return nil
}

func (b *Backend) isClosedNow() bool {
	select {
	case <-b.closed:
		return true
	default:
		return false
	}
}

// dial opens a connection for go-zookeeper, wrapped so that the backend
// reads the connect response.
func (b *Backend) dial(network, address string, timeout time.Duration) (net.Conn, error) {
	c, err := b.o.Dialer(network, address, timeout)
	if err != nil {
		return nil, err
	}
	return &sniffConn{Conn: c, b: b, server: address}, nil
}

// sniffConn passes everything through, and parses the first frame the
// server sends: the connect response (protocol version int32, timeout int32
// in ms, session ID int64, password as int32 length + bytes, then an
// optional read-only flag), preceded by its int32 length, all big-endian
// (ZooKeeper's jute encoding).
type sniffConn struct {
	net.Conn
	b      *Backend
	server string
	buf    []byte
	done   bool
}

func (c *sniffConn) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	if !c.done && n > 0 {
		c.buf = append(c.buf, p[:n]...)
		c.parse()
	}
	return n, err
}

func (c *sniffConn) parse() {
	if len(c.buf) < 4 {
		return
	}
	size := int(binary.BigEndian.Uint32(c.buf))
	if size > 1<<16 || size < 20 {
		// Not a connect response: let go-zookeeper report it.
		c.done, c.buf = true, nil
		return
	}
	if len(c.buf) < 4+size {
		return
	}
	f := c.buf[4 : 4+size]
	timeout := time.Duration(int32(binary.BigEndian.Uint32(f[4:8]))) * time.Millisecond
	id := int64(binary.BigEndian.Uint64(f[8:16]))
	var passwd []byte
	if pl := int(int32(binary.BigEndian.Uint32(f[16:20]))); pl > 0 && 20+pl <= len(f) {
		passwd = f[20 : 20+pl]
	}
	c.done = true
	c.b.onConnectResponse(c.server, id, timeout, passwd)
	c.buf = nil
}

// ctxErr wraps ctx.Err() for the operation op on name.
func ctxErr(op, name string, ctx context.Context) error {
	return fmt.Errorf("zklease: %s %q: %w", op, name, ctx.Err())
}
