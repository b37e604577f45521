package reliability

import (
	"context"
	"encoding/binary"
	"errors"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/fencekit/fencekit/blobguard"
	"github.com/fencekit/fencekit/fence"
	"github.com/fencekit/fencekit/lease"
	"github.com/fencekit/fencekit/lease/redislease"
	"github.com/fencekit/fencekit/sqlguard"
)

// shiftedRedis is a redis-server owned by one test whose wall clock the
// test moves, through the clockshift shim (testdata/clockshift.c).
type shiftedRedis struct {
	t     *testing.T
	addr  string
	clock *os.File // the offset the shim reads, in nanoseconds
	cmd   *exec.Cmd
	done  chan struct{}
}

func startShiftedRedis(t *testing.T) *shiftedRedis {
	t.Helper()
	for _, prog := range []string{"gcc", "redis-server"} {
		if _, err := exec.LookPath(prog); err != nil {
			t.Fatalf("%s is required for the clock test (Debian: apt-get install gcc redis-server): %v", prog, err)
		}
	}
	dir := t.TempDir()
	so := filepath.Join(dir, "clockshift.so")
	if out, err := exec.Command("gcc", "-shared", "-fPIC", "-O2", "-Wall", "-Werror", "-o", so, "testdata/clockshift.c").CombinedOutput(); err != nil {
		t.Fatalf("building the clock shim: %v\n%s", err, out)
	}
	clock, err := os.OpenFile(filepath.Join(dir, "offset"), os.O_RDWR|os.O_CREATE, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { clock.Close() })
	s := &shiftedRedis{t: t, clock: clock, done: make(chan struct{})}
	s.shift(0)
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := l.Addr().(*net.TCPAddr).Port
	l.Close()
	s.addr = net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
	s.cmd = exec.Command("redis-server", "--port", strconv.Itoa(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no", "--dir", dir)
	s.cmd.Env = append(os.Environ(), "LD_PRELOAD="+so, "FENCEKIT_CLOCK_FILE="+clock.Name())
	var log strings.Builder
	s.cmd.Stdout, s.cmd.Stderr = &log, &log
	if err := s.cmd.Start(); err != nil {
		t.Fatalf("redis-server: %v", err)
	}
	go func() { _ = s.cmd.Wait(); close(s.done) }()
	t.Cleanup(func() { _ = s.cmd.Process.Kill(); <-s.done })
	deadline := time.Now().Add(10 * time.Second)
	for {
		c, err := net.DialTimeout("tcp", s.addr, 100*time.Millisecond)
		if err == nil {
			c.Close()
			return s
		}
		select {
		case <-s.done:
			t.Fatalf("redis-server with the clock shim exited: %s", log.String())
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("redis-server with the clock shim did not start: %s", log.String())
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// shift sets the server's wall clock to real time + d.
func (s *shiftedRedis) shift(d time.Duration) {
	var b [8]byte
	binary.LittleEndian.PutUint64(b[:], uint64(int64(d)))
	if _, err := s.clock.WriteAt(b[:], 0); err != nil {
		s.t.Fatal(err)
	}
}

// serverTime is the server's TIME.
func serverTime(t *testing.T, c *redis.Client) time.Time {
	t.Helper()
	now, err := c.Time(context.Background()).Result()
	if err != nil {
		t.Fatalf("TIME: %v", err)
	}
	return now
}

// TestRedisClockJumpForward: the Redis server's wall clock jumps forward
// by more than the TTL while a holder has the lease, so the server expires
// the grant at once (key expiry follows the wall clock). The holder must
// learn its loss at its next renewal, well before its local deadline, and
// once another holder has taken the lease and written, the first holder's
// writes to PostgreSQL and S3 must be rejected by the guards.
func TestRedisClockJumpForward(t *testing.T) {
	started := time.Now()
	srv := startShiftedRedis(t)
	rc := redis.NewClient(&redis.Options{Addr: srv.addr, MaxRetries: -1, ContextTimeoutEnabled: true})
	t.Cleanup(func() { _ = rc.Close() })

	// The shim moves the server's clock: TIME follows a jump.
	before := serverTime(t, rc)
	srv.shift(time.Hour)
	if got := serverTime(t, rc).Sub(before); got < time.Hour-time.Minute || got > time.Hour+time.Minute {
		t.Fatalf("the clock shim does not move redis-server's TIME: it moved %v, want an hour", got)
	}
	srv.shift(0)

	backend, err := redislease.New(rc)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = backend.Close() })
	const ttl = 3 * time.Second
	ma, err := lease.NewManager(backend, ttl, lease.WithIdentity("clock-A"))
	if err != nil {
		t.Fatal(err)
	}
	mb, err := lease.NewManager(backend, ttl, lease.WithIdentity("clock-B"))
	if err != nil {
		t.Fatal(err)
	}

	pg := newPGEnv(t)
	pg.exec(`CREATE TABLE jobs (id text PRIMARY KEY, v text NOT NULL,
		lock_version bigint NOT NULL DEFAULT 0 CHECK (lock_version >= 0))`)
	table, err := sqlguard.NewTable("", "jobs", "id")
	if err != nil {
		t.Fatal(err)
	}
	pool := pg.pool("", 2)
	env := s3Env(t)
	g, err := blobguard.New(s3Client(t, newHTTPTransport(t)), env.Bucket)
	if err != nil {
		t.Fatal(err)
	}
	objKey := "reliability/clock/" + randomHex(6)
	ctx := t.Context()
	write := func(l *lease.Lease, who string) (rowErr, objErr error) {
		rowErr = table.Upsert(ctx, pool, []any{"job"}, l.Token(), sqlguard.Col("v", who))
		_, objErr = g.Put(ctx, objKey, l.Token(), strings.NewReader(who))
		return rowErr, objErr
	}

	a, err := ma.TryAcquire(ctx, "clock-jump")
	if err != nil {
		t.Fatalf("A: %v", err)
	}
	if re, oe := write(a, "A"); re != nil || oe != nil {
		t.Fatalf("A's writes while it holds the lease: row %v, object %v", re, oe)
	}
	// Wait for a renewal, so that the jump lands inside a renew interval.
	time.Sleep(ma.Options().RenewInterval + 100*time.Millisecond)
	if err := a.Err(); err != nil {
		t.Fatalf("A lost its lease before the jump: %v", err)
	}
	deadline := a.Deadline()
	const jump = time.Minute
	srv.shift(jump)
	jumped := time.Now()

	select {
	case <-a.Done():
	case <-time.After(time.Until(deadline) + time.Second):
		t.Fatalf("A did not learn of its loss by its local deadline %v", deadline)
	}
	learned := time.Since(jumped)
	var lost *lease.LostError
	if !errors.As(a.Err(), &lost) || lost.Reason != lease.LostTakenOver {
		t.Fatalf("A's lease ended with %v; want a loss found at the store (%s)", a.Err(), lease.LostTakenOver)
	}
	// Found at the store (above), so at a renewal, not at the deadline:
	// and before the deadline, which a renewal every RenewInterval leaves
	// time for.
	if !time.Now().Before(deadline) {
		t.Fatalf("A learned of its loss %v after the jump, at or after its local deadline (%v away); renew interval %v",
			learned, time.Until(deadline), ma.Options().RenewInterval)
	}

	b, err := mb.TryAcquire(ctx, "clock-jump")
	if err != nil {
		t.Fatalf("B after the jump: %v", err)
	}
	defer b.Release(context.Background()) //nolint:errcheck
	if b.Token() <= a.Token() {
		t.Fatalf("B's token %d is not above A's %d", b.Token(), a.Token())
	}
	if re, oe := write(b, "B"); re != nil || oe != nil {
		t.Fatalf("B's writes: row %v, object %v", re, oe)
	}
	re, oe := write(a, "A-late")
	for what, err := range map[string]error{"row": re, "object": oe} {
		if se, ok := fence.AsStale(err); !ok || se.Current != b.Token() {
			t.Errorf("A's late write to the %s: %v; want stale against B's token %d", what, err, b.Token())
		}
	}
	var v string
	var lv int64
	if err := pool.QueryRow(ctx, "SELECT v, lock_version FROM jobs WHERE id = 'job'").Scan(&v, &lv); err != nil {
		t.Fatal(err)
	}
	obj, err := g.Get(ctx, objKey)
	if err != nil {
		t.Fatal(err)
	}
	if v != "B" || fence.Token(lv) != b.Token() || string(obj.Body) != "B" || obj.Token() != b.Token() {
		t.Fatalf("stored: row %q lock_version %d, object %q token %d; want B's, token %d", v, lv, obj.Body, obj.Token(), b.Token())
	}
	t.Logf("clock jumped %v: A (token %d) learned of its loss %v later (renew interval %v, %v before its local deadline); B got token %d; A's 2 late writes rejected",
		jump, a.Token(), learned.Round(time.Millisecond), ma.Options().RenewInterval, time.Until(deadline).Round(time.Millisecond), b.Token())
	report(t, figures{Check: "redis clock jump", Operations: 6, Trials: 1, Violations: 0,
		Outcomes: map[string]int{"accepted": 4, "stale": 2, "loss-learned-ms": int(learned.Milliseconds())},
		Faults:   map[string]int{"clock-jump-forward-s": int(jump.Seconds())}, Seconds: time.Since(started).Seconds()})
}
