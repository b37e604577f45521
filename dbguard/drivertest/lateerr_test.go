package drivertest

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/fencekit/fencekit/dbguard"
	"github.com/fencekit/fencekit/fence"
	"github.com/fencekit/fencekit/internal/testkit"
)

// lateErrConn is a connection of the real SQLite driver that, while fail
// is set, runs each UPDATE to completion and then returns the context's
// error, as an in-process driver does when the context ends just as the
// statement finishes. It stays valid (driver.Validator), as such a
// connection does.
type lateErrConn struct {
	driver.Conn
	fail *atomic.Bool
}

func (c *lateErrConn) ExecContext(ctx context.Context, q string, args []driver.NamedValue) (driver.Result, error) {
	res, err := c.Conn.(driver.ExecerContext).ExecContext(ctx, q, args)
	if err == nil && c.fail.Load() && strings.HasPrefix(strings.TrimSpace(strings.ToUpper(q)), "UPDATE") {
		return nil, context.DeadlineExceeded
	}
	return res, err
}

func (c *lateErrConn) QueryContext(ctx context.Context, q string, args []driver.NamedValue) (driver.Rows, error) {
	return c.Conn.(driver.QueryerContext).QueryContext(ctx, q, args)
}

func (c *lateErrConn) BeginTx(ctx context.Context, opts driver.TxOptions) (driver.Tx, error) {
	return c.Conn.(driver.ConnBeginTx).BeginTx(ctx, opts)
}

func (c *lateErrConn) IsValid() bool { return true }

type lateErrConnector struct {
	drv  driver.Driver
	dsn  string
	fail *atomic.Bool
}

func (c lateErrConnector) Connect(context.Context) (driver.Conn, error) {
	conn, err := c.drv.Open(c.dsn)
	if err != nil {
		return nil, err
	}
	return &lateErrConn{Conn: conn, fail: c.fail}, nil
}

func (c lateErrConnector) Driver() driver.Driver { return c.drv }

// TestContextErrorAfterApplyIsUnknown: a write whose statement was applied
// but whose driver returned the context's error on a connection it still
// reports valid is an unknown outcome, never a plain failure. The
// reliability suite's history check caught modernc.org/sqlite doing this at
// high load (a write reported failed with "context deadline exceeded" was
// read back applied); dbguard had read the valid connection as proof that
// nothing was applied.
func TestContextErrorAfterApplyIsUnknown(t *testing.T) {
	db, tbl := newRows(t, dbguard.SQLite)
	db.Exec(t, `INSERT INTO rows_t (id, value, lock_version) VALUES (1, 'old', 1)`)
	fail := new(atomic.Bool)
	late := sql.OpenDB(lateErrConnector{drv: db.SQL.Driver(), dsn: db.DSN, fail: fail})
	t.Cleanup(func() { late.Close() })
	ctx := testkit.Context(t)
	// A first write through the same pool reads the catalog, unhindered.
	if err := tbl.Update(ctx, late, []any{1}, 2, dbguard.Col("value", "first")); err != nil {
		t.Fatal(err)
	}
	fail.Store(true)
	err := tbl.Update(ctx, late, []any{1}, 3, dbguard.Col("value", "applied"))
	fail.Store(false)
	var value string
	if qerr := db.SQL.QueryRowContext(ctx, `SELECT value FROM rows_t WHERE id = 1`).Scan(&value); qerr != nil {
		t.Fatal(qerr)
	}
	if value != "applied" {
		t.Fatalf("the statement was not applied (value %q): the test needs a write the driver applied", value)
	}
	if !errors.Is(err, fence.ErrOutcomeUnknown) || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Update applied, with the context's error from the driver = %v; want fence.ErrOutcomeUnknown joined with context.DeadlineExceeded", err)
	}
}
