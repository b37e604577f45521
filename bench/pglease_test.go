package bench

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"os"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"cirello.io/pglock"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"

	"github.com/fencekit/fencekit/internal/pgleasesql"
	"github.com/fencekit/fencekit/internal/testkit/pairbench"
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
	dbs    []*sql.DB // pglock's handles
}

// pgPoolConns is the size of each PostgreSQL connection pool in these
// benchmarks: pglease's pgxpool and pglock's database/sql handle alike.
const pgPoolConns = 16

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
	// Tags the benchmark's server processes, for serverCPU.
	pcfg.ConnConfig.RuntimeParams["application_name"] = s.schema
	pcfg.MaxConns = pgPoolConns
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
	c, _ := s.newPglockDB(b, lease, heartbeat)
	return c
}

// newPglockDB is newPglock, and the database/sql handle under the client.
//
// The handle gets the pool pglease has (pgSetup's pgxpool): at most
// pgPoolConns connections, all kept open between uses. database/sql's
// defaults (no cap, 2 idle) differ: when the hand-off benchmark's 40
// goroutines poll at once, all but 2 of the connections they open are
// closed again, and the next release must dial, fork a server process
// and authenticate within pglock's bound on a release (its lease
// duration, 1 s there), which a loaded machine does not always meet.
func (s *pgSetup) newPglockDB(b *testing.B, lease, heartbeat time.Duration) (*pglock.Client, *sql.DB) {
	b.Helper()
	db := stdlib.OpenDB(*s.cfg.Copy())
	db.SetMaxOpenConns(pgPoolConns)
	db.SetMaxIdleConns(pgPoolConns)
	b.Cleanup(func() { _ = db.Close() })
	s.dbs = append(s.dbs, db)
	c, err := pglock.UnsafeNew(db, pglock.WithLeaseDuration(lease), pglock.WithHeartbeatFrequency(heartbeat), pglock.WithCustomTable("pglock_locks"))
	if err != nil {
		b.Fatal(err)
	}
	if err := c.TryCreateTable(); err != nil {
		b.Fatal(err)
	}
	return c, db
}

// serverCPU returns a reader of the CPU time, in ns, that the server
// processes of the setup's connections have used so far
// (/proc/PID/schedstat: user and system time, waits excluded), or nil when
// they cannot be read (a server on another machine, or in a container).
// It reads the processes' IDs again whenever the setup's pools have opened
// or closed connections, so a reading misses at most the work a new
// connection did before it.
func (s *pgSetup) serverCPU(b *testing.B) func() int64 {
	b.Helper()
	ctx := context.Background()
	admin, err := pgx.Connect(ctx, testenv.PostgresURL())
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { admin.Close(context.Background()) })
	conns := func() int {
		n := int(s.pool.Stat().TotalConns())
		for _, db := range s.dbs {
			n += db.Stats().OpenConnections
		}
		return n
	}
	var (
		pids []int32
		seen = -1
	)
	read := func() (int64, bool) {
		if n := conns(); n != seen {
			rows, err := admin.Query(ctx, `SELECT pid FROM pg_stat_activity WHERE application_name = $1`, s.schema)
			if err != nil {
				return 0, false
			}
			if pids, err = pgx.CollectRows(rows, pgx.RowTo[int32]); err != nil {
				return 0, false
			}
			seen = n
		}
		var sum int64
		for _, pid := range pids {
			data, err := os.ReadFile("/proc/" + strconv.Itoa(int(pid)) + "/schedstat")
			if err != nil {
				continue // a connection closed since
			}
			if f := strings.Fields(string(data)); len(f) > 0 {
				ns, err := strconv.ParseInt(f[0], 10, 64)
				if err != nil {
					return 0, false
				}
				sum += ns
			}
		}
		return sum, len(pids) > 0
	}
	if _, ok := read(); !ok {
		return nil
	}
	return func() int64 { n, _ := read(); return n }
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

