package bench

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"net"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"cirello.io/pglock"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"

	"github.com/fencekit/fencekit/internal/pgleasesql"
	"github.com/fencekit/fencekit/internal/testkit/testenv"
	"github.com/fencekit/fencekit/lease"
	"github.com/fencekit/fencekit/lease/driver"
	"github.com/fencekit/fencekit/lease/pglease"
	"github.com/fencekit/fencekit/migrations"
)

// pgWrites counts the writes on PostgreSQL connections: pgx sends each
// request in one write, so a round trip is one write.
type pgWrites struct{ n atomic.Int64 }

type countingConn struct {
	net.Conn
	n *atomic.Int64
}

func (c *countingConn) Write(b []byte) (int, error) { c.n.Add(1); return c.Conn.Write(b) }

// pgSetup is one benchmark's PostgreSQL: a throwaway schema with fencekit's
// migrations, a pgx pool and a database/sql handle on it (search_path set to
// the schema), both counting their round trips.
type pgSetup struct {
	schema string
	pool   *pgxpool.Pool
	cfg    *pgx.ConnConfig
	rt     pgWrites
}

func newPGSetup(b *testing.B) *pgSetup {
	b.Helper()
	ctx := context.Background()
	url := testenv.PostgresURL()
	var rnd [4]byte
	_, _ = rand.Read(rnd[:])
	s := &pgSetup{schema: "bench_pg_" + hex.EncodeToString(rnd[:])}
	admin, err := pgx.Connect(ctx, url)
	if err != nil {
		b.Fatalf("PostgreSQL at %s: %v", url, err)
	}
	defer admin.Close(ctx)
	if _, err := admin.Exec(ctx, "CREATE SCHEMA "+pgx.Identifier{s.schema}.Sanitize()); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() {
		c, err := pgx.Connect(context.Background(), url)
		if err == nil {
			_, _ = c.Exec(context.Background(), "DROP SCHEMA "+pgx.Identifier{s.schema}.Sanitize()+" CASCADE")
			c.Close(context.Background())
		}
	})
	db, err := migrations.Open(url, s.schema)
	if err != nil {
		b.Fatal(err)
	}
	if _, err := migrations.Up(ctx, db); err != nil {
		b.Fatal(err)
	}
	db.Close()

	pcfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		b.Fatal(err)
	}
	d := &net.Dialer{}
	pcfg.ConnConfig.DialFunc = func(ctx context.Context, network, addr string) (net.Conn, error) {
		c, err := d.DialContext(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		return &countingConn{Conn: c, n: &s.rt.n}, nil
	}
	pcfg.ConnConfig.RuntimeParams["search_path"] = s.schema
	pcfg.MaxConns = 16
	s.cfg = pcfg.ConnConfig
	if s.pool, err = pgxpool.NewWithConfig(ctx, pcfg); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(s.pool.Close)
	return s
}

// newPglock returns a cirello.io/pglock client on its own table in the
// setup's schema, over database/sql with pgx's driver (same dialer: its
// round trips are counted too). pglock's New accepts only lib/pq; UnsafeNew
// is its constructor for other drivers.
func (s *pgSetup) newPglock(b *testing.B, lease, heartbeat time.Duration) *pglock.Client {
	b.Helper()
	db := stdlib.OpenDB(*s.cfg.Copy())
	b.Cleanup(func() { _ = db.Close() })
	c, err := pglock.UnsafeNew(db, pglock.WithLeaseDuration(lease), pglock.WithHeartbeatFrequency(heartbeat), pglock.WithCustomTable("pglock_locks"))
	if err != nil {
		b.Fatal(err)
	}
	if err := c.TryCreateTable(); err != nil {
		b.Fatal(err)
	}
	return c
}

func newPGBackend(b *testing.B, s *pgSetup, mode pglease.Mode) *pglease.Backend {
	b.Helper()
	be, err := pglease.New(s.pool, pglease.WithMode(mode))
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = be.Close() })
	return be
}

