package zklease_test

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
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

// lateDialer's connections deliver everything the client writes to the
// server delay late, in order, without slowing the client down (a link with
// a long latency, as toxiproxy's latency toxic on the upstream stream); the
// server's answers come back at once. When the client closes a connection,
// its reads end at once and the writes still in the link are delivered
// before the server sees the close. It logs what the connections carry
// (wire).
type lateDialer struct {
	delay time.Duration
	stop  chan struct{} // closed when the test ends: the links close
	wire  wireLog
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
	lc := &lateConn{Conn: c, delay: d.delay, q: make(chan lateChunk, 4096), stop: d.stop, wire: &d.wire, id: d.wire.newConn()}
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

	wire *wireLog
	id   int

	mu     sync.Mutex
	closed bool
	out    frameReader // what the client wrote (under mu)

	in frameReader // what the client read (its one reading goroutine)
}

func (c *lateConn) Write(p []byte) (int, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return 0, net.ErrClosed
	}
	now := time.Now()
	c.q <- lateChunk{at: now.Add(c.delay), data: append([]byte(nil), p...)}
	for _, f := range c.out.feed(p) {
		c.wire.add(requestEvent(c.id, now, f))
	}
	return len(p), nil
}

// Read reads what the server sent, and logs each answer when it has been
// read whole.
func (c *lateConn) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	if n > 0 {
		now := time.Now()
		for _, f := range c.in.feed(p[:n]) {
			c.wire.add(answerEvent(c.id, now, f))
		}
	}
	return n, err
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

// The ZooKeeper protocol as the wire log reads it: each message is a
// 4-byte big-endian length and a body. A connection's first message each
// way is the connect request and response; then a request is xid, opcode
// and the operation, an answer xid, zxid, an error code and the result.
const (
	zkOpCreate      = 1
	zkOpDelete      = 2
	zkOpGetChildren = 8
	zkOpChildren2   = 12
	zkOpMulti       = 14
	zkOpClose       = -11
)

// frameReader cuts a byte stream into ZooKeeper messages.
type frameReader struct {
	buf    []byte
	frames int // messages cut so far
}

type frame struct {
	first bool // the connection's first message: a connect
	body  []byte
}

func (r *frameReader) feed(p []byte) []frame {
	r.buf = append(r.buf, p...)
	var out []frame
	for len(r.buf) >= 4 {
		n := int(binary.BigEndian.Uint32(r.buf))
		if len(r.buf) < 4+n {
			break
		}
		out = append(out, frame{first: r.frames == 0, body: append([]byte(nil), r.buf[4:4+n]...)})
		r.frames++
		r.buf = r.buf[4+n:]
	}
	return out
}

// zkString reads a jute string (a 4-byte length, then the bytes).
func zkString(b []byte) string {
	if len(b) < 4 {
		return ""
	}
	n := int(int32(binary.BigEndian.Uint32(b)))
	if n < 0 || len(b) < 4+n {
		return ""
	}
	return string(b[4 : 4+n])
}

// wireEvent is a request the client wrote (when it wrote it) or an answer
// it read (when it had read it whole).
type wireEvent struct {
	at      time.Time
	conn    int
	sent    bool // a request; else an answer
	connect bool // a connect request or response: session is set
	session int64
	xid     int32
	op      int32  // a request's opcode
	path    string // a request's path: a multi's first create, a delete, a listing
	err     int32  // an answer's error code
	result  []byte // an answer's result
}

func (e wireEvent) String() string {
	at := e.at.Format("15:04:05.000")
	switch {
	case e.connect && e.sent:
		return fmt.Sprintf("%s conn %d connect request, session 0x%x", at, e.conn, e.session)
	case e.connect:
		return fmt.Sprintf("%s conn %d connect answer, session 0x%x", at, e.conn, e.session)
	case e.sent:
		return fmt.Sprintf("%s conn %d request xid %d op %d %s", at, e.conn, e.xid, e.op, e.path)
	}
	return fmt.Sprintf("%s conn %d answer xid %d err %d", at, e.conn, e.xid, e.err)
}

