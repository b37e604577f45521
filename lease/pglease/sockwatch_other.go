//go:build !(linux || darwin || freebsd)

package pglease

import (
	"net"
	"syscall"
)

// socketOf reports that sockets cannot be watched on this platform: a
// session-mode loss is then found by the next renew.
func socketOf(net.Conn) (net.Conn, syscall.RawConn) { return nil, nil }

func waitReadable(syscall.RawConn) error { return nil }

func readableNow(syscall.RawConn) bool { return false }