// The floor of a PostgreSQL lease: the least SQL that grants a lease with
// a fencing token and releases it, one statement each, in tables of the
// benchmark's own. Table mode: an upsert that takes the row only when it
// has expired and mints greatest(token + 1, the server clock in µs), and a
// compare-and-free. Session mode, on a connection taken from the pool for
// the cycle: a try-lock and the same upsert on a token row with an expiry
// (a new holder must wait out the last one's, invariant 1), and a
// compare-and-free with the unlock. No wake-up (NOTIFY), no ended owners,
// no line of waiters, no idle_session_timeout. The releases commit without
// waiting for the WAL flush, as pglease's do (a release lost in a crash
// leaves the grant to expire: see pgleasesql's asyncCommit), so that the
// ratios compare the work of the statements, not two commit modes.
const (
	floorTables = `CREATE TABLE floor_leases (
	name text PRIMARY KEY, owner text NOT NULL, token bigint NOT NULL, expires_at timestamptz NOT NULL);
CREATE TABLE floor_session_leases (
	name text PRIMARY KEY, owner text NOT NULL, token bigint NOT NULL, expires_at timestamptz NOT NULL)`
	// $1 name, $2 owner, $3 TTL in µs.
	floorAcquire = `INSERT INTO floor_leases AS l (name, owner, token, expires_at)
SELECT $1, $2, (extract(epoch FROM c.t) * 1000000)::bigint, c.t + $3::bigint * interval '1 microsecond'
FROM (SELECT clock_timestamp() AS t) c
ON CONFLICT (name) DO UPDATE SET owner = EXCLUDED.owner, token = greatest(l.token + 1, EXCLUDED.token), expires_at = EXCLUDED.expires_at
WHERE l.expires_at <= clock_timestamp()
RETURNING l.token`
	// $1 name, $2 owner, $3 token.
	floorRelease = `UPDATE floor_leases SET owner = '', expires_at = '-infinity'
WHERE name = $1 AND owner = $2 AND token = $3 AND expires_at > clock_timestamp()
RETURNING set_config('synchronous_commit', 'off', true)`
	// $1 name, $2 owner, $3 TTL in µs, $4 lock key.
	floorSessionAcquire = `WITH k AS (SELECT pg_try_advisory_lock($4::bigint) AS ok),
t AS (
	INSERT INTO floor_session_leases AS t (name, owner, token, expires_at)
	SELECT $1, $2, (extract(epoch FROM c.t) * 1000000)::bigint, c.t + $3::bigint * interval '1 microsecond'
	FROM k, (SELECT clock_timestamp() AS t) c WHERE k.ok
	ON CONFLICT (name) DO UPDATE SET owner = EXCLUDED.owner, token = greatest(t.token + 1, EXCLUDED.token), expires_at = EXCLUDED.expires_at
	WHERE t.expires_at <= clock_timestamp()
	RETURNING t.token
)
SELECT coalesce((SELECT token FROM t), 0) FROM k`
	// $1 name, $2 owner, $3 token, $4 lock key.
	floorSessionRelease = `WITH r AS (
	UPDATE floor_session_leases SET owner = '', expires_at = '-infinity' WHERE name = $1 AND owner = $2 AND token = $3
	RETURNING set_config('synchronous_commit', 'off', true)
)
SELECT pg_advisory_unlock($4::bigint), EXISTS (SELECT 1 FROM r)`
)

// pgCycle is one implementation's acquire+release of a lease name.
type pgCycle struct {
	name  string
	cycle func() error
}