// BenchmarkPGCycle is one uncontended acquire+release with a 10 s TTL on the
// shared PostgreSQL, each implementation on the same pgx pool (pglock: a
// database/sql handle with the same driver), in one run:
//
//   - lib=fencekit-table: lease.Manager.TryAcquire + Lease.Release over
//     pglease in table mode (defaults: auto-renewal on).
//   - lib=raw-table: its floor, the same two statements (pglease's acquire
//     and release) sent directly on the pool.
//   - lib=fencekit-session, lib=raw-session: the same for session mode; the
//     floor takes a connection from the pool, sends the lock statement and
//     the unlock statement on it, and gives it back.
//   - lib=pglock: cirello.io/pglock Acquire (FailIfLocked) + Release, with a
//     10 s lease and its default heartbeat (5 s): a sequence read and an
//     upsert to acquire, an update to release.
//
// rtts/op is the round trips per cycle, counted as writes on the sockets.
// lib=fencekit-table-paired and lib=fencekit-session-paired alternate a
// fencekit cycle with a raw one and report raw-ratio, fencekit's time over
// the floor's (their ns/op is that of a pair).
func BenchmarkPGCycle(b *testing.B) {
	ctx := context.Background()
	s := newPGSetup(b)
	table := newPGBackend(b, s, pglease.ModeTable)
	session := newPGBackend(b, s, pglease.ModeSession)
	mt, err := lease.NewManager(table, benchTTL)
	if err != nil {
		b.Fatal(err)
	}
	ms, err := lease.NewManager(session, benchTTL)
	if err != nil {
		b.Fatal(err)
	}
	pl := s.newPglock(b, benchTTL, pglock.DefaultHeartbeatFrequency)
	q := pgleasesql.New("")
	ttlUs := benchTTL.Microseconds()
	endedUs := driver.EndedOwnerTTL(benchTTL).Microseconds()
	var rawOwner atomic.Int64
	ttlMs := strconv.FormatInt(benchTTL.Milliseconds(), 10)

	manager := func(m *lease.Manager) func(int) error {
		return func(int) error {
			l, err := m.TryAcquire(ctx, "cycle")
			if err != nil {
				return err
			}
			return l.Release(ctx)
		}
	}
	libs := []struct {
		name  string
		cycle func(i int) error
	}{
		{"fencekit-table", manager(mt)},
		{"raw-table", func(int) error {
			// Owners are never reused: the store refuses an owner it
			// ended within driver.EndedOwnerTTL.
			owner := "raw-" + strconv.FormatInt(rawOwner.Add(1), 10)
			var ok, ended bool
			var tok, left int64
			if err := s.pool.QueryRow(ctx, q.Acquire, "raw-cycle", owner, ttlUs).Scan(&ok, &tok, &left, &ended); err != nil {
				return err
			}
			if !ok {
				return errors.New("raw-table: not granted")
			}
			return s.pool.QueryRow(ctx, q.Release, "raw-cycle", owner, tok, pglease.Channel, endedUs).Scan(nil, nil, nil)
		}},
		{"fencekit-session", manager(ms)},
		{"raw-session", func(int) error {
			owner := "raw-s" + strconv.FormatInt(rawOwner.Add(1), 10)
			pc, err := s.pool.Acquire(ctx)
			if err != nil {
				return err
			}
			defer pc.Release()
			key := int64(0x5eed) // any key: the floor does not hash names
			var ok, clean, ended bool
			var tok, left int64
			var pid int32
			var was string
			if err := pc.QueryRow(ctx, q.SessionAcquire, "raw-cycle", owner, key, ttlMs, false, int32(pc.Conn().PgConn().PID()), ttlUs).Scan(&ok, &tok, &pid, &was, &clean, &left, &ended); err != nil {
				return err
			}
			if !ok {
				return errors.New("raw-session: not locked")
			}
			var named, unlocked bool
			return pc.QueryRow(ctx, q.SessionRelease, "raw-cycle", owner, tok, pid, key, was, pglease.Channel, endedUs).Scan(&named, &unlocked, nil, nil)
		}},
		{"pglock", func(int) error {
			l, err := pl.AcquireContext(ctx, "cycle", pglock.FailIfLocked())
			if err != nil {
				return err
			}
			return pl.ReleaseContext(ctx, l)
		}},
	}
	// Paired: each fencekit cycle followed by a raw one of the same mode,
	// so that the drifts of a shared machine and server hit both alike;
	// raw-ratio is the fencekit cycles' total time over the raw ones'.
	for _, pair := range [][2]int{{0, 1}, {2, 3}} {
		fk, raw := libs[pair[0]], libs[pair[1]]
		b.Run("lib="+fk.name+"-paired", func(b *testing.B) {
			if err := fk.cycle(-1); err != nil {
				b.Fatal(err)
			}
			if err := raw.cycle(-1); err != nil {
				b.Fatal(err)
			}
			var tFk, tRaw time.Duration
			i := 0
			for b.Loop() {
				t0 := time.Now()
				if err := fk.cycle(i); err != nil {
					b.Fatal(err)
				}
				t1 := time.Now()
				if err := raw.cycle(i); err != nil {
					b.Fatal(err)
				}
				tFk, tRaw = tFk+t1.Sub(t0), tRaw+time.Since(t1)
				i++
			}
			b.ReportMetric(float64(tFk)/float64(tRaw), "raw-ratio")
		})
	}
	for _, lib := range libs {
		b.Run("lib="+lib.name, func(b *testing.B) {
			if err := lib.cycle(-1); err != nil { // prepares the statements
				b.Fatal(err)
			}
			rt0, i := s.rt.n.Load(), 0
			for b.Loop() {
				if err := lib.cycle(i); err != nil {
					b.Fatal(err)
				}
				i++
			}
			b.ReportMetric(float64(s.rt.n.Load()-rt0)/float64(i), "rtts/op")
		})
	}
}