func requestEvent(conn int, at time.Time, f frame) wireEvent {
	e := wireEvent{at: at, conn: conn, sent: true}
	b := f.body
	if f.first {
		// protocolVersion int32, lastZxidSeen int64, timeOut int32,
		// sessionId int64, ...
		e.connect = true
		if len(b) >= 24 {
			e.session = int64(binary.BigEndian.Uint64(b[16:24]))
		}
		return e
	}
	if len(b) < 8 {
		return e
	}
	e.xid, e.op = int32(binary.BigEndian.Uint32(b)), int32(binary.BigEndian.Uint32(b[4:]))
	b = b[8:]
	switch e.op {
	case zkOpMulti:
		// The first operation: a header (type int32, done bool, err
		// int32), then, for a create, its path.
		if len(b) >= 9 && int32(binary.BigEndian.Uint32(b)) == zkOpCreate {
			e.path = zkString(b[9:])
		}
	case zkOpDelete, zkOpGetChildren, zkOpChildren2:
		e.path = zkString(b)
	}
	return e
}

func answerEvent(conn int, at time.Time, f frame) wireEvent {
	e := wireEvent{at: at, conn: conn}
	b := f.body
	if f.first {
		// protocolVersion int32, timeOut int32, sessionId int64 (0: the
		// session asked for has ended), ...
		e.connect = true
		if len(b) >= 16 {
			e.session = int64(binary.BigEndian.Uint64(b[8:16]))
		}
		return e
	}
	if len(b) < 16 {
		return e
	}
	e.xid, e.err = int32(binary.BigEndian.Uint32(b)), int32(binary.BigEndian.Uint32(b[12:]))
	e.result = b[16:]
	return e
}

// createdNode reads the answer to a multi whose first operation is a
// create: the node it made, or "" when the transaction failed.
func createdNode(result []byte) string {
	if len(result) < 9 || int32(binary.BigEndian.Uint32(result)) != zkOpCreate {
		return ""
	}
	return zkString(result[9:])
}

// wireLog is what a client's connections carried, in the order the client
// wrote and read it.
type wireLog struct {
	mu     sync.Mutex
	conns  int
	events []wireEvent
}

func (l *wireLog) newConn() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.conns++
	return l.conns
}

func (l *wireLog) add(e wireEvent) {
	l.mu.Lock()
	l.events = append(l.events, e)
	l.mu.Unlock()
}

func (l *wireLog) snapshot() []wireEvent {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]wireEvent(nil), l.events...)
}

// attemptLog is a Backend that notes when each caller of Acquire started
// and when its context ended (it left).
type attemptLog struct {
	*zklease.Backend
	mu       sync.Mutex
	attempts []attemptTimes
}

type attemptTimes struct{ start, left time.Time }

func (a *attemptLog) Acquire(ctx context.Context, req driver.Request) (driver.Grant, error) {
	a.mu.Lock()
	i := len(a.attempts)
	a.attempts = append(a.attempts, attemptTimes{start: time.Now()})
	a.mu.Unlock()
	context.AfterFunc(ctx, func() {
		a.mu.Lock()
		a.attempts[i].left = time.Now()
		a.mu.Unlock()
	})
	return a.Backend.Acquire(ctx, req)
}

// leftBefore reports whether the caller of the attempt that sent a
// request at sent had left by at (false when it is not known to have).
func (a *attemptLog) leftBefore(sent, at time.Time) bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	for i := len(a.attempts) - 1; i >= 0; i-- {
		if !a.attempts[i].start.After(sent) {
			l := a.attempts[i].left
			return !l.IsZero() && !l.After(at)
		}
	}
	return false
}

// How a create of W's was settled (lateCreate.how).
const (
	failedCreate    = "failed, no node"
	givenBackAtOnce = "given back at once"
	givenBack       = "given back"
	sessionClosed   = "its session closed"
	sessionEnded    = "its session ended"
	inFlight        = "in flight at the end"
)

// lateCreate is a create of one of W's nodes in the name's queue, as W's
// connections carried it, and how the node was settled.
type lateCreate struct {
	req     wireEvent
	session int64  // of the connection it went out on
	answer  string // when W read its answer ("" none)
	how     string
	by      string // the request or answer that settled it
	problem string // what the mechanism should have done and did not
	ended   bool   // W has learnt that the session it closed is gone
}