// pgCycles returns, over the setup's pool, the cycles BenchmarkPGCycle
// compares, on the name: fencekit in each mode, each mode's floor, each
// mode's pglease statements sent directly, and pglock.
func pgCycles(b *testing.B, s *pgSetup, name string) map[string]pgCycle {
	b.Helper()
	ctx := context.Background()
	if _, err := s.pool.Exec(ctx, floorTables); err != nil && !strings.Contains(err.Error(), "already exists") {
		b.Fatal(err)
	}
	manager := func(mode pglease.Mode) func() error {
		m, err := lease.NewManager(newPGBackend(b, s, mode), benchTTL)
		if err != nil {
			b.Fatal(err)
		}
		return func() error {
			l, err := m.TryAcquire(ctx, name)
			if err != nil {
				return err
			}
			return l.Release(ctx)
		}
	}
	pl := s.newPglock(b, benchTTL, pglock.DefaultHeartbeatFrequency)
	q := pgleasesql.New("")
	ttlUs := benchTTL.Microseconds()
	endedUs := driver.EndedOwnerTTL(benchTTL).Microseconds()
	ttlMs := strconv.FormatInt(benchTTL.Milliseconds(), 10)
	var owners atomic.Int64
	// Owners are never reused: the store refuses an owner it ended within
	// driver.EndedOwnerTTL.
	owner := func() string { return "bench/" + strconv.FormatInt(owners.Add(1), 10) }
	key := int64(0x5eed) // any key: the floors do not hash names
	withConn := func(f func(*pgxpool.Conn) error) error {
		pc, err := s.pool.Acquire(ctx)
		if err != nil {
			return err
		}
		defer pc.Release()
		return f(pc)
	}
	cs := []pgCycle{
		{"fencekit-table", manager(pglease.ModeTable)},
		{"fencekit-session", manager(pglease.ModeSession)},
		{"floor-table", func() error {
			o := owner()
			var tok int64
			if err := s.pool.QueryRow(ctx, floorAcquire, name, o, ttlUs).Scan(&tok); err != nil {
				return fmt.Errorf("floor-table: acquire: %w", err)
			}
			tag, err := s.pool.Exec(ctx, floorRelease, name, o, tok)
			if err == nil && tag.RowsAffected() != 1 {
				err = errors.New("not held")
			}
			return err
		}},
		{"floor-session", func() error {
			return withConn(func(pc *pgxpool.Conn) error {
				o := owner()
				var tok int64
				if err := pc.QueryRow(ctx, floorSessionAcquire, name, o, ttlUs, key).Scan(&tok); err != nil || tok == 0 {
					return fmt.Errorf("floor-session: acquire: token %d, %v", tok, err)
				}
				var unlocked, freed bool
				if err := pc.QueryRow(ctx, floorSessionRelease, name, o, tok, key).Scan(&unlocked, &freed); err != nil || !unlocked || !freed {
					return fmt.Errorf("floor-session: release: %v %v %v", unlocked, freed, err)
				}
				return nil
			})
		}},
		{"raw-table", func() error {
			o := owner()
			var ok bool
			var tok, hint int64
			if err := s.pool.QueryRow(ctx, q.Acquire, name, o, ttlUs).Scan(&ok, &tok, &hint); err != nil {
				return err
			}
			if !ok {
				return errors.New("raw-table: not granted")
			}
			return s.pool.QueryRow(ctx, q.Release, name, o, tok, pglease.Channel, endedUs).Scan(nil, nil, nil)
		}},
		{"raw-session", func() error {
			return withConn(func(pc *pgxpool.Conn) error {
				o := owner()
				var ok, clean bool
				var tok, hint int64
				var pid int32
				var was string
				if err := pc.QueryRow(ctx, q.SessionAcquire, name, o, key, ttlMs, false, int32(pc.Conn().PgConn().PID()), ttlUs).Scan(&ok, &tok, &pid, &was, &clean, &hint); err != nil {
					return err
				}
				if !ok {
					return errors.New("raw-session: not locked")
				}
				var named, unlocked bool
				return pc.QueryRow(ctx, q.SessionRelease, name, o, tok, pid, key, was, pglease.Channel, endedUs).Scan(&named, &unlocked, nil, nil, nil)
			})
		}},
		{"pglock", func() error {
			l, err := pl.AcquireContext(ctx, name, pglock.FailIfLocked())
			if err != nil {
				return err
			}
			if err := pl.ReleaseContext(ctx, l); err != nil && !errors.Is(err, pglock.ErrLockAlreadyReleased) {
				return err
			}
			// ErrLockAlreadyReleased: on a loaded machine, the lock's
			// heartbeat (5 s) can update the record between pglock's
			// acquire and its release, which then finds another version;
			// the cycle is done all the same.
			return nil
		}},
	}
	m := make(map[string]pgCycle, len(cs))
	for _, c := range cs {
		m[c.name] = c
	}
	return m
}

