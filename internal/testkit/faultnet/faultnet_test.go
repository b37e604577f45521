package faultnet

import (
	"bufio"
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
)

// lineServer applies each line it reads (it counts it) and then answers
// "ok <line>".
type lineServer struct {
	addr    string
	applied sync.Map // line -> true
	count   atomic.Int64
}

func startLineServer(t *testing.T) *lineServer {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := &lineServer{addr: ln.Addr().String()}
	var wg sync.WaitGroup
	var mu sync.Mutex
	var conns []net.Conn
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, c)
			mu.Unlock()
			wg.Add(1)
			go func() {
				defer wg.Done()
				r := bufio.NewReader(c)
				for {
					line, err := r.ReadString('\n')
					if err != nil {
						return
					}
					s.applied.Store(line, true)
					s.count.Add(1)
					if _, err := io.WriteString(c, "ok "+line); err != nil {
						return
					}
				}
			}()
		}
	}()
	t.Cleanup(func() {
		_ = ln.Close()
		mu.Lock()
		for _, c := range conns {
			_ = c.Close()
		}
		mu.Unlock()
		wg.Wait()
	})
	return s
}

func (s *lineServer) wasApplied(line string) bool {
	_, ok := s.applied.Load(line)
	return ok
}

// call writes line on c and reads the answer.
func call(c net.Conn, r *bufio.Reader, line string) (string, error) {
	if _, err := io.WriteString(c, line); err != nil {
		return "", err
	}
	return r.ReadString('\n')
}

// dial connects to addr, through w unless w is nil; the connection is
// closed when the test ends.
func dial(t *testing.T, w *Wire, addr string) net.Conn {
	t.Helper()
	d := net.DialTimeout
	if w != nil {
		d = w.DialTimeout
	}
	c, err := d("tcp", addr, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

func lineWire(want string) *Wire {
	return &Wire{Request: func(b []byte) bool { return string(b) == want }}
}

func TestWireLosesTheReplyAfterTheServerApplied(t *testing.T) {
	s := startLineServer(t)
	w := lineWire("b\n")
	c := dial(t, w, s.addr)
	r := bufio.NewReader(c)
	w.Arm()
	if got, err := call(c, r, "a\n"); got != "ok a\n" || err != nil {
		t.Fatalf("a request Request does not pick = %q, %v; want its reply", got, err)
	}
	got, err := call(c, r, "b\n")
	if !errors.Is(err, ErrReplyLost) || !errors.Is(err, io.EOF) {
		t.Fatalf("the picked request = %q, %v; want ErrReplyLost, as io.EOF", got, err)
	}
	if !s.wasApplied("b\n") || w.Cuts() != 1 || w.Armed() {
		t.Fatalf("applied %v, cuts %d, armed %v; want the request applied, one cut, disarmed", s.wasApplied("b\n"), w.Cuts(), w.Armed())
	}
	if w.Requests.Load() != 2 {
		t.Fatalf("%d requests counted, want 2", w.Requests.Load())
	}
}

func TestWireRefusesConnectionsAfterACut(t *testing.T) {
	s := startLineServer(t)
	w := lineWire("b\n")
	w.RefuseAfterCut = time.Hour
	c := dial(t, w, s.addr)
	w.Arm()
	if _, err := call(c, bufio.NewReader(c), "b\n"); !errors.Is(err, ErrReplyLost) {
		t.Fatalf("the picked request = %v; want ErrReplyLost", err)
	}
	if c2, err := w.DialTimeout("tcp", s.addr, 5*time.Second); err == nil {
		c2.Close()
		t.Fatal("Dial after the cut succeeded; want it refused")
	}
}

func TestWireHoldsTheRequest(t *testing.T) {
	s := startLineServer(t)
	w := lineWire("b\n")
	w.Hold = true
	c := dial(t, w, s.addr)
	w.Arm()
	if _, err := io.WriteString(c, "b\n"); err != nil {
		t.Fatal(err)
	}
	// A request after it on the same connection is answered, so the held
	// one was never sent.
	if got, err := call(c, bufio.NewReader(c), "c\n"); got != "ok c\n" || err != nil {
		t.Fatalf("the next request = %q, %v", got, err)
	}
	if s.wasApplied("b\n") || string(w.Held()) != "b\n" || w.Cuts() != 1 {
		t.Fatalf("applied %v, held %q, cuts %d; want it held, not sent", s.wasApplied("b\n"), w.Held(), w.Cuts())
	}
}

func TestProxyThroughAWire(t *testing.T) {
	s := startLineServer(t)
	w := lineWire("b\n")
	px := StartProxy(t, s.addr, w)
	c := dial(t, nil, px.Addr)
	r := bufio.NewReader(c)
	if got, err := call(c, r, "a\n"); got != "ok a\n" || err != nil {
		t.Fatalf("through the proxy = %q, %v", got, err)
	}
	w.Arm()
	if got, err := call(c, r, "b\n"); err == nil {
		t.Fatalf("the picked request through the proxy = %q; want the connection broken", got)
	}
	if !s.wasApplied("b\n") || w.Cuts() != 1 {
		t.Fatalf("applied %v, cuts %d", s.wasApplied("b\n"), w.Cuts())
	}
}

func TestProxyHoldsAndRestores(t *testing.T) {
	s := startLineServer(t)
	px := StartProxy(t, s.addr, nil)
	c := dial(t, nil, px.Addr)
	r := bufio.NewReader(c)
	px.HoldRequests()
	if _, err := io.WriteString(c, "late\n"); err != nil {
		t.Fatal(err)
	}
	_ = c.SetReadDeadline(time.Now().Add(200 * time.Millisecond))
	if _, err := r.ReadString('\n'); !errors.Is(err, context.DeadlineExceeded) && !isTimeout(err) {
		t.Fatalf("a held request was answered: %v", err)
	}
	if s.wasApplied("late\n") {
		t.Fatal("the held request reached the server")
	}
	px.Restore()
	_ = c.SetReadDeadline(time.Time{})
	if got, err := r.ReadString('\n'); got != "ok late\n" || err != nil {
		t.Fatalf("after Restore = %q, %v; want the held request delivered", got, err)
	}
}

func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

func TestReplyLoser(t *testing.T) {
	var handled atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { handled.Add(1) }))
	t.Cleanup(srv.Close)
	tr := &http.Transport{}
	t.Cleanup(tr.CloseIdleConnections)
	l := &ReplyLoser{Next: tr, Lose: func(r *http.Request) bool { return strings.HasSuffix(r.URL.Path, "/lose") }}
	c := &http.Client{Transport: l}
	resp, err := c.Get(srv.URL + "/keep")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	_, err = c.Get(srv.URL + "/lose")
	var oe *net.OpError
	if !errors.Is(err, ErrReplyLost) || !errors.Is(err, syscall.ECONNRESET) || !errors.As(err, &oe) || oe.Op != "read" {
		t.Fatalf("a lost reply = %v; want a read reset matching ErrReplyLost", err)
	}
	if handled.Load() != 2 || l.Lost() != 1 {
		t.Fatalf("%d handled, %d lost; want 2 and 1", handled.Load(), l.Lost())
	}
}

