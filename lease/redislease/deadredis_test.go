package redislease_test

import (
	"context"
	"errors"
	"log/slog"
	"net"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/fencekit/fencekit/internal/testkit"
	"github.com/fencekit/fencekit/lease"
)

// closedPort returns a loopback address where nothing listens: a port
// that was free a moment ago.
func closedPort(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	return addr
}

// TestAcquireOnDeadRedis: Acquire retries a store that does not answer
// until its context ends (by design: a blocked Acquire waits for the
// store as it waits for a holder), logs each failed attempt with its
// error, and returns the store's error, not only the context's.
func TestAcquireOnDeadRedis(t *testing.T) {
	c := redis.NewClient(&redis.Options{Addr: closedPort(t), MaxRetries: -1})
	defer c.Close()
	b := newBackend(t, c, "fencekit:")
	var logs testkit.SyncBuffer
	m := newManager(t, b, lease.Options{TTL: time.Second, PollInterval: 50 * time.Millisecond,
		Logger: slog.New(slog.NewTextHandler(&logs, nil))})

	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	l, err := m.Acquire(ctx, "dead-redis")
	if err == nil {
		l.Release(context.Background())
		t.Fatal("Acquire on a dead Redis succeeded")
	}
	for _, target := range []error{lease.ErrNotAcquired, context.DeadlineExceeded, syscall.ECONNREFUSED} {
		if !errors.Is(err, target) {
			t.Errorf("Acquire's error does not match %v: %v", target, err)
		}
	}
	if !strings.Contains(err.Error(), "connection refused") {
		t.Errorf("Acquire's error does not say what the store answered: %v", err)
	}
	log := logs.String()
	if n := strings.Count(log, "acquire attempt failed, will retry"); n < 2 || !strings.Contains(log, "connection refused") || !strings.Contains(log, "dead-redis") {
		t.Errorf("%d retries logged; want several, each with the lease name and the store's error:\n%s", n, log)
	}

	// One attempt: TryAcquire returns the store's error at once.
	_, err = m.TryAcquire(context.Background(), "dead-redis")
	if !errors.Is(err, syscall.ECONNREFUSED) || errors.Is(err, lease.ErrNotAcquired) {
		t.Errorf("TryAcquire on a dead Redis: %v; want the connection error, not ErrNotAcquired", err)
	}
}
