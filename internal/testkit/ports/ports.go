// Package ports hands out loopback TCP ports for the servers that tests
// start as processes of their own (etcd members, redis-server), so that
// test binaries running side by side never give two servers one port.
//
// A port is chosen below the kernel's ephemeral range (Linux: 32768 and
// up by default): a server stopped and started again must find its port
// free, and an ephemeral port can meanwhile become the local end of any
// outgoing connection (a client reconnecting), which makes the server's
// bind fail. It is handed out once per process, and once across processes
// on the machine: a port handed out is reserved by a lock on a file named
// after it (in Dir), held
// until the process ends (the kernel releases it however the process
// ends), and a port whose lock another process holds is passed over. A
// port that was merely free when checked is not enough: two binaries that
// each checked one free could start their servers on it, and the loser's
// bind fails while a readiness check that dials the port finds the
// winner.
//
// It needs nothing but the standard library; where file locks are not
// available (not unix), ports are only checked free.
package ports

import (
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"path/filepath"
	"sync"
	"testing"
)

// Dir holds the files whose locks reserve ports across processes: in the
// user's cache directory ($XDG_CACHE_HOME/fencekit/ports, where the built
// servers are kept too), not among a run's temporary files, since the
// files outlive every process (removing one while another process holds
// its lock would let a third lock a new file of that name). It holds at
// most one empty file per port of the range.
var Dir = func() string {
	if cache, err := os.UserCacheDir(); err == nil {
		return filepath.Join(cache, "fencekit", "ports")
	}
	return filepath.Join(os.TempDir(), "fencekit-ports")
}()

// The range ports are chosen from: [low, low+span).
const (
	low  = 15000
	span = 17000
)

var handed struct {
	mu    sync.Mutex
	ports map[int]bool
}

// Loopback returns a port of 127.0.0.1 that nothing listens on now, that
// this process has not handed out before, and that no other live process
// has reserved; it is reserved for this process until it ends. The first
// tries are in a window of 1,000 ports chosen by the process ID, so that
// binaries side by side seldom even try one port. It fails t when none is
// found.
func Loopback(t testing.TB) int {
	t.Helper()
	port, err := Free()
	if err != nil {
		t.Fatalf("ports: %v", err)
	}
	return port
}

// Free is Loopback for code without a testing.TB (the integration suites'
// services, started before any test): it returns the error instead.
func Free() (int, error) {
	window := low + os.Getpid()%(span/1000)*1000
	handed.mu.Lock()
	defer handed.mu.Unlock()
	if handed.ports == nil {
		handed.ports = map[int]bool{}
	}
	for i := range 400 {
		port := window + rand.IntN(1000)
		if i >= 100 {
			port = low + rand.IntN(span)
		}
		if handed.ports[port] {
			continue
		}
		mine, err := reserve(Dir, port)
		if err != nil {
			return 0, fmt.Errorf("reserving port %d in %s: %w", port, Dir, err)
		}
		if !mine {
			continue
		}
		handed.ports[port] = true // reserved by this process from now on
		l, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", port))
		if err != nil {
			continue
		}
		_ = l.Close()
		return port, nil
	}
	return 0, fmt.Errorf("no free loopback port in %d-%d", low, low+span-1)
}
