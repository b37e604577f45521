package pglease_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/fencekit/fencekit/internal/pgleasesql"
	"github.com/fencekit/fencekit/internal/testkit"
	"github.com/fencekit/fencekit/internal/testkit/testenv"
	"github.com/fencekit/fencekit/lease"
	"github.com/fencekit/fencekit/lease/driver"
	"github.com/fencekit/fencekit/lease/pglease"
	"github.com/fencekit/fencekit/migrations"
)

// endedStore is one mode's backend on a schema of its own, with the
// quoted names of its lease table and its table of ended owners.
type endedStore struct {
	url, schema   string
	b             *pglease.Backend
	leases, ended string
	conn          *pgx.Conn
}

func newEndedStore(t *testing.T, mode pglease.Mode) *endedStore {
	t.Helper()
	u := testenv.PostgresURL()
	s := &endedStore{url: u, schema: newSchema(t, u)}
	s.b = newBackend(t, newPool(t, u), pglease.WithSchema(s.schema), pglease.WithMode(mode))
	s.leases = pgx.Identifier{s.schema, pglease.LeaseTable}.Sanitize()
	s.ended = pgx.Identifier{s.schema, pglease.EndedTable}.Sanitize()
	if mode == pglease.ModeSession {
		s.leases = pgx.Identifier{s.schema, pglease.SessionLeaseTable}.Sanitize()
		s.ended = pgx.Identifier{s.schema, pglease.SessionEndedTable}.Sanitize()
	}
	s.conn = connectT(t, u)
	return s
}

func (s *endedStore) int(t *testing.T, sql string, args ...any) int {
	t.Helper()
	var n int
	if err := s.conn.QueryRow(testkit.Context(t), sql, args...).Scan(&n); err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
	return n
}

// handOver grants name to owner and releases it.
func (s *endedStore) handOver(t *testing.T, name, owner string) {
	t.Helper()
	ctx := testkit.Context(t)
	g, err := s.b.Acquire(ctx, driver.Request{Name: name, Owner: owner, TTL: 10 * time.Second})
	if err != nil {
		t.Fatalf("Acquire by %s: %v", owner, err)
	}
	if err := s.b.Release(ctx, g); err != nil {
		t.Fatalf("Release by %s: %v", owner, err)
	}
}

// A name that changes hands many times keeps one row in the lease table
// whose size does not grow, and one row per ended owner in the table of
// ended owners; every owner ended within driver.EndedOwnerTTL stays
// refused, the first as well as the last (no bounded list forgets it).
// The lease row used to carry every ended owner in a JSON column that each
// acquire rebuilt: about 15 kB after 300 hand-overs.
func TestEndedOwnersDoNotGrowTheLeaseRow(t *testing.T) {
	for _, mode := range modes {
		t.Run(mode.String(), func(t *testing.T) {
			t.Parallel()
			s := newEndedStore(t, mode)
			const name, n = "churn", 300
			s.handOver(t, name, "owner-0")
			size := s.int(t, `SELECT pg_column_size(l.*) FROM `+s.leases+` l WHERE l.name = $1`, name)
			for i := 1; i < n; i++ {
				s.handOver(t, name, fmt.Sprintf("owner-%d", i))
			}
			if after := s.int(t, `SELECT pg_column_size(l.*) FROM `+s.leases+` l WHERE l.name = $1`, name); after != size {
				t.Errorf("the lease row is %d bytes after %d hand-overs, %d after the first", after, n, size)
			}
			if got := s.int(t, `SELECT count(*) FROM `+s.ended+` WHERE name = $1`, name); got != n {
				t.Errorf("%d rows of ended owners after %d hand-overs, want one per owner", got, n)
			}
			for _, owner := range []string{"owner-0", fmt.Sprintf("owner-%d", n-1)} {
				if _, err := s.b.Acquire(testkit.Context(t), driver.Request{Name: name, Owner: owner, TTL: 10 * time.Second}); !errors.Is(err, lease.ErrNotAcquired) {
					t.Errorf("Acquire by %s, ended %d hand-overs ago or less = %v, want ErrNotAcquired", owner, n, err)
				}
			}
			s.handOver(t, name, "next")
		})
	}
}

