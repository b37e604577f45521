//go:build linux || darwin || freebsd

package pglease

import (
	"crypto/tls"
	"errors"
	"net"
	"syscall"
)

// socketOf returns the socket under a connection (below TLS) and its raw
// form, or nil when it has none (a custom dialer's stream).
func socketOf(c net.Conn) (net.Conn, syscall.RawConn) {
	if tc, ok := c.(*tls.Conn); ok {
		c = tc.NetConn()
	}
	sc, ok := c.(syscall.Conn)
	if !ok {
		return nil, nil
	}
	raw, err := sc.SyscallConn()
	if err != nil {
		return nil, nil
	}
	return c, raw
}

// waitReadable blocks until the socket has bytes to read, has reached EOF
// or has failed, without reading anything (so the driver's protocol state
// is untouched). It returns the runtime's error when the wait itself ends
// otherwise: a read deadline, a closed socket.
func waitReadable(raw syscall.RawConn) error {
	return raw.Read(peek)
}

// readableNow reports, without waiting, whether the socket has bytes, EOF
// or an error pending.
func readableNow(raw syscall.RawConn) bool {
	r := false
	if err := raw.Control(func(fd uintptr) { r = peek(fd) }); err != nil {
		return true // the socket is closed: let the caller find out
	}
	return r
}

func peek(fd uintptr) bool {
	var b [1]byte
	for {
		_, _, err := syscall.Recvfrom(int(fd), b[:], syscall.MSG_PEEK|syscall.MSG_DONTWAIT)
		if errors.Is(err, syscall.EINTR) {
			continue
		}
		return !errors.Is(err, syscall.EAGAIN) && !errors.Is(err, syscall.EWOULDBLOCK)
	}
}
