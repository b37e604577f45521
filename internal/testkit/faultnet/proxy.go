package faultnet

import (
	"context"
	"net"
	"sync"
	"testing"
	"time"
)

// Proxy is a TCP proxy on a free loopback port in front of a server, for
// fault injection: it can stop forwarding in either direction (the bytes
// are read and dropped, as a network that loses them would), or hold what
// clients send and deliver it later (a delayed request). While it drops
// what the server sends, a connection the server closes stays open towards
// the client: the client hears nothing at all, as behind a partition.
type Proxy struct {
	// Addr is host:port to connect to instead of the server.
	Addr string

	t      testing.TB
	target string
	via    *Wire
	ln     net.Listener

	mu       sync.Mutex
	cond     *sync.Cond
	toServer mode
	toClient mode
	live     int // connections whose server side is still open
	conns    map[net.Conn]struct{}
	closed   bool
	wg       sync.WaitGroup
}

type mode uint8

const (
	pass mode = iota
	drop
	hold
)

// StartProxy starts a Proxy in front of target (host:port) and closes it,
// with every connection, when the test ends. Its connections to target go
// through via, when via is not nil.
func StartProxy(t testing.TB, target string, via *Wire) *Proxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("faultnet: proxy: %v", err)
	}
	p := &Proxy{Addr: ln.Addr().String(), t: t, target: target, via: via, ln: ln, conns: map[net.Conn]struct{}{}}
	p.cond = sync.NewCond(&p.mu)
	p.wg.Add(1)
	go p.accept()
	t.Cleanup(p.Close)
	return p
}

// Blackhole drops everything, both ways, on every connection, from now on.
func (p *Proxy) Blackhole() { p.set(drop, drop) }

// DropReplies drops what the server sends, from now on; requests pass.
func (p *Proxy) DropReplies() { p.set(pass, drop) }

// HoldRequests keeps what clients send from now on, in order, and delivers
// it when Restore is called (even for a client that has gone meanwhile).
func (p *Proxy) HoldRequests() { p.set(hold, pass) }

// Restore forwards both ways again, delivering held requests first.
func (p *Proxy) Restore() { p.set(pass, pass) }

func (p *Proxy) set(toServer, toClient mode) {
	p.mu.Lock()
	p.toServer, p.toClient = toServer, toClient
	p.cond.Broadcast()
	p.mu.Unlock()
}

// WaitServerSidesClosed waits until the server has closed every
// connection the proxy opened to it (so it has run every request it was
// delivered), at most d, and reports whether it did.
func (p *Proxy) WaitServerSidesClosed(d time.Duration) bool {
	deadline := time.Now().Add(d)
	for {
		p.mu.Lock()
		n := p.live
		p.mu.Unlock()
		if n == 0 {
			return true
		}
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func (p *Proxy) accept() {
	defer p.wg.Done()
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		s, err := p.dial()
		if err != nil {
			c.Close()
			continue
		}
		p.mu.Lock()
		if p.closed {
			p.mu.Unlock()
			c.Close()
			s.Close()
			return
		}
		p.conns[c], p.conns[s] = struct{}{}, struct{}{}
		p.live++
		p.mu.Unlock()
		p.wg.Add(2)
		go p.pipe(c, s, true)
		go p.pipe(s, c, false)
	}
}

func (p *Proxy) dial() (net.Conn, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if p.via != nil {
		return p.via.Dial(ctx, "tcp", p.target)
	}
	var d net.Dialer
	return d.DialContext(ctx, "tcp", p.target)
}

// pipe copies from src to dst under the direction's mode.
func (p *Proxy) pipe(src, dst net.Conn, toServer bool) {
	defer p.wg.Done()
	buf := make([]byte, 32<<10)
	gone := false
	for {
		n, err := src.Read(buf)
		p.mu.Lock()
		m := p.toClient
		if toServer {
			m = p.toServer
		}
		if m == hold && n > 0 {
			// Keep it (and stop reading) until Restore; then deliver it,
			// even if the client has gone meanwhile.
			for p.toServer == hold && !p.closed {
				p.cond.Wait()
			}
			m = pass
			if p.closed {
				m = drop
			}
		}
		p.mu.Unlock()
		if m == pass && n > 0 && !gone {
			if _, werr := dst.Write(buf[:n]); werr != nil {
				if toServer && err == nil {
					err = werr
				}
				// The client is gone: read the server's replies to the
				// end (it commits after its first reply bytes), and drop
				// them.
				gone = true
			}
		}
		if err == nil {
			continue
		}
		if toServer {
			closeWrite(dst) // the client is gone: so is the request stream
			return
		}
		// The server is gone. While its bytes are dropped, the client
		// hears nothing, not even the close.
		p.mu.Lock()
		p.live--
		for p.toClient == drop && !p.closed {
			p.cond.Wait()
		}
		p.mu.Unlock()
		dst.Close()
		return
	}
}

func closeWrite(c net.Conn) {
	if hc, ok := c.(interface{ CloseWrite() error }); ok {
		_ = hc.CloseWrite()
		return
	}
	_ = c.Close()
}

// Close closes the proxy and every connection through it, and waits for
// its goroutines. The test's end calls it; calling it again is harmless.
func (p *Proxy) Close() {
	p.mu.Lock()
	p.closed = true
	p.cond.Broadcast()
	_ = p.ln.Close()
	for c := range p.conns {
		_ = c.Close()
	}
	p.mu.Unlock()
	p.wg.Wait()
}
