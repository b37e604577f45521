// Package redistest gives tests real Redis servers: the machine's shared one
// (FENCE_REDIS_URL) with a unique key prefix per test, throwaway
// redis-server processes on free loopback ports for destructive tests
// (FLUSHALL, restarts, CLIENT PAUSE, SIGKILL), and multi-node deployments
// started from Go: a Redis Cluster of masters with replicas (StartCluster)
// and a primary with replicas watched by Sentinels (StartSentinel), with
// one set of calls for failover tests on either (Deployment); and a hook
// that counts a client's round trips (RoundTrips). It fails the test
// loudly when a server cannot be had; it never skips.
//
// It is fencekit's own test equipment, a package of this module so that
// the tests of several modules share it without a test-kit module in any
// user's graph (docs/versioning.md). It is not part of the library: its API
// may change in any release, and no library package imports it.
package redistest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/fencekit/fencekit/internal/testkit/ports"
	"github.com/fencekit/fencekit/internal/testkit/testenv"
)

// Shared returns a new client of the machine's Redis (FENCE_REDIS_URL),
// closed when t ends. Each call opens its own connection pool.
func Shared(t testing.TB) *redis.Client {
	t.Helper()
	opt, err := redis.ParseURL(testenv.RedisURL())
	if err != nil {
		t.Fatalf("redistest: %s=%q: %v", testenv.RedisURLVar, testenv.RedisURL(), err)
	}
	return connect(t, opt)
}

func connect(t testing.TB, opt *redis.Options) *redis.Client {
	t.Helper()
	opt.ContextTimeoutEnabled = true
	c := redis.NewClient(opt)
	t.Cleanup(func() { _ = c.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := c.Ping(ctx).Err(); err != nil {
		t.Fatalf("redistest: Redis at %s does not answer: %v (start it, or run ./scripts/test.sh, or set %s)", opt.Addr, err, testenv.RedisURLVar)
	}
	return c
}

// Prefix returns a key prefix unique to this test run and test. When the
// test ends, the keys under it in the shared Redis are deleted (token
// counters never expire on their own).
func Prefix(t testing.TB) string {
	var b [6]byte
	_, _ = rand.Read(b[:])
	prefix := "fencekit-test:" + hex.EncodeToString(b[:]) + ":"
	t.Cleanup(func() {
		opt, err := redis.ParseURL(testenv.RedisURL())
		if err != nil {
			return
		}
		c := redis.NewClient(opt)
		defer c.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		iter := c.Scan(ctx, 0, prefix+"*", 1000).Iterator()
		var keys []string
		for iter.Next(ctx) {
			keys = append(keys, iter.Val())
		}
		if len(keys) > 0 {
			if err := c.Del(ctx, keys...).Err(); err != nil {
				t.Logf("redistest: deleting the keys under %s: %v", prefix, err)
			}
		}
	})
	return prefix
}

// Server is a redis-server process owned by one test.
type Server struct {
	Addr string
	t    testing.TB
	port int
	// cluster is set for a Redis Cluster node, which needs a second port
	// for the cluster bus (cluster-port).
	cluster bool
	busPort int
	dir     string
	// conf is the path of a configuration file passed as the first
	// argument (a Sentinel needs one it can rewrite), or "".
	conf   string
	extra  []string
	cmd    *exec.Cmd
	exited chan error // receives cmd.Wait's result
}

// Start runs a new redis-server without persistence on a free loopback
// port, stopped when t ends. extra are more server arguments.
func Start(t testing.TB, extra ...string) *Server {
	t.Helper()
	// A Cluster node listens on a second port, the bus (by default its
	// port + 10,000, which no one reserved): give it one of its own.
	cluster := slices.Contains(extra, "--cluster-enabled")
	return launch(t, &Server{t: t, dir: t.TempDir(), extra: extra, cluster: cluster})
}

// launch picks free ports for s and starts it, retrying with other ports
// when the chosen ones were taken meanwhile; it fails t when it cannot.
func launch(t testing.TB, s *Server) *Server {
	t.Helper()
	if _, err := exec.LookPath("redis-server"); err != nil {
		t.Fatalf("redistest: redis-server is not installed (Debian: apt-get install redis-server): %v", err)
	}
	var lastErr error
	for range 5 {
		// Ports reserved across test processes: two binaries that each
		// found one port free started their servers on it, and the
		// loser's failed bind went unseen while the winner answered
		// the readiness dial (a cluster node then refused CLUSTER MYID
		// once the other binary stopped its server).
		s.port = ports.Loopback(t)
		if s.cluster {
			s.busPort = ports.Loopback(t)
		}
		s.Addr = net.JoinHostPort("127.0.0.1", strconv.Itoa(s.port))
		if lastErr = s.start(); lastErr == nil {
			t.Cleanup(s.Stop)
			return s
		}
	}
	t.Fatalf("redistest: cannot start redis-server: %v", lastErr)
	return nil
}

func (s *Server) start() error {
	var args []string
	if s.conf != "" {
		args = append(args, s.conf)
	}
	args = append(args,
		"--port", strconv.Itoa(s.port), "--bind", "127.0.0.1",
		"--save", "", "--appendonly", "no", "--dir", s.dir,
		"--logfile", filepath.Join(s.dir, "redis.log"),
	)
	if s.cluster {
		args = append(args, "--cluster-port", strconv.Itoa(s.busPort))
	}
	args = append(args, s.extra...)
	cmd := exec.Command("redis-server", args...)
	cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
	if err := cmd.Start(); err != nil {
		return err
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		select {
		case err := <-exited:
			log, _ := os.ReadFile(filepath.Join(s.dir, "redis.log"))
			return fmt.Errorf("redis-server exited (%v): %s", err, lastLines(string(log), 5))
		default:
		}
		if answers(s.Addr) {
			s.cmd, s.exited = cmd, exited
			return nil
		}
		time.Sleep(20 * time.Millisecond)
	}
	_ = cmd.Process.Kill()
	<-exited
	return fmt.Errorf("redis-server on %s did not accept connections within 10s", s.Addr)
}

// answers reports whether a server at addr replies to PING (+PONG, or an
// error such as NOAUTH: either way it runs its event loop). A dial alone
// is not enough: redis-server listens on its port before it has bound
// everything else (a Cluster node's bus), and may still exit on a failed
// bind after a dial succeeded.
func answers(addr string) bool {
	c, err := net.DialTimeout("tcp", addr, 100*time.Millisecond)
	if err != nil {
		return false
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(time.Second))
	if _, err := c.Write([]byte("PING\r\n")); err != nil {
		return false
	}
	var b [1]byte
	n, err := c.Read(b[:])
	return err == nil && n == 1 && (b[0] == '+' || b[0] == '-')
}

func lastLines(s string, n int) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, " | ")
}

