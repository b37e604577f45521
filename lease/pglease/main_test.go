package pglease_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"go.uber.org/goleak"

	"github.com/fencekit/fencekit/internal/testkit"
	"github.com/fencekit/fencekit/internal/testkit/testenv"
	"github.com/fencekit/fencekit/lease/pglease"
	"github.com/fencekit/fencekit/migrations"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// newSchema creates a throwaway schema on the server at url, runs
// fencekit's migrations in it, and drops it when the test ends.
func newSchema(tb testing.TB, url string) string {
	tb.Helper()
	ctx := testkit.Context(tb)
	schema := testkit.UniqueName(tb, "pgl_")
	admin, err := pgx.Connect(ctx, url)
	if err != nil {
		tb.Fatalf("PostgreSQL is required for these tests and is not reachable at %s (set %s or run scripts/test.sh): %v",
			url, testenv.PostgresURLVar, err)
	}
	defer admin.Close(ctx)
	if _, err := admin.Exec(ctx, "CREATE SCHEMA "+pgx.Identifier{schema}.Sanitize()); err != nil {
		tb.Fatalf("create schema: %v", err)
	}
	tb.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		c, err := pgx.Connect(ctx, url)
		if err != nil {
			tb.Logf("drop schema %s: %v", schema, err) // a test that stopped its own server
			return
		}
		defer c.Close(ctx)
		if _, err := c.Exec(ctx, "DROP SCHEMA "+pgx.Identifier{schema}.Sanitize()+" CASCADE"); err != nil {
			tb.Errorf("drop schema %s: %v", schema, err)
		}
	})
	db, err := migrations.Open(url, schema)
	if err != nil {
		tb.Fatal(err)
	}
	defer db.Close()
	if _, err := migrations.Up(ctx, db); err != nil {
		tb.Fatalf("migrations.Up: %v", err)
	}
	return schema
}

// newPool opens a pool on url, closed when the test ends (after the
// backends made on it, which register their Close later).
func newPool(tb testing.TB, url string, configure ...func(*pgxpool.Config)) *pgxpool.Pool {
	tb.Helper()
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		tb.Fatal(err)
	}
	cfg.MaxConns = 16
	for _, f := range configure {
		f(cfg)
	}
	p, err := pgxpool.NewWithConfig(testkit.Context(tb), cfg)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(p.Close)
	return p
}

func newBackend(tb testing.TB, pool pglease.Pool, opts ...pglease.Option) *pglease.Backend {
	tb.Helper()
	b, err := pglease.New(pool, opts...)
	if err != nil {
		tb.Fatalf("pglease.New: %v", err)
	}
	tb.Cleanup(func() { _ = b.Close() })
	return b
}

// connectT opens a connection to url, closed when the test ends.
func connectT(tb testing.TB, url string) *pgx.Conn {
	tb.Helper()
	c, err := pgx.Connect(testkit.Context(tb), url)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { c.Close(context.Background()) })
	return c
}

// exec runs SQL on a new connection to url.
func exec(tb testing.TB, url, sql string, args ...any) {
	tb.Helper()
	ctx := testkit.Context(tb)
	c, err := pgx.Connect(ctx, url)
	if err != nil {
		tb.Fatal(err)
	}
	defer c.Close(ctx)
	if _, err := c.Exec(ctx, sql, args...); err != nil {
		tb.Fatalf("%s: %v", sql, err)
	}
}

// terminate ends the server processes with pg_terminate_backend and waits
// until they are gone.
func terminate(tb testing.TB, url string, pids []uint32) {
	tb.Helper()
	if len(pids) == 0 {
		tb.Fatal("terminate: no server process to end")
	}
	ctx := testkit.Context(tb)
	c, err := pgx.Connect(ctx, url)
	if err != nil {
		tb.Fatal(err)
	}
	defer c.Close(ctx)
	for _, pid := range pids {
		var ok bool
		// A process that exited meanwhile (an idle connection the pool
		// closed) counts as ended.
		if err := c.QueryRow(ctx, "SELECT coalesce((SELECT pg_terminate_backend(pid, 10000) FROM pg_stat_activity WHERE pid = $1), true)", int32(pid)).Scan(&ok); err != nil || !ok {
			tb.Fatalf("pg_terminate_backend(%d) = %v, %v", pid, ok, err)
		}
	}
}
