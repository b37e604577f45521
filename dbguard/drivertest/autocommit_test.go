package drivertest

import (
	"context"
	"database/sql"
	"testing"

	"github.com/go-sql-driver/mysql"

	"github.com/fencekit/fencekit/dbguard"
	"github.com/fencekit/fencekit/internal/testkit"
)

// TestAutocommitOffWritesAreCommitted: in a session with autocommit off
// (set by the DSN, or by the server's configuration for every new session)
// a statement opens a transaction that stays open on the pooled
// connection; a Table write that returns nil must have been committed, so
// that the row keeps it once the pool is closed (which rolls back what a
// connection left open).
func TestAutocommitOffWritesAreCommitted(t *testing.T) {
	t.Run("dsn", func(t *testing.T) {
		t.Parallel()
		db := Open(t, dbguard.MySQL)
		checkAutocommitOff(t, db, func(c *mysql.Config) { c.Params = map[string]string{"autocommit": "0"} })
	})
	t.Run("server", func(t *testing.T) {
		t.Parallel()
		srv := StartServer(t)
		db := OpenMySQL(t, srv.DSN)
		// Sessions opened from now on start with autocommit off.
		db.Exec(t, `SET GLOBAL autocommit = 0`)
		checkAutocommitOff(t, db, nil)
	})
}

func checkAutocommitOff(t *testing.T, db *DB, edit func(*mysql.Config)) {
	t.Helper()
	ctx := testkit.Context(t)
	// The test's own reads and writes run with autocommit on, whatever
	// the server's default.
	admin := db.OpenWith(t, func(c *mysql.Config) { c.Params = map[string]string{"autocommit": "1"} }, nil)
	exec := func(q string) {
		t.Helper()
		if _, err := admin.ExecContext(ctx, q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	exec(`CREATE TABLE rows_t (id BIGINT PRIMARY KEY, value ` + valueColumn(dbguard.MySQL) + `, ` + lockVersionColumn(dbguard.MySQL) + `)`)
	exec(`INSERT INTO rows_t (id, value, lock_version) VALUES (1, 'old', 1), (2, 'old', 1), (3, 'old', 1), (4, 'old', 1)`)
	tbl, err := dbguard.NewTable(dbguard.MySQL, "", "rows_t", "id")
	if err != nil {
		t.Fatal(err)
	}
	type want struct {
		value string
		lv    uint64
		there bool
	}
	for _, w := range []struct {
		name  string
		id    int64
		write func(ctx context.Context, db dbguard.DBTX) error
		want  want
	}{
		{"update", 1, func(ctx context.Context, p dbguard.DBTX) error {
			return tbl.Update(ctx, p, []any{1}, 5, dbguard.Col("value", "new"))
		}, want{"new", 5, true}},
		{"upsert of an existing row", 2, func(ctx context.Context, p dbguard.DBTX) error {
			return tbl.Upsert(ctx, p, []any{2}, 5, dbguard.Col("value", "new"))
		}, want{"new", 5, true}},
		{"delete", 3, func(ctx context.Context, p dbguard.DBTX) error { return tbl.Delete(ctx, p, []any{3}, 5) }, want{}},
		{"insert", 10, func(ctx context.Context, p dbguard.DBTX) error {
			return tbl.Insert(ctx, p, []any{10}, 5, dbguard.Col("value", "new"))
		}, want{"new", 5, true}},
		{"upsert of a new row", 11, func(ctx context.Context, p dbguard.DBTX) error {
			return tbl.Upsert(ctx, p, []any{11}, 5, dbguard.Col("value", "new"))
		}, want{"new", 5, true}},
		{"update through a *sql.Conn", 4, func(ctx context.Context, p dbguard.DBTX) error {
			conn, err := p.(*sql.DB).Conn(ctx)
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close()
			return tbl.Update(ctx, conn, []any{4}, 5, dbguard.Col("value", "new"))
		}, want{"new", 5, true}},
	} {
		pool := db.OpenWith(t, edit, nil)
		pool.SetMaxOpenConns(1)
		var ac int
		if err := pool.QueryRowContext(ctx, `SELECT @@autocommit`).Scan(&ac); err != nil || ac != 0 {
			t.Fatalf("the pool's session has autocommit %d, %v; the test needs it off", ac, err)
		}
		if err := w.write(ctx, pool); err != nil {
			t.Fatalf("%s: %v", w.name, err)
		}
		// Closing the pool closes its connection: the server rolls back
		// whatever the connection left open.
		if err := pool.Close(); err != nil {
			t.Fatal(err)
		}
		v, lv, ok := rowState(t, admin, "rows_t", w.id)
		if got := (want{v, lv, ok}); got != w.want {
			t.Errorf("%s returned nil; once its pool closed the row is %+v; want %+v", w.name, got, w.want)
		}
	}
}