// Stop kills the server (SIGKILL) and waits until it has exited. It does
// nothing when the server is not running.
func (s *Server) Stop() {
	if s.cmd == nil {
		return
	}
	_ = s.cmd.Process.Signal(syscall.SIGCONT) // a paused server must die too
	_ = s.cmd.Process.Kill()
	<-s.exited
	s.cmd, s.exited = nil, nil
}

// Kill sends SIGKILL to the running server, as a crash would, waits until
// it has exited, and returns the time the signal was sent. It fails t when
// the server is not running.
func (s *Server) Kill(t testing.TB) time.Time {
	t.Helper()
	if s.cmd == nil {
		t.Fatalf("redistest: Kill: redis-server on %s is not running", s.Addr)
	}
	at := time.Now()
	s.Stop()
	return at
}

// Running reports whether the server process is running (it may be paused).
func (s *Server) Running() bool { return s.cmd != nil }

// Relaunch starts the server again after Kill or Stop, on the same port,
// directory and arguments, and fails t if it cannot. Without persistence
// its data comes back empty; a cluster node keeps its nodes.conf, so it
// rejoins its cluster.
func (s *Server) Relaunch(t testing.TB) {
	t.Helper()
	if s.cmd != nil {
		t.Fatalf("redistest: Relaunch: redis-server on %s is still running", s.Addr)
	}
	var err error
	for range 50 {
		if err = s.start(); err == nil {
			return
		}
		time.Sleep(100 * time.Millisecond) // the port may linger for a moment
	}
	t.Fatalf("redistest: cannot relaunch redis-server on %s: %v", s.Addr, err)
}

// Restart kills the server and starts a new one on the same port. Without
// persistence it comes back empty, as after a crash.
func (s *Server) Restart() {
	s.t.Helper()
	s.Stop()
	s.Relaunch(s.t)
}

// Pause stops the server process (SIGSTOP): it neither answers nor reads
// its sockets until Resume. Stop and Kill resume it first.
func (s *Server) Pause(t testing.TB) { s.signal(t, syscall.SIGSTOP) }

// Resume continues a paused server (SIGCONT).
func (s *Server) Resume(t testing.TB) { s.signal(t, syscall.SIGCONT) }

func (s *Server) signal(t testing.TB, sig syscall.Signal) {
	t.Helper()
	if s.cmd == nil {
		t.Fatalf("redistest: signal %v: redis-server on %s is not running", sig, s.Addr)
	}
	if err := s.cmd.Process.Signal(sig); err != nil {
		t.Fatalf("redistest: signal %v to redis-server on %s: %v", sig, s.Addr, err)
	}
}

// Client returns a new client of this server, closed when the test ends.
func (s *Server) Client() *redis.Client {
	s.t.Helper()
	return connect(s.t, &redis.Options{Addr: s.Addr, MaxRetries: -1})
}

// UniquePrefix returns a key prefix unique to this run, for a deployment
// the test owns (nothing to clean up: the servers go away). Prefix is the
// one for the shared server.
func UniquePrefix() string {
	var b [6]byte
	_, _ = rand.Read(b[:])
	return "fencekit-test:" + hex.EncodeToString(b[:]) + ":"
}

// StoredOwner reads the owner of the grant a redislease lease key holds
// ("<token>:<owner>").
func StoredOwner(ctx context.Context, c *redis.Client, key string) (string, error) {
	v, err := c.Get(ctx, key).Result()
	if err != nil {
		return "", err
	}
	_, owner, _ := strings.Cut(v, ":")
	return owner, nil
}
