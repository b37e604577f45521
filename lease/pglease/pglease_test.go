package pglease_test

import (
	"context"
	"errors"
	"net"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/fencekit/fencekit/fence"
	"github.com/fencekit/fencekit/internal/testkit"
	"github.com/fencekit/fencekit/internal/testkit/testenv"
	"github.com/fencekit/fencekit/lease"
	"github.com/fencekit/fencekit/lease/driver"
	"github.com/fencekit/fencekit/lease/leasetest"
	"github.com/fencekit/fencekit/lease/pglease"
	"github.com/fencekit/fencekit/migrations"
)

func TestNewRejectsBadOptions(t *testing.T) {
	if _, err := pglease.New(nil); !errors.Is(err, pglease.ErrInvalidOptions) {
		t.Fatalf("New(nil) = %v, want ErrInvalidOptions", err)
	}
	pool, err := pgxpool.New(context.Background(), "postgres://127.0.0.1:1/x")
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	_, err = pglease.New(nil, pglease.WithMode(7), pglease.WithSchema("a\x00b"))
	for _, want := range []string{"pool is nil", "unknown mode 7", "schema"} {
		if !errors.Is(err, pglease.ErrInvalidOptions) || !strings.Contains(err.Error(), want) {
			t.Errorf("New with three problems = %v; want ErrInvalidOptions mentioning %q", err, want)
		}
	}
	if _, err := pglease.New(pool, pglease.WithSchema(strings.Repeat("s", 64))); !errors.Is(err, pglease.ErrInvalidOptions) {
		t.Errorf("New with a 64-byte schema = %v, want ErrInvalidOptions", err)
	}
	if _, err := pglease.ParseMode("advisory"); !errors.Is(err, pglease.ErrInvalidOptions) {
		t.Errorf("ParseMode(advisory) = %v", err)
	}
	for _, m := range modes {
		if got, err := pglease.ParseMode(m.String()); err != nil || got != m {
			t.Errorf("ParseMode(%q) = %v, %v", m, got, err)
		}
	}
}

// The table names match the ones the migrations create.
func TestTableNamesMatchMigrations(t *testing.T) {
	url := testenv.PostgresURL()
	schema := newSchema(t, url)
	conn := connectT(t, url)
	for _, name := range []string{pglease.LeaseTable, pglease.SessionLeaseTable, pglease.WaiterTable, pglease.SessionWaiterTable, pglease.EndedTable, pglease.SessionEndedTable} {
		var ok bool
		if err := conn.QueryRow(testkit.Context(t), `SELECT to_regclass($1) IS NOT NULL`, pgx.Identifier{schema, name}.Sanitize()).Scan(&ok); err != nil || !ok {
			t.Errorf("table %s after migrations.Up: %v, %v", name, ok, err)
		}
	}
}

// Without the migrations, every operation says so.
func TestNotMigrated(t *testing.T) {
	url := testenv.PostgresURL()
	for _, mode := range modes {
		b := newBackend(t, newPool(t, url), pglease.WithSchema("fencekit_no_such_schema"), pglease.WithMode(mode))
		_, err := b.Acquire(testkit.Context(t), driver.Request{Name: "x", Owner: "o", TTL: time.Second})
		if !errors.Is(err, pglease.ErrNotMigrated) {
			t.Errorf("%s: Acquire without migrations = %v, want ErrNotMigrated", mode, err)
		}
	}
}

