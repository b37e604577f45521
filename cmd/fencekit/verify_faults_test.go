package main

import (
	"context"
	"errors"
	"io"
	"net"
	"sync/atomic"
	"testing"
	"time"
)

// echoServer answers each byte with itself and counts what it received.
func echoServer(t *testing.T) (string, *atomic.Int64) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	var got atomic.Int64
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				buf := make([]byte, 64)
				for {
					n, err := c.Read(buf)
					if err != nil {
						return
					}
					got.Add(int64(n))
					if _, err := c.Write(buf[:n]); err != nil {
						return
					}
				}
			}()
		}
	}()
	return ln.Addr().String(), &got
}

// TestFaultNet: the faults a worker injects into its connections, as the
// client sees them: a delayed reply comes late and whole; a dropped reply
// never comes, and the connection breaks when the fault ends; a dropped
// request never reaches the server; a reset breaks the connection at
// once; a dial during a drop fails when it ends.
func TestFaultNet(t *testing.T) {
	t.Parallel()
	addr, got := echoServer(t)
	n := newFaultNet()
	defer n.stop()
	dial := n.dialer(targetLease)
	conn := func() net.Conn {
		c, err := dial(context.Background(), "tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		return c
	}
	roundTrip := func(c net.Conn, b string) (string, error) {
		if _, err := c.Write([]byte(b)); err != nil {
			return "", err
		}
		buf := make([]byte, len(b))
		_, err := io.ReadFull(c, buf)
		return string(buf), err
	}

	c := conn()
	if s, err := roundTrip(c, "a"); s != "a" || err != nil {
		t.Fatalf("no fault: %q, %v", s, err)
	}

	n.inject(targetLease, faultDelayReplies, 300*time.Millisecond, 80*time.Millisecond)
	start := time.Now()
	if s, err := roundTrip(c, "bc"); s != "bc" || err != nil || time.Since(start) < 80*time.Millisecond {
		t.Fatalf("delayed reply: %q, %v after %v; want it whole after 80ms", s, err, time.Since(start))
	}
	n.inject(targetGuard, faultReset, 0, 0) // another target: nothing happens here
	if s, err := roundTrip(c, "d"); s != "d" || err != nil {
		t.Fatalf("a reset of the other target broke this connection: %q, %v", s, err)
	}
	time.Sleep(300 * time.Millisecond)

	n.inject(targetLease, faultDropReplies, 200*time.Millisecond, 0)
	start = time.Now()
	if _, err := roundTrip(c, "e"); !errors.Is(err, errInjected) || time.Since(start) < 150*time.Millisecond {
		t.Fatalf("dropped reply: %v after %v; want the connection broken when the fault ends", err, time.Since(start))
	}

	c = conn()
	before := got.Load()
	n.inject(targetLease, faultDropRequests, 200*time.Millisecond, 0)
	if _, err := c.Write([]byte("fgh")); err != nil {
		t.Fatalf("a dropped request's Write = %v; want it to look sent", err)
	}
	if _, err := c.Read(make([]byte, 1)); !errors.Is(err, errInjected) {
		t.Fatalf("after a dropped request: %v; want the connection broken when the fault ends", err)
	}
	if got.Load() != before {
		t.Fatalf("the server received %d bytes of a dropped request", got.Load()-before)
	}

	n.inject(targetLease, faultDropRequests, 150*time.Millisecond, 0)
	start = time.Now()
	if _, err := dial(context.Background(), "tcp", addr); !errors.Is(err, errInjected) || time.Since(start) < 100*time.Millisecond {
		t.Fatalf("a dial during a drop = %v after %v; want it to fail when the fault ends", err, time.Since(start))
	}
	time.Sleep(50 * time.Millisecond)

	c = conn()
	if s, err := roundTrip(c, "i"); s != "i" || err != nil {
		t.Fatalf("after the faults: %q, %v", s, err)
	}
	n.inject(targetLease, faultReset, 0, 0)
	if _, err := roundTrip(c, "j"); err == nil {
		t.Fatal("a reset connection still works")
	}
}
