package sqlguard_test

import (
	"context"
	"fmt"
	"regexp"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"go.uber.org/goleak"

	"github.com/fencekit/fencekit/internal/testkit"
	"github.com/fencekit/fencekit/internal/testkit/testenv"
	"github.com/fencekit/fencekit/migrations/migrationstest"
	"github.com/fencekit/fencekit/sqlguard"
)

func TestMain(m *testing.M) {
	testkit.ChildMain(jobWorkerVar, runJobWorker)
	goleak.VerifyTestMain(m)
}

// env is one test's throwaway schema with fencekit's migrations applied,
// and a pool whose search_path is that schema.
type env struct{ *migrationstest.Env }

var nonIdent = regexp.MustCompile(`[^a-z0-9]+`)

// connect opens a connection for a test's own use, failing loudly when
// PostgreSQL is not there.
func connect(tb testing.TB, ctx context.Context, searchPath string) *pgx.Conn {
	tb.Helper()
	cfg, err := pgx.ParseConfig(testenv.PostgresURL())
	if err != nil {
		tb.Fatalf("FENCE_POSTGRES_URL: %v", err)
	}
	if searchPath != "" {
		cfg.RuntimeParams["search_path"] = searchPath
	}
	c, err := pgx.ConnectConfig(ctx, cfg)
	if err != nil {
		tb.Fatalf("PostgreSQL is required for these tests and is not reachable at %s (set %s or run scripts/test.sh): %v",
			testenv.PostgresURL(), testenv.PostgresURLVar, err)
	}
	tb.Cleanup(func() { c.Close(context.Background()) })
	return c
}

// newEnv creates a throwaway schema, migrates it and returns a pool on it.
// The schema is dropped when the test ends.
func newEnv(tb testing.TB) *env {
	tb.Helper()
	return &env{migrationstest.New(tb, testkit.UniqueName(tb, "fk_"))}
}

// exec runs SQL on the env's pool, failing the test on error.
func (e *env) exec(tb testing.TB, sql string, args ...any) {
	tb.Helper()
	if _, err := e.Pool.Exec(context.Background(), sql, args...); err != nil {
		tb.Fatalf("%s: %v", sql, err)
	}
}

// int64Query returns the single int64 a query returns.
func (e *env) int64Query(tb testing.TB, sql string, args ...any) int64 {
	tb.Helper()
	var v int64
	if err := e.Pool.QueryRow(context.Background(), sql, args...).Scan(&v); err != nil {
		tb.Fatalf("%s: %v", sql, err)
	}
	return v
}

// accountsTable creates a table like most tests use: name(id, owner,
// balance, lock_version), with rows (1, 'ann', 100, lv1) and (2, 'bob',
// 200, lv2), and returns its sqlguard.Table.
func (e *env) accountsTable(tb testing.TB, name string, lv1, lv2 int64) *sqlguard.Table {
	tb.Helper()
	id := pgx.Identifier{name}.Sanitize()
	e.exec(tb, `CREATE TABLE `+id+` (
		id int PRIMARY KEY,
		owner text NOT NULL,
		balance int NOT NULL DEFAULT 0,
		lock_version bigint NOT NULL DEFAULT 0 CHECK (lock_version >= 0))`)
	e.exec(tb, `INSERT INTO `+id+` (id, owner, balance, lock_version) VALUES (1, 'ann', 100, $1), (2, 'bob', 200, $2)`, lv1, lv2)
	tbl, err := sqlguard.NewTable("", name, "id")
	if err != nil {
		tb.Fatal(err)
	}
	return tbl
}

// row is one accounts row; found is false when it does not exist.
type row struct {
	found       bool
	owner       string
	balance     int
	lockVersion int64
}

func (e *env) row(tb testing.TB, table string, id int) row {
	tb.Helper()
	r := row{found: true}
	err := e.Pool.QueryRow(context.Background(),
		`SELECT owner, balance, lock_version FROM `+pgx.Identifier{table}.Sanitize()+` WHERE id = $1`, id).
		Scan(&r.owner, &r.balance, &r.lockVersion)
	if err == pgx.ErrNoRows {
		return row{}
	}
	if err != nil {
		tb.Fatalf("read %s(%d): %v", table, id, err)
	}
	return r
}

// waitBlocked waits until the backend pid is waiting for a lock.
func waitBlocked(tb testing.TB, e *env, pid uint32) {
	tb.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		var waiting bool
		err := e.Pool.QueryRow(context.Background(),
			`SELECT coalesce(wait_event_type = 'Lock', false) FROM pg_stat_activity WHERE pid = $1`, int32(pid)).Scan(&waiting)
		if err != nil && err != pgx.ErrNoRows {
			tb.Fatalf("pg_stat_activity: %v", err)
		}
		if waiting {
			return
		}
		time.Sleep(5 * time.Millisecond)
	}
	tb.Fatalf("backend %d never blocked on a lock", pid)
}

// countingDB wraps a DBTX and counts the calls that reach the database,
// to check that bad input is refused before any I/O.
type countingDB struct {
	calls atomic.Int64
}

func (c *countingDB) Exec(context.Context, string, ...any) (pgconn.CommandTag, error) {
	c.calls.Add(1)
	return pgconn.CommandTag{}, fmt.Errorf("countingDB: no I/O expected")
}

func (c *countingDB) Query(context.Context, string, ...any) (pgx.Rows, error) {
	c.calls.Add(1)
	return nil, fmt.Errorf("countingDB: no I/O expected")
}

func (c *countingDB) QueryRow(context.Context, string, ...any) pgx.Row {
	c.calls.Add(1)
	return errRow{}
}

func (c *countingDB) Begin(context.Context) (pgx.Tx, error) {
	c.calls.Add(1)
	return nil, fmt.Errorf("countingDB: no I/O expected")
}

// countingTx is a pgx.Tx whose statements are counted by a countingDB; its
// other methods are not implemented.
type countingTx struct {
	pgx.Tx
	c *countingDB
}

func (t countingTx) Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error) {
	return t.c.Exec(ctx, sql, args...)
}

func (t countingTx) Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error) {
	return t.c.Query(ctx, sql, args...)
}

func (t countingTx) QueryRow(ctx context.Context, sql string, args ...any) pgx.Row {
	return t.c.QueryRow(ctx, sql, args...)
}

func (t countingTx) Begin(ctx context.Context) (pgx.Tx, error) { return t.c.Begin(ctx) }

type errRow struct{}

func (errRow) Scan(...any) error { return fmt.Errorf("countingDB: no I/O expected") }