// Tokens keep growing when the rows that carry them are lost: the table
// truncated, the row deleted, the row set back to an old token (a restore
// from an older backup), and the tables dropped and created again.
func TestTokensSurviveRowLoss(t *testing.T) {
	url := testenv.PostgresURL()
	for _, mode := range modes {
		t.Run(mode.String(), func(t *testing.T) {
			schema := newSchema(t, url)
			table := pgx.Identifier{schema, pglease.LeaseTable}.Sanitize()
			if mode == pglease.ModeSession {
				table = pgx.Identifier{schema, pglease.SessionLeaseTable}.Sanitize()
			}
			m := testkit.NewManager(t, newBackend(t, newPool(t, url), pglease.WithSchema(schema), pglease.WithMode(mode)), 10*time.Second)
			const name = "row-loss"
			steps := []struct {
				what string
				lose func()
			}{
				{"TRUNCATE", func() { exec(t, url, "TRUNCATE "+table) }},
				{"DELETE the row", func() { exec(t, url, "DELETE FROM "+table+" WHERE name = $1", name) }},
				{"token set back to 1", func() { exec(t, url, "UPDATE "+table+" SET token = 1 WHERE name = $1", name) }},
				{"tables dropped and created again", func() {
					db, err := migrations.Open(url, schema)
					if err != nil {
						t.Fatal(err)
					}
					defer db.Close()
					if _, err := migrations.DownTo(testkit.Context(t), db, 1); err != nil {
						t.Fatal(err)
					}
					if _, err := migrations.Up(testkit.Context(t), db); err != nil {
						t.Fatal(err)
					}
				}},
			}
			last := fence.None
			for _, step := range steps {
				for range 3 { // several grants, so that the stored token is past its first value
					l, err := m.TryAcquire(testkit.Context(t), name)
					if err != nil {
						t.Fatalf("before %s: %v", step.what, err)
					}
					if l.Token() <= last {
						t.Fatalf("before %s: token %d <= previous %d", step.what, l.Token(), last)
					}
					last = l.Token()
					if err := l.Release(testkit.Context(t)); err != nil {
						t.Fatalf("Release: %v", err)
					}
				}
				step.lose()
				l, err := m.TryAcquire(testkit.Context(t), name)
				if err != nil {
					t.Fatalf("after %s: %v", step.what, err)
				}
				if l.Token() <= last {
					t.Fatalf("after %s: token %d is not greater than the last token %d", step.what, l.Token(), last)
				}
				t.Logf("%s: token %d -> %d", step.what, last, l.Token())
				last = l.Token()
				if err := l.Release(testkit.Context(t)); err != nil {
					t.Fatalf("Release: %v", err)
				}
			}
		})
	}
}

// countingConn counts the writes on a connection: each request the driver
// sends goes out in one write, so a round trip is one write.
type countingConn struct {
	net.Conn
	n *atomic.Int64
}

func (c *countingConn) Write(b []byte) (int, error) {
	c.n.Add(1)
	return c.Conn.Write(b)
}

// SyscallConn lets the backend watch the socket, as it does without the
// wrapper.
func (c *countingConn) SyscallConn() (syscall.RawConn, error) {
	return c.Conn.(syscall.Conn).SyscallConn()
}