// pgChurn is how many hand-overs of one name BenchmarkPGCycle makes
// before its churned rounds: FENCE_BENCH_PG_CHURN, default 3000.
func pgChurn(b *testing.B) int {
	v := os.Getenv("FENCE_BENCH_PG_CHURN")
	if v == "" {
		return 3000
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < 0 {
		b.Fatalf("FENCE_BENCH_PG_CHURN=%q: want a count", v)
	}
	return n
}

// BenchmarkPGCycle is one uncontended acquire+release with a 10 s TTL on the
// shared PostgreSQL, each implementation on the same pgx pool (pglock: a
// database/sql handle with the same driver), in one run:
//
//   - lib=fencekit-table, lib=fencekit-session: lease.Manager.TryAcquire +
//     Lease.Release over pglease in each mode (defaults: auto-renewal on).
//   - lib=floor-table, lib=floor-session: the floor, the least SQL that
//     grants with a token and releases, one statement each (floorAcquire
//     and the others above).
//   - lib=raw-table, lib=raw-session: pglease's own two statements sent
//     directly (what the backend sends, without the Manager).
//   - lib=pglock: cirello.io/pglock Acquire (FailIfLocked) + Release, with a
//     10 s lease and its default heartbeat (5 s): a sequence read and an
//     upsert to acquire, an update to release.
//
// Each reports rtts/op, the round trips per cycle, counted as writes on the
// sockets. Then pair=table and pair=session interleave, cycle by cycle in
// a rotating order, the mode's fencekit, floor and raw cycles and pglock's,
// each on a name of its own, and report fencekit's time per cycle (ns/op)
// over the floor's (floor-ratio), over pglock's (pglock-ratio), and the
// raw statements' over the floor's (raw-ratio): ratios of total times,
// and, as -p50, of median cycle times, which a few cycles stalled by the
// shared machine's disk do not move. Where the server runs on this
// machine, they also report the CPU time its processes spent per cycle
// (srv-cpu-ns/op for fencekit, floor-srv-cpu-ns/op for the floor, and
// their ratio floor-srv-cpu-ratio: the server's work, which swings less
// with load than times do). pair=table-churned and pair=session-churned
// do the same after pgChurn hand-overs of fencekit's name (each by a new
// owner, through the Manager): the cost of the owners the store
// remembers as ended (driver.EndedOwnerTTL, 20 s here) must not grow with
// them.
func BenchmarkPGCycle(b *testing.B) {
	s := newPGSetup(b)
	for _, lib := range []string{"fencekit-table", "floor-table", "raw-table", "fencekit-session", "floor-session", "raw-session", "pglock"} {
		c := pgCycles(b, s, "cycle-"+lib)[lib]
		b.Run("lib="+lib, func(b *testing.B) {
			if err := c.cycle(); err != nil { // prepares the statements
				b.Fatal(err)
			}
			rt0, i := s.rt.n.Load(), 0
			for b.Loop() {
				if err := c.cycle(); err != nil {
					b.Fatal(err)
				}
				i++
			}
			b.ReportMetric(float64(s.rt.n.Load()-rt0)/float64(i), "rtts/op")
		})
	}
	churn := pgChurn(b)
	for _, churned := range []bool{false, true} {
		for _, mode := range []string{"table", "session"} {
			name := "pair=" + mode
			if churned {
				name += "-churned"
			}
			// Names of their own: the churned rounds start from the
			// churn alone.
			cs := pgCycles(b, s, name)
			fk, floor, raw, pl := cs["fencekit-"+mode], cs["floor-"+mode], cs["raw-"+mode], cs["pglock"]
			b.Run(name, func(b *testing.B) {
				n := 0
				if churned {
					n = churn
				}
				for range n + 1 { // the last one prepares the statements
					if err := fk.cycle(); err != nil {
						b.Fatal(err)
					}
				}
				for _, c := range []pgCycle{floor, raw, pl} {
					if err := c.cycle(); err != nil {
						b.Fatal(err)
					}
				}
				order := []pgCycle{fk, floor, raw, pl}
				cpu := s.serverCPU(b)
				times := make(map[string][]time.Duration, len(order))
				cpus := make(map[string]int64, len(order))
				for i := 0; b.Loop(); i++ {
					for j := range order {
						c := order[(i+j)%len(order)]
						var c0 int64
						if cpu != nil {
							c0 = cpu()
						}
						t0 := time.Now()
						if err := c.cycle(); err != nil {
							b.Fatal(err)
						}
						times[c.name] = append(times[c.name], time.Since(t0))
						if cpu != nil {
							cpus[c.name] += cpu() - c0
						}
					}
				}
				ops := float64(len(times[fk.name]))
				total := func(name string) float64 {
					var t time.Duration
					for _, d := range times[name] {
						t += d
					}
					return float64(t)
				}
				p50 := func(name string) float64 { return float64(pairbench.Percentile(times[name], 50)) }
				b.ReportMetric(total(fk.name)/ops, "ns/op")
				b.ReportMetric(total(fk.name)/total(floor.name), "floor-ratio")
				b.ReportMetric(total(fk.name)/total(pl.name), "pglock-ratio")
				b.ReportMetric(total(raw.name)/total(floor.name), "raw-ratio")
				b.ReportMetric(p50(fk.name)/p50(floor.name), "floor-ratio-p50")
				b.ReportMetric(p50(fk.name)/p50(pl.name), "pglock-ratio-p50")
				if cpu != nil {
					b.ReportMetric(float64(cpus[fk.name])/ops, "srv-cpu-ns/op")
					b.ReportMetric(float64(cpus[floor.name])/ops, "floor-srv-cpu-ns/op")
					b.ReportMetric(float64(cpus[fk.name])/float64(cpus[floor.name]), "floor-srv-cpu-ratio")
				}
			})
		}
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
	manager := func(mode pglease.Mode) pairbench.BlockingLock {
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
		lock pairbench.BlockingLock
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
			b.ReportMetric(float64(s.rt.n.Load()-rt0)/float64(b.N), "rtts/op")
			b.ReportMetric(float64(res.GiveUps)/float64(b.N), "giveups/op")
			b.ReportMetric(float64(stolen.Load()-stolen0)/float64(b.N), "stolen/op")
		})
	}
}
