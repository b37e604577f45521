// Package redistest gives tests real Redis servers: the machine's shared one
// (FENCE_REDIS_URL) with a unique key prefix per test, and throwaway
// redis-server processes on free loopback ports for destructive tests
// (FLUSHALL, restarts, CLIENT PAUSE). It fails the test loudly when a server
// cannot be had; it never skips.
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
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/fencekit/fencekit/internal/testenv"
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
	Addr   string
	t      testing.TB
	port   int
	dir    string
	extra  []string
	cmd    *exec.Cmd
	exited chan error // receives cmd.Wait's result
}

// Start runs a new redis-server without persistence on a free loopback
// port, stopped when t ends. extra are more server arguments.
func Start(t testing.TB, extra ...string) *Server {
	t.Helper()
	if _, err := exec.LookPath("redis-server"); err != nil {
		t.Fatalf("redistest: redis-server is not installed (Debian: apt-get install redis-server): %v", err)
	}
	s := &Server{t: t, dir: t.TempDir(), extra: extra}
	var lastErr error
	for range 5 {
		s.port = freePort(t)
		s.Addr = net.JoinHostPort("127.0.0.1", strconv.Itoa(s.port))
		if lastErr = s.start(); lastErr == nil {
			t.Cleanup(s.Stop)
			return s
		}
	}
	t.Fatalf("redistest: cannot start redis-server: %v", lastErr)
	return nil
}

func freePort(t testing.TB) int {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("redistest: no free port: %v", err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

func (s *Server) start() error {
	args := append([]string{
		"--port", strconv.Itoa(s.port), "--bind", "127.0.0.1",
		"--save", "", "--appendonly", "no", "--dir", s.dir,
		"--logfile", filepath.Join(s.dir, "redis.log"),
	}, s.extra...)
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
		if c, err := net.DialTimeout("tcp", s.Addr, 100*time.Millisecond); err == nil {
			c.Close()
			s.cmd, s.exited = cmd, exited
			return nil
		}
		time.Sleep(20 * time.Millisecond)
	}
	_ = cmd.Process.Kill()
	<-exited
	return fmt.Errorf("redis-server on %s did not accept connections within 10s", s.Addr)
}

func lastLines(s string, n int) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, " | ")
}

// Stop kills the server and waits until it has exited.
func (s *Server) Stop() {
	if s.cmd == nil {
		return
	}
	_ = s.cmd.Process.Kill()
	<-s.exited
	s.cmd, s.exited = nil, nil
}

// Restart kills the server and starts a new one on the same port. Without
// persistence it comes back empty, as after a crash.
func (s *Server) Restart() {
	s.t.Helper()
	s.Stop()
	var err error
	for range 50 {
		if err = s.start(); err == nil {
			return
		}
		time.Sleep(100 * time.Millisecond)
	}
	s.t.Fatalf("redistest: cannot restart redis-server on %s: %v", s.Addr, err)
}

// Client returns a new client of this server, closed when the test ends.
func (s *Server) Client() *redis.Client {
	s.t.Helper()
	return connect(s.t, &redis.Options{Addr: s.Addr, MaxRetries: -1})
}