// One round trip per acquire, renew and release (once pgx has prepared the
// statements on the connection), in both modes; one for a batch of renewals
// in table mode.
func TestRoundTrips(t *testing.T) {
	url := testenv.PostgresURL()
	for _, mode := range modes {
		t.Run(mode.String(), func(t *testing.T) {
			schema := newSchema(t, url)
			var writes atomic.Int64
			pool := newPool(t, url, func(c *pgxpool.Config) {
				c.MaxConns = 1
				d := &net.Dialer{}
				c.ConnConfig.DialFunc = func(ctx context.Context, network, addr string) (net.Conn, error) {
					conn, err := d.DialContext(ctx, network, addr)
					if err != nil {
						return nil, err
					}
					return &countingConn{Conn: conn, n: &writes}, nil
				}
			})
			b := newBackend(t, pool, pglease.WithSchema(schema), pglease.WithMode(mode))
			m := testkit.NewManager(t, b, 10*time.Second, lease.WithoutAutoRenew())
			cycle := func(name string) (acq, renew, rel int64) {
				t.Helper()
				n := writes.Load()
				l, err := m.TryAcquire(testkit.Context(t), name)
				if err != nil {
					t.Fatal(err)
				}
				acq, n = writes.Load()-n, writes.Load()
				if err := l.Renew(testkit.Context(t)); err != nil {
					t.Fatal(err)
				}
				renew, n = writes.Load()-n, writes.Load()
				if err := l.Release(testkit.Context(t)); err != nil {
					t.Fatal(err)
				}
				return acq, renew, writes.Load() - n
			}
			cycle("warm") // prepares the statements
			if a, r, rel := cycle("counted"); a != 1 || r != 1 || rel != 1 {
				t.Fatalf("round trips: acquire %d, renew %d, release %d; want 1 each", a, r, rel)
			}
			if mode != pglease.ModeTable {
				return
			}
			var gs []driver.Grant
			for _, name := range []string{"b1", "b2", "b3", "b4"} {
				g, err := b.Acquire(testkit.Context(t), driver.Request{Name: name, Owner: "o", TTL: 10 * time.Second})
				if err != nil {
					t.Fatal(err)
				}
				gs = append(gs, g)
			}
			if _, err := leasetest.RenewBatch(testkit.Context(t), b, gs); err != nil { // prepares it
				t.Fatal(err)
			}
			n := writes.Load()
			errs, err := leasetest.RenewBatch(testkit.Context(t), b, gs)
			if err != nil {
				t.Fatal(err)
			}
			for i, err := range errs {
				if err != nil {
					t.Fatalf("RenewBatch[%d]: %v", i, err)
				}
			}
			if got := writes.Load() - n; got != 1 {
				t.Fatalf("RenewBatch of %d grants took %d round trips, want 1", len(gs), got)
			}
		})
	}
}

// A NotAcquiredError from table mode carries the holder's remaining time.
func TestRetryAfterFromStoredExpiry(t *testing.T) {
	url := testenv.PostgresURL()
	schema := newSchema(t, url)
	b := newBackend(t, newPool(t, url), pglease.WithSchema(schema))
	if _, err := b.Acquire(testkit.Context(t), driver.Request{Name: "ra", Owner: "a", TTL: 5 * time.Second}); err != nil {
		t.Fatal(err)
	}
	time.Sleep(time.Second)
	_, err := b.Acquire(testkit.Context(t), driver.Request{Name: "ra", Owner: "b", TTL: 5 * time.Second})
	var na *lease.NotAcquiredError
	if !errors.As(err, &na) {
		t.Fatalf("Acquire = %v, want a NotAcquiredError", err)
	}
	if na.RetryAfter < 3*time.Second || na.RetryAfter > 4*time.Second+500*time.Millisecond {
		t.Fatalf("RetryAfter = %v one second into a 5 s grant; want about 4 s", na.RetryAfter)
	}
}

// Session mode gives the connection back to the pool after a release, with
// its idle_session_timeout as it was, and holds no lock on it.
func TestSessionReleaseGivesCleanConnectionBack(t *testing.T) {
	url := testenv.PostgresURL()
	schema := newSchema(t, url)
	pool := newPool(t, url, func(c *pgxpool.Config) { c.MaxConns = 1 })
	b := newBackend(t, pool, pglease.WithSchema(schema), pglease.WithMode(pglease.ModeSession))
	var before string
	if err := pool.QueryRow(testkit.Context(t), "SHOW idle_session_timeout").Scan(&before); err != nil {
		t.Fatal(err)
	}
	g, err := b.Acquire(testkit.Context(t), driver.Request{Name: "clean", Owner: "o", TTL: 1500 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	if err := b.Release(testkit.Context(t), g); err != nil {
		t.Fatal(err)
	}
	var after string
	var locks int
	if err := pool.QueryRow(testkit.Context(t), "SELECT current_setting('idle_session_timeout'), (SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND pid = pg_backend_pid())").Scan(&after, &locks); err != nil {
		t.Fatal(err)
	}
	if after != before || locks != 0 {
		t.Fatalf("after release: idle_session_timeout %q (was %q), %d advisory locks; want it restored and none", after, before, locks)
	}
}