// Ended owners whose until has passed are deleted by the name's next
// Abandon, and by its Releases (one time in 16 at random: a few hundred
// make it certain), but never an owner still refused.
func TestEndedOwnersArePruned(t *testing.T) {
	for _, mode := range modes {
		t.Run(mode.String(), func(t *testing.T) {
			t.Parallel()
			s := newEndedStore(t, mode)
			const name = "pruned"
			lapse := func(n int) {
				t.Helper()
				if _, err := s.conn.Exec(testkit.Context(t), `INSERT INTO `+s.ended+` (name, owner, ended_at, until, ends)
					SELECT $1, 'lapsed-' || i, clock_timestamp() - interval '1 minute', clock_timestamp() - interval '1 second', 1
					FROM generate_series(1, $2::int) i`, name, n); err != nil {
					t.Fatal(err)
				}
			}
			lapsed := func() int {
				return s.int(t, `SELECT count(*) FROM `+s.ended+` WHERE name = $1 AND owner LIKE 'lapsed-%'`, name)
			}
			s.handOver(t, name, "live")
			lapse(50)
			if err := s.b.Abandon(testkit.Context(t), driver.Request{Name: name, Owner: "abandoned", TTL: 10 * time.Second}); err != nil {
				t.Fatal(err)
			}
			if n := lapsed(); n != 0 {
				t.Errorf("%d lapsed ended owners left after an Abandon, want 0", n)
			}
			lapse(50)
			for i := range 300 {
				s.handOver(t, name, fmt.Sprintf("owner-%d", i))
			}
			if n := lapsed(); n != 0 {
				t.Errorf("%d lapsed ended owners left after 300 releases, want 0", n)
			}
			for _, owner := range []string{"live", "abandoned", "owner-0"} {
				if _, err := s.b.Acquire(testkit.Context(t), driver.Request{Name: name, Owner: owner, TTL: 10 * time.Second}); !errors.Is(err, lease.ErrNotAcquired) {
					t.Errorf("Acquire by %s, ended and not lapsed = %v, want ErrNotAcquired", owner, err)
				}
			}
		})
	}
}