// settleCreates finds W's creates under parent in its wire log, and how
// each node was settled: see TestLateWaiterDoesNotKeepOthersOut. left
// reports whether the caller of the attempt that sent a request at sent
// had left by at.
func settleCreates(ev []wireEvent, parent string, ttl time.Duration, left func(sent, at time.Time) bool) []lateCreate {
	connSession := map[int]int64{} // the session a connection asked for
	cur := make([]int64, len(ev))  // the session of each event's connection then
	now := map[int]int64{}
	var creates []int
	for i, e := range ev {
		switch {
		case e.connect && e.sent:
			connSession[e.conn] = e.session
		case e.connect:
			now[e.conn] = e.session
		case e.sent && e.op == zkOpMulti && strings.HasPrefix(e.path, parent+"/"):
			creates = append(creates, i)
		}
		cur[i] = now[e.conn]
	}
	var out []lateCreate
	for n, i := range creates {
		c := lateCreate{req: ev[i], session: cur[i], how: inFlight}
		next := len(ev)
		if n+1 < len(creates) {
			next = creates[n+1]
		}
		ans := -1
		for j := i + 1; j < len(ev); j++ {
			if e := ev[j]; !e.sent && !e.connect && e.conn == c.req.conn && e.xid == c.req.xid {
				ans = j
				break
			}
		}
		if ans >= 0 {
			c.answer = ev[ans].at.Format("15:04:05.000")
			if ev[ans].err != 0 || createdNode(ev[ans].result) == "" {
				c.how = failedCreate
				out = append(out, c)
				continue
			}
		}
		// The first request or answer after the create that ends its
		// node: a delete of it, a close of its session, or a connect
		// answer saying that its session has ended.
		s := -1
		for j := i + 1; j < len(ev) && s < 0; j++ {
			e := ev[j]
			switch {
			case e.sent && e.op == zkOpDelete && strings.HasPrefix(e.path, c.req.path):
				s, c.how = j, givenBack
			case e.sent && e.op == zkOpClose && connSession[e.conn] == c.session:
				s, c.how = j, sessionClosed
			case e.connect && !e.sent && e.session == 0 && connSession[e.conn] == c.session:
				s, c.how = j, sessionEnded
			}
		}
		switch {
		case s < 0 && next < len(ev):
			c.problem = "W sent its next create while this node was never given back nor its session ended"
		case s < 0:
			// Still in flight when the log was taken.
		case s > next:
			c.by = ev[s].String()
			c.problem = "W sent its next create before it gave this node back or its session ended"
		case ans >= 0 && s > ans && left(ev[i].at, ev[ans].at):
			// Its caller had left when the answer came: the node must be
			// given back at once, without waiting for any other answer
			// (a listing of the queue first would keep it at the head
			// for one more of W's late round trips).
			c.by = ev[s].String()
			if c.how != givenBack {
				c.problem = "the answer came after its caller had left, and W did not give the node back"
				break
			}
			for j := ans + 1; j < s; j++ {
				if e := ev[j]; !e.sent && !e.connect && e.xid > 0 {
					c.problem = fmt.Sprintf("the answer came after its caller had left, and W waited for another answer (%v) before it gave the node back", e)
					break
				}
			}
			if c.problem == "" {
				c.how = givenBackAtOnce
			}
		case c.how == sessionClosed && ev[s].at.Sub(ev[i].at) < ttl:
			// Never earlier: a grant on the session might still be valid.
			c.by = ev[s].String()
			c.problem = fmt.Sprintf("W closed the session %v after the create, sooner than the TTL %v", ev[s].at.Sub(ev[i].at), ttl)
		default:
			c.by = ev[s].String()
		}
		for j := s + 1; s >= 0 && j < len(ev) && !c.ended; j++ {
			e := ev[j]
			c.ended = e.connect && !e.sent && e.session == 0 && connSession[e.conn] == c.session
		}
		out = append(out, c)
	}
	return out
}

func (c lateCreate) String() string {
	s := fmt.Sprintf("create %s (session 0x%x), answer %q: %s", c.req, c.session, c.answer, c.how)
	if c.by != "" {
		s += ", by " + c.by
	}
	if c.ended {
		s += " (the session's end seen)"
	}
	if c.problem != "" {
		s += "; PROBLEM: " + c.problem
	}
	return s
}

func countHow(cs []lateCreate, how string) int {
	n := 0
	for _, c := range cs {
		if c.how == how && c.problem == "" && (how != sessionClosed || c.ended) {
			n++
		}
	}
	return n
}