func TestH2StreamOf(t *testing.T) {
	frame := func(typ byte, stream uint32, payload string) []byte {
		n := len(payload)
		return append([]byte{byte(n >> 16), byte(n >> 8), byte(n), typ, 0, byte(stream >> 24), byte(stream >> 16), byte(stream >> 8), byte(stream)}, payload...)
	}
	b := []byte(h2Preface)
	b = append(b, frame(h2Headers, 3, "key")...)
	b = append(b, frame(h2Data, 3, "other")...)
	b = append(b, frame(h2Data, 5, "..key..")...)
	if id, ok := h2StreamOf(b, []byte("key")); !ok || id != 5 {
		t.Fatalf("h2StreamOf = %d, %v; want stream 5 (the DATA frame, not the HEADERS)", id, ok)
	}
	if _, ok := h2StreamOf(frame(h2Data, 7, "nothing"), []byte("key")); ok {
		t.Fatal("h2StreamOf found a stream without the match")
	}
}

// A request picked under an earlier Arm is not the one a later Arm looks
// for: with Cut nil, the next reply on its connection would otherwise be
// lost whatever its request.
func TestWireForgetsARequestPickedBeforeDisarm(t *testing.T) {
	s := startLineServer(t)
	w := lineWire("b\n")
	c := dial(t, w, s.addr)
	r := bufio.NewReader(c)
	w.Arm()
	if _, err := io.WriteString(c, "b\n"); err != nil {
		t.Fatal(err)
	}
	w.Disarm()
	if got, err := r.ReadString('\n'); got != "ok b\n" || err != nil {
		t.Fatalf("a reply after Disarm = %q, %v; want it passed", got, err)
	}
	w.Arm()
	if got, err := call(c, r, "a\n"); got != "ok a\n" || err != nil {
		t.Fatalf("a request Request does not pick, after a new Arm = %q, %v; want its reply", got, err)
	}
	if w.Cuts() != 0 {
		t.Fatalf("%d cuts, want 0", w.Cuts())
	}
}

// scriptedConn is a connection whose server has already sent reply.
type scriptedConn struct {
	net.Conn
	reply *strings.Reader
}

func (c *scriptedConn) Write(p []byte) (int, error) { return len(p), nil }
func (c *scriptedConn) Read(p []byte) (int, error)  { return c.reply.Read(p) }
func (c *scriptedConn) Close() error                { return nil }

// Two calls carrying the match written before either's reply arrives (a
// connection that multiplexes calls): with Multiplexed the reply to
// either one is lost, the first to arrive; without it only the second
// call's reply is.
func TestWireMultiplexed(t *testing.T) {
	for _, tc := range []struct {
		multiplexed bool
		reply       string
		lost        bool
	}{
		{true, "re 1\n", true},
		{true, "re 2\n", true},
		{false, "re 1\n", false},
		{false, "re 2\n", true},
	} {
		w := &Wire{
			Message: func(r io.Reader) ([]byte, error) { return bufio.NewReader(r).ReadBytes('\n') },
			Request: func(b []byte) bool { return strings.HasPrefix(string(b), "key ") },
			Cut: func(msg, req []byte, _ io.Reader) (bool, error) {
				return strings.TrimPrefix(string(msg), "re ") == strings.TrimPrefix(string(req), "key "), nil
			},
			Multiplexed: tc.multiplexed,
		}
		c := &wireConn{Conn: &scriptedConn{reply: strings.NewReader(tc.reply)}, w: w}
		w.Arm()
		for _, req := range []string{"key 1\n", "key 2\n"} {
			if _, err := c.Write([]byte(req)); err != nil {
				t.Fatal(err)
			}
		}
		_, err := c.Read(make([]byte, 64))
		if lost := errors.Is(err, ErrReplyLost); lost != tc.lost {
			t.Errorf("Multiplexed %v, reply %q: lost = %v (Read: %v), want %v", tc.multiplexed, tc.reply, lost, err, tc.lost)
		}
	}
}