// An acquire whose statement began before an Abandon of its owner
// committed, and that waited for the lease row the Abandon held, is
// refused once the Abandon commits: the ended owners are read after the
// row's lock, not from the statement's snapshot, which predates the
// Abandon and would grant the name to an owner nobody holds.
func TestAcquireReadsEndedOwnersAfterTheRowLock(t *testing.T) {
	for _, mode := range modes {
		t.Run(mode.String(), func(t *testing.T) {
			t.Parallel()
			s := newEndedStore(t, mode)
			ctx := testkit.Context(t)
			const name, ttl = "race", 10 * time.Second
			s.handOver(t, name, "before") // the name has a row, free
			// The Abandon, in a transaction left open: it holds the row.
			q := pgleasesql.New(s.schema)
			tx, err := s.conn.Begin(ctx)
			if err != nil {
				t.Fatal(err)
			}
			defer tx.Rollback(context.Background())
			endedUs := driver.EndedOwnerTTL(ttl).Microseconds()
			if mode == pglease.ModeSession {
				key := s.b.LockKeyForTest(name)
				_, err = tx.Exec(ctx, q.SessionAbandon, name, "late", endedUs, pglease.Channel, int64(uint64(key)>>32), int64(uint64(key)&0xffffffff), false)
			} else {
				_, err = tx.Exec(ctx, q.Abandon, name, "late", endedUs, pglease.Channel, false)
			}
			if err != nil {
				t.Fatalf("Abandon in a transaction: %v", err)
			}
			acquired := make(chan error, 1)
			go func() {
				g, err := s.b.Acquire(ctx, driver.Request{Name: name, Owner: "late", TTL: ttl})
				if err == nil {
					err = fmt.Errorf("granted %+v", g)
				}
				acquired <- err
			}()
			admin := connectT(t, s.url)
			for {
				var waiting int
				if err := admin.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND strpos(query, $1) > 0`, s.schema).Scan(&waiting); err != nil {
					t.Fatal(err)
				}
				if waiting > 0 {
					break
				}
				time.Sleep(10 * time.Millisecond)
			}
			if err := tx.Commit(ctx); err != nil {
				t.Fatal(err)
			}
			if err := <-acquired; !errors.Is(err, lease.ErrNotAcquired) {
				t.Fatalf("the late acquire of the abandoned owner = %v, want ErrNotAcquired", err)
			}
			if h, err := s.b.Holder(ctx, name); !errors.Is(err, lease.ErrNotHeld) {
				t.Fatalf("after the late acquire: Holder = %+v, %v; want nobody", h, err)
			}
		})
	}
}

// schemaBeforeEndedOwners returns a schema migrated up to the version
// before the tables of ended owners (00006), and a handle to migrate it
// further, closed when the test ends.
func schemaBeforeEndedOwners(t *testing.T, u string) (string, *sql.DB) {
	t.Helper()
	schema := newSchema(t, u)
	db, err := migrations.Open(u, schema)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = db.Close() })
	if _, err := migrations.DownTo(testkit.Context(t), db, 6); err != nil {
		t.Fatal(err)
	}
	return schema, db
}

// A schema migrated before the tables of ended owners existed: Check and
// Acquire say to run the migrations.
func TestNotMigratedToEndedOwners(t *testing.T) {
	u := testenv.PostgresURL()
	schema, _ := schemaBeforeEndedOwners(t, u)
	for _, mode := range modes {
		b := newBackend(t, newPool(t, u), pglease.WithSchema(schema), pglease.WithMode(mode))
		if err := b.Check(testkit.Context(t)); !errors.Is(err, pglease.ErrNotMigrated) {
			t.Errorf("%s: Check = %v, want ErrNotMigrated", mode, err)
		}
		_, err := b.Acquire(testkit.Context(t), driver.Request{Name: "x", Owner: "o", TTL: time.Second})
		if !errors.Is(err, pglease.ErrNotMigrated) || !errors.Is(err, lease.ErrSetup) {
			t.Errorf("%s: Acquire = %v, want ErrNotMigrated", mode, err)
		}
	}
}

// Upgrading a schema keeps the owners its lease rows had recorded as
// ended: migration 00007 copies those still refused into the tables of
// ended owners, so an owner ended just before the upgrade stays refused
// after it; lapsed ones are not copied.
func TestMigrationKeepsLiveEndedOwners(t *testing.T) {
	u := testenv.PostgresURL()
	schema, db := schemaBeforeEndedOwners(t, u)
	ctx := testkit.Context(t)
	ended := `jsonb_build_object('ended', ((extract(epoch FROM clock_timestamp()) + 60) * 1000000)::bigint,
		'lapsed', ((extract(epoch FROM clock_timestamp()) - 1) * 1000000)::bigint)`
	exec(t, u, `INSERT INTO `+pgx.Identifier{schema, pglease.LeaseTable}.Sanitize()+` (name, owner, token, expires_at, ended)
		VALUES ('n', '', 1, '-infinity', `+ended+`)`)
	exec(t, u, `INSERT INTO `+pgx.Identifier{schema, pglease.SessionLeaseTable}.Sanitize()+` (name, owner, token, backend_pid, granted_at, expires_at, ended)
		VALUES ('n', '', 1, 0, clock_timestamp(), '-infinity', `+ended+`)`)
	if _, err := migrations.Up(ctx, db); err != nil {
		t.Fatal(err)
	}
	for _, mode := range modes {
		b := newBackend(t, newPool(t, u), pglease.WithSchema(schema), pglease.WithMode(mode))
		if _, err := b.Acquire(ctx, driver.Request{Name: "n", Owner: "ended", TTL: 10 * time.Second}); !errors.Is(err, lease.ErrNotAcquired) {
			t.Errorf("%s: Acquire by an owner ended before the upgrade = %v, want ErrNotAcquired", mode, err)
		}
		g, err := b.Acquire(ctx, driver.Request{Name: "n", Owner: "lapsed", TTL: 10 * time.Second})
		if err != nil {
			t.Errorf("%s: Acquire by an owner whose end had lapsed before the upgrade = %v", mode, err)
			continue
		}
		if err := b.Release(ctx, g); err != nil {
			t.Error(err)
		}
	}
}

// A Release commits without waiting for the WAL flush, for its own
// transaction only: the connection's synchronous_commit is the same
// afterwards, so the grants that follow on it still wait for the flush.
func TestReleaseLeavesTheSessionSetting(t *testing.T) {
	u := testenv.PostgresURL()
	for _, mode := range modes {
		t.Run(mode.String(), func(t *testing.T) {
			t.Parallel()
			pool := newPool(t, u, func(c *pgxpool.Config) { c.MaxConns = 1 })
			b := newBackend(t, pool, pglease.WithSchema(newSchema(t, u)), pglease.WithMode(mode))
			ctx := testkit.Context(t)
			var before string
			if err := pool.QueryRow(ctx, "SHOW synchronous_commit").Scan(&before); err != nil {
				t.Fatal(err)
			}
			if before == "off" {
				t.Fatal("the server's synchronous_commit is off: the check cannot tell")
			}
			for i := range 3 {
				g, err := b.Acquire(ctx, driver.Request{Name: "async", Owner: fmt.Sprintf("o%d", i), TTL: 10 * time.Second})
				if err != nil {
					t.Fatal(err)
				}
				if err := b.Release(ctx, g); err != nil {
					t.Fatal(err)
				}
			}
			var after string
			if err := pool.QueryRow(ctx, "SHOW synchronous_commit").Scan(&after); err != nil {
				t.Fatal(err)
			}
			if after != before {
				t.Fatalf("synchronous_commit on the connection after releases: %q, was %q", after, before)
			}
		})
	}
}

// An acquire of a name another owner holds is refused without waiting for
// the lease row's lock: the waiters of a busy name would otherwise take
// that lock in turn (ON CONFLICT locks the row it conflicts with even
// when it grants nothing), and the holder's own statements would queue
// behind them.
func TestRefusalTakesNoRowLock(t *testing.T) {
	s := newEndedStore(t, pglease.ModeTable)
	ctx := testkit.Context(t)
	const name = "busy"
	g, err := s.b.Acquire(ctx, driver.Request{Name: name, Owner: "holder", TTL: 10 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	// Another statement holds the row's lock (a renewal, a release).
	tx, err := s.conn.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(context.Background())
	if _, err := tx.Exec(ctx, `SELECT 1 FROM `+s.leases+` WHERE name = $1 FOR UPDATE`, name); err != nil {
		t.Fatal(err)
	}
	refused := make(chan error, 1)
	go func() {
		_, err := s.b.Acquire(ctx, driver.Request{Name: name, Owner: "waiter", TTL: 10 * time.Second})
		refused <- err
	}()
	select {
	case err := <-refused:
		var na *driver.NotAcquiredError
		if !errors.As(err, &na) || na.RetryAfter <= 0 {
			t.Fatalf("Acquire of a held name = %v, want a refusal with the holder's time left", err)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("the refusal waited for the lease row's lock")
	}
	if err := tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	if err := s.b.Release(ctx, g); err != nil {
		t.Fatal(err)
	}
}