// A waiter whose every request reaches ZooKeeper late (a late acquire
// seen from the other side) must not keep the others out. W's requests
// are delayed by more than the lease's validity, so its Manager abandons
// every attempt and W never holds the lease; meanwhile B acquires
// (blocking), holds 50 ms and releases, over and over.
//
// What keeps a late W's node from heading the queue for long is checked
// where it happens, on W's wire (every request when W wrote it, every
// answer when W read it), not by how long B waited, which grows with the
// machine's load. Each create of W's in the queue must be settled before
// W sends another, and:
//   - a create whose answer came after its caller had left is given back
//     at once: W deletes the node before it reads any other answer. The
//     node then heads the queue for one of W's request delays at most,
//     from its create's arrival to its delete's. (Before, W listed the
//     queue first and then gave the node back: two delays.)
//   - a create whose answer never came, its node's name unknown (the
//     delay is over go-zookeeper's receive timeout, 2/3 of the session
//     timeout, and every connection is dropped before its first answer),
//     is settled by ending its session at the store: a close of the
//     session, sent no sooner than a TTL after the create (a grant on the
//     session might be valid until then). Before, the node headed the
//     queue for good, W's reconnects keeping its session alive.
//
// B's each acquire must succeed within 30 s (a queue blocked for good).
// A run ends with B's first acquire after W's creates have shown the
// subtest's mechanism: two given back at once (delay 1.5 s); one session
// closed, and W told by the ensemble that it has ended (delay 2.5 s), so
// that B acquires after the close has removed W's node.
//
// Checked against the two old behaviours: with the give-back after a
// listing of the queue restored, the first subtest fails (W waited for
// the listing's answer); with endSessionBlind a no-op, the second fails
// (B is kept out, and W never settles its create).
func TestLateWaiterDoesNotKeepOthersOut(t *testing.T) {
	for _, tc := range []struct {
		delay time.Duration
		want  string
		n     int
	}{
		{1500 * time.Millisecond, givenBackAtOnce, 2},
		{2500 * time.Millisecond, sessionClosed, 1},
	} {
		t.Run(tc.delay.String(), func(t *testing.T) { testLateWaiter(t, tc.delay, tc.want, tc.n) })
	}
}

func testLateWaiter(t *testing.T, delay time.Duration, want string, wantN int) {
	ens := zktest.Shared(t, 1)
	root := zktest.Root(t)
	const (
		ttl     = time.Second
		session = 3 * time.Second
		name    = "late-waiter"
	)
	late := newLateDialer(t, delay)
	bW := newBackend(t, ens.Servers(), zklease.WithRoot(root), zklease.WithSessionTimeout(session), zklease.WithIdentity("w"),
		zklease.WithDialer(late.dial))
	bB := newBackend(t, ens.Servers(), zklease.WithRoot(root), zklease.WithSessionTimeout(session), zklease.WithIdentity("b"))
	aW := &attemptLog{Backend: bW}
	mW := testkit.NewManager(t, aW, ttl, lease.WithPollInterval(100*time.Millisecond))
	mB := testkit.NewManager(t, bB, ttl, lease.WithPollInterval(100*time.Millisecond))
	admin := adminConn(t, ens.Servers())
	parent := zklease.ParentPath(root, name)
	settle := func() []lateCreate { return settleCreates(late.wire.snapshot(), parent, ttl, aW.leftBefore) }

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
	stopW := sync.OnceFunc(func() {
		wcancel()
		<-wdone
	})
	defer stopW()

	// B acquires once more after W's creates have shown the mechanism.
	var waits []time.Duration
	for last := false; !last; {
		cs := settle()
		if slices.ContainsFunc(cs, func(c lateCreate) bool { return c.problem != "" }) {
			break
		}
		last = countHow(cs, want) >= wantN
		if len(waits) > 400 {
			t.Fatalf("W's creates did not show %q %d times in %d of B's acquires: %v", want, wantN, len(waits), cs)
		}
		s := time.Now()
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		l, err := mB.Acquire(ctx, name)
		cancel()
		w := time.Since(s)
		if err != nil {
			dumpQueue(t, admin, parent, bW, bB)
			t.Fatalf("B was kept out for %v: %v (waits so far %v); W's creates: %v", w.Round(time.Millisecond), err, waits, settle())
		}
		waits = append(waits, w.Round(time.Millisecond))
		time.Sleep(50 * time.Millisecond)
		_ = l.Release(context.Background())
		time.Sleep(200 * time.Millisecond)
	}
	stopW()
	creates := settle()
	t.Logf("TTL %v, W's requests %v late: B's waits %v", ttl, delay, waits)
	for _, c := range creates {
		if c.problem != "" {
			t.Errorf("W's %v", c)
		} else {
			t.Logf("W's %v", c)
		}
	}
	if t.Failed() {
		for _, e := range late.wire.snapshot() {
			t.Logf("  %v", e)
		}
	}
}

// dumpQueue logs the queue of a lease name, for a failure's diagnosis.
func dumpQueue(t *testing.T, c adminClient, parent string, bs ...*zklease.Backend) {
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