// pglockHandoffLease is pglock's lease in the hand-off benchmark. pglock's
// waiters retry once per lease duration (AcquireContext sleeps a whole
// lease between attempts), so its hand-off is about that long; 1 s keeps a
// run short. Its heartbeat runs every 250 ms.
const pglockHandoffLease = time.Second

// BenchmarkPGHandoff is BenchmarkHandoff (see there for the shape and the
// metrics) on the shared PostgreSQL:
//
//   - lib=fencekit-table, lib=fencekit-session: Manager.Acquire over
//     pglease, woken by LISTEN/NOTIFY on release, polling as a fallback.
//   - lib=pglock: cirello.io/pglock AcquireContext, which polls once per
//     lease duration (pglockHandoffLease).
//
// stolen/op counts pglock releases that found the lock already taken by
// another client (pglock.ErrLockAlreadyReleased: a waiter saw the same
// record version for a whole lease duration and took the lock over); the
// benchmark carries on after one.
func BenchmarkPGHandoff(b *testing.B) {
	s := newPGSetup(b)
	pl := s.newPglock(b, pglockHandoffLease, pglockHandoffLease/4)
	var stolen atomic.Int64
	manager := func(mode pglease.Mode) blockingLock {
		m, err := lease.NewManager(newPGBackend(b, s, mode), benchTTL)
		if err != nil {
			b.Fatal(err)
		}
		return func(ctx context.Context, name string) (func(context.Context) error, error) {
			l, err := m.Acquire(ctx, name)
			if err != nil {
				return nil, err
			}
			return l.Release, nil
		}
	}
	libs := []struct {
		name string
		lock blockingLock
	}{
		{"fencekit-table", manager(pglease.ModeTable)},
		{"fencekit-session", manager(pglease.ModeSession)},
		{"pglock", func(ctx context.Context, name string) (func(context.Context) error, error) {
			l, err := pl.AcquireContext(ctx, name)
			if err != nil {
				return nil, err
			}
			return func(ctx context.Context) error {
				err := pl.ReleaseContext(ctx, l)
				if errors.Is(err, pglock.ErrLockAlreadyReleased) {
					stolen.Add(1)
					return nil
				}
				return err
			}, nil
		}},
	}
	for _, lib := range libs {
		b.Run("lib="+lib.name, func(b *testing.B) {
			rt0, stolen0 := s.rt.n.Load(), stolen.Load()
			res := runHandoff(b, lib.lock)
			if len(res.samples) < b.N {
				b.Fatalf("%d hand-offs measured, want %d", len(res.samples), b.N)
			}
			b.ReportMetric(0, "ns/op")
			b.ReportMetric(float64(Mean(res.samples)), "mean-ns")
			b.ReportMetric(float64(Percentile(res.samples, 50)), "p50-ns")
			b.ReportMetric(float64(Percentile(res.samples, 99)), "p99-ns")
			b.ReportMetric(float64(s.rt.n.Load()-rt0)/float64(b.N), "rtts/op")
			b.ReportMetric(float64(res.giveups)/float64(b.N), "giveups/op")
			b.ReportMetric(float64(stolen.Load()-stolen0)/float64(b.N), "stolen/op")
		})
	}
}
