package drivertest

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/go-sql-driver/mysql"

	"github.com/fencekit/fencekit/dbguard"
	"github.com/fencekit/fencekit/fence"
	"github.com/fencekit/fencekit/internal/testkit"
)

// newUsers makes a table whose key is id and which has a second unique
// index, users_email_uq on email, with one row (1, a@example.com).
func newUsers(t *testing.T, d dbguard.Dialect) (*DB, *dbguard.Table) {
	t.Helper()
	db := Open(t, d)
	db.Exec(t, `CREATE TABLE users (id BIGINT PRIMARY KEY, email VARCHAR(100) NOT NULL, `+lockVersionColumn(d)+`)`)
	db.Exec(t, `CREATE UNIQUE INDEX users_email_uq ON users (email)`)
	db.Exec(t, `INSERT INTO users (id, email, lock_version) VALUES (1, 'a@example.com', 3)`)
	tbl, err := dbguard.NewTable(d, "", "users", "id")
	if err != nil {
		t.Fatal(err)
	}
	return db, tbl
}

// TestDuplicateOnAnotherIndexIsNotRetryable: an Insert or Upsert of a new
// key whose other columns collide with another row on another unique index
// fails the same way however often it is tried: it must not be reported as
// retryable (a retry loop would spin for ever), nor as a row with the key
// that exists, and the error must name the index (MariaDB) or the
// constraint's columns (SQLite), keeping the driver's error.
func TestDuplicateOnAnotherIndexIsNotRetryable(t *testing.T) {
	for _, d := range dialects {
		t.Run(d.String(), func(t *testing.T) {
			t.Parallel()
			db, tbl := newUsers(t, d)
			ctx := testkit.Context(t)
			want := map[dbguard.Dialect]string{dbguard.MySQL: "users_email_uq", dbguard.SQLite: "users.email"}[d]
			for name, write := range map[string]func() error{
				"insert": func() error { return tbl.Insert(ctx, db.SQL, []any{2}, 5, dbguard.Col("email", "a@example.com")) },
				"upsert": func() error { return tbl.Upsert(ctx, db.SQL, []any{2}, 5, dbguard.Col("email", "a@example.com")) },
			} {
				for try := range 3 {
					err := write()
					switch {
					case err == nil:
						t.Fatalf("%s of a duplicate email = nil", name)
					case dbguard.IsRetryable(err) || errors.Is(err, fence.ErrRetryable):
						t.Fatalf("%s of a duplicate email, try %d = %v: retryable, but it never clears", name, try, err)
					case errors.Is(err, fence.ErrExists) || errors.Is(err, fence.ErrStaleToken) || errors.Is(err, fence.ErrOutcomeUnknown):
						t.Fatalf("%s of a duplicate email = %v; no row has the key 2", name, err)
					case !strings.Contains(err.Error(), want):
						t.Fatalf("%s of a duplicate email = %q; want it to name %s", name, err, want)
					}
					if d == dbguard.MySQL {
						var me *mysql.MySQLError
						if !errors.As(err, &me) || me.Number != 1062 {
							t.Fatalf("%s: errors.As finds no *mysql.MySQLError 1062 in %v", name, err)
						}
					}
				}
				var n int
				if err := db.SQL.QueryRowContext(ctx, `SELECT COUNT(*) FROM users WHERE id = 2`).Scan(&n); err != nil || n != 0 {
					t.Fatalf("%s: rows with id 2: %d, %v", name, n, err)
				}
			}
			// A duplicate of the key itself is still told as it is.
			if err := tbl.Insert(ctx, db.SQL, []any{1}, 5, dbguard.Col("email", "b@example.com")); !errors.Is(err, fence.ErrExists) {
				t.Fatalf("insert of an existing key = %v; want ErrExists", err)
			}
		})
	}
}

// hookConn is a connection of the real driver that runs hook once, after
// the first query whose text contains match has returned its rows.
type hookConn struct {
	driver.Conn
	match string
	hook  *atomic.Pointer[func()]
}

func (c *hookConn) QueryContext(ctx context.Context, q string, args []driver.NamedValue) (driver.Rows, error) {
	rows, err := c.Conn.(driver.QueryerContext).QueryContext(ctx, q, args)
	if err == nil && strings.Contains(q, c.match) {
		if h := c.hook.Swap(nil); h != nil {
			(*h)()
		}
	}
	return rows, err
}

func (c *hookConn) ExecContext(ctx context.Context, q string, args []driver.NamedValue) (driver.Result, error) {
	return c.Conn.(driver.ExecerContext).ExecContext(ctx, q, args)
}

func (c *hookConn) BeginTx(ctx context.Context, opts driver.TxOptions) (driver.Tx, error) {
	return c.Conn.(driver.ConnBeginTx).BeginTx(ctx, opts)
}

type hookConnector struct {
	driver.Connector
	match string
	hook  *atomic.Pointer[func()]
}

func (c hookConnector) Connect(ctx context.Context) (driver.Conn, error) {
	conn, err := c.Connector.Connect(ctx)
	if err != nil {
		return nil, err
	}
	return &hookConn{Conn: conn, match: c.match, hook: c.hook}, nil
}

// TestKeyCreatedConcurrentlyIsRetryable: the one conflict that clears is
// the guarded key's own: another transaction created the row between the
// rejection path's read (which found no row) and its INSERT. That stays
// retryable. The other writer is made to commit exactly there, from
// inside the driver.
func TestKeyCreatedConcurrentlyIsRetryable(t *testing.T) {
	db, tbl := newUsers(t, dbguard.MySQL)
	ctx := testkit.Context(t)
	cfg := db.Config.Clone()
	// Statements with arguments go through QueryContext (without it the
	// driver prepares them, past the hook).
	cfg.InterpolateParams = true
	conn, err := mysql.NewConnector(cfg)
	if err != nil {
		t.Fatal(err)
	}
	hook := new(atomic.Pointer[func()])
	pool := sql.OpenDB(hookConnector{Connector: conn, match: "FOR UPDATE", hook: hook})
	t.Cleanup(func() { pool.Close() })
	create := func() { db.Exec(t, `INSERT INTO users (id, email, lock_version) VALUES (2, 'other@example.com', 9)`) }
	hook.Store(&create)
	// An Upsert of a new row takes the rejection path: its read finds no
	// row 2, the hook commits one, its INSERT collides with it.
	err = tbl.Upsert(ctx, pool, []any{2}, 5, dbguard.Col("email", "c@example.com"))
	if hook.Load() != nil {
		t.Fatal("the rejection path's read did not run")
	}
	if !errors.Is(err, fence.ErrRetryable) {
		t.Fatalf("upsert whose key was created concurrently = %v; want ErrRetryable", err)
	}
	// Tried again, it learns the truth: the row has a newer token.
	if err := tbl.Upsert(ctx, pool, []any{2}, 5, dbguard.Col("email", "c@example.com")); !errors.Is(err, fence.ErrStaleToken) {
		t.Fatalf("upsert again = %v; want stale (5 < 9)", err)
	}
}
