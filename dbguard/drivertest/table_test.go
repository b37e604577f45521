package drivertest

import (
	"context"
	"database/sql"
	"errors"
	"math"
	"strconv"
	"strings"
	"testing"

	"github.com/go-sql-driver/mysql"

	"github.com/fencekit/fencekit/dbguard"
	"github.com/fencekit/fencekit/fence"
	"github.com/fencekit/fencekit/internal/testkit"
)

// rowState reads value and lock_version of row id of table, or ok=false.
func rowState(t *testing.T, db *sql.DB, table string, id int64) (value string, lv uint64, ok bool) {
	t.Helper()
	var s string
	err := db.QueryRowContext(testkit.Context(t), `SELECT value, lock_version FROM `+table+` WHERE id = ?`, id).Scan(&value, &s)
	if errors.Is(err, sql.ErrNoRows) {
		return "", 0, false
	}
	if err != nil {
		t.Fatal(err)
	}
	if lv, err = strconv.ParseUint(s, 10, 64); err != nil {
		t.Fatalf("lock_version %q: %v", s, err)
	}
	return value, lv, true
}

func newRows(t *testing.T, d dbguard.Dialect) (*DB, *dbguard.Table) {
	t.Helper()
	db := Open(t, d)
	db.Exec(t, `CREATE TABLE rows_t (id BIGINT PRIMARY KEY, value `+valueColumn(d)+`, `+lockVersionColumn(d)+`)`)
	tbl, err := dbguard.NewTable(d, "", "rows_t", "id")
	if err != nil {
		t.Fatal(err)
	}
	return db, tbl
}

// TestIdenticalRewrite: MySQL counts changed rows unless the client asks
// for found rows, so a rewrite of the same values with the same token
// reports 0 rows affected, as a stale write does. The guard must accept
// the one and reject the other with and without clientFoundRows.
func TestIdenticalRewrite(t *testing.T) {
	for _, d := range dialects {
		// SQLite always counts matched rows: clientFoundRows is MySQL's
		// setting, so SQLite has one case.
		founds := []bool{false, true}
		if d == dbguard.SQLite {
			founds = founds[:1]
		}
		for _, found := range founds {
			t.Run(d.String()+"/foundRows="+strconv.FormatBool(found), func(t *testing.T) {
				t.Parallel()
				db, tbl := newRows(t, d)
				pool := db.OpenWith(t, func(c *mysql.Config) { c.ClientFoundRows = found }, nil)
				ctx := testkit.Context(t)
				db.Exec(t, `INSERT INTO rows_t (id) VALUES (1)`)
				for i := range 3 {
					if err := tbl.Update(ctx, pool, []any{1}, 50, dbguard.Col("value", "same")); err != nil {
						t.Fatalf("write %d of identical values with token 50 = %v; want accepted", i, err)
					}
				}
				err := tbl.Update(ctx, pool, []any{1}, 49, dbguard.Col("value", "same"))
				var se *fence.StaleError
				if !errors.As(err, &se) || se.Presented != 49 || se.Current != 50 {
					t.Fatalf("identical values with stale token 49 = %v; want a StaleError 49 < 50", err)
				}
				// Upsert of an existing row goes the same way.
				if err := tbl.Upsert(ctx, pool, []any{1}, 50, dbguard.Col("value", "same")); err != nil {
					t.Fatalf("identical upsert = %v", err)
				}
				if v, lv, _ := rowState(t, db.SQL, "rows_t", 1); v != "same" || lv != 50 {
					t.Fatalf("row = %q/%d", v, lv)
				}
			})
		}
	}
}

// TestLockVersionType: a lock_version column that cannot hold every token
// exactly is refused, and nothing is written.
func TestLockVersionType(t *testing.T) {
	cases := map[dbguard.Dialect][]string{
		dbguard.MySQL:  {"DOUBLE", "FLOAT", "INT", "BIGINT", "DECIMAL(30,0)", "VARCHAR(30)"},
		dbguard.SQLite: {"REAL", "TEXT", "NUMERIC", "BLOB", ""},
	}
	for _, d := range dialects {
		t.Run(d.String(), func(t *testing.T) {
			t.Parallel()
			db := Open(t, d)
			for i, typ := range cases[d] {
				name := "lv_" + strconv.Itoa(i)
				db.Exec(t, `CREATE TABLE `+name+` (id BIGINT PRIMARY KEY, value `+valueColumn(d)+`, lock_version `+typ+` NOT NULL DEFAULT 0)`)
				db.Exec(t, `INSERT INTO `+name+` (id, value) VALUES (1, 'before')`)
				tbl, err := dbguard.NewTable(d, "", name, "id")
				if err != nil {
					t.Fatal(err)
				}
				for _, write := range []func() error{
					func() error {
						return tbl.Update(testkit.Context(t), db.SQL, []any{1}, 1<<60, dbguard.Col("value", "after"))
					},
					func() error {
						return tbl.Insert(testkit.Context(t), db.SQL, []any{2}, 1<<60, dbguard.Col("value", "after"))
					},
					func() error { return tbl.Delete(testkit.Context(t), db.SQL, []any{1}, 1<<60) },
				} {
					if err := write(); !errors.Is(err, fence.ErrLockVersionType) {
						t.Errorf("lock_version %s: write = %v; want ErrLockVersionType", typ, err)
					}
				}
				if v, _, ok := rowState(t, db.SQL, name, 1); !ok || v != "before" {
					t.Errorf("lock_version %s: the row changed to %q (present %v)", typ, v, ok)
				}
			}
		})
	}
	// SQLite: an INTEGER column holding a value that is not an integer
	// (written around the guard) is refused by the rejection path too.
	t.Run("sqlite/stored-real", func(t *testing.T) {
		t.Parallel()
		db, tbl := newRows(t, dbguard.SQLite)
		db.Exec(t, `INSERT INTO rows_t (id, value, lock_version) VALUES (1, 'before', 7.5)`)
		err := tbl.Update(testkit.Context(t), db.SQL, []any{1}, 100, dbguard.Col("value", "after"))
		if !errors.Is(err, fence.ErrLockVersionType) {
			t.Fatalf("Update over a stored real = %v; want ErrLockVersionType", err)
		}
	})
}

// TestTokenRange: MySQL's BIGINT UNSIGNED holds every token exactly (two
// tokens next to 2^64 stay apart); SQLite's integers stop at 2^63-1, and a
// larger token is refused before any I/O.
func TestTokenRange(t *testing.T) {
	t.Run("mysql", func(t *testing.T) {
		t.Parallel()
		db, tbl := newRows(t, dbguard.MySQL)
		ctx := testkit.Context(t)
		db.Exec(t, `INSERT INTO rows_t (id) VALUES (1)`)
		top := fence.Token(math.MaxUint64)
		if err := tbl.Update(ctx, db.SQL, []any{1}, top, dbguard.Col("value", "top")); err != nil {
			t.Fatal(err)
		}
		err := tbl.Update(ctx, db.SQL, []any{1}, top-1, dbguard.Col("value", "stale"))
		var se *fence.StaleError
		if !errors.As(err, &se) || se.Current != top || se.Presented != top-1 {
			t.Fatalf("token 2^64-2 after 2^64-1 = %v; want stale naming both", err)
		}
		if _, lv, _ := rowState(t, db.SQL, "rows_t", 1); lv != uint64(top) {
			t.Fatalf("lock_version = %d; want %d", lv, uint64(top))
		}
	})
	t.Run("sqlite", func(t *testing.T) {
		t.Parallel()
		db, tbl := newRows(t, dbguard.SQLite)
		pool, cc := db.OpenCounting(t)
		ctx := testkit.Context(t)
		db.Exec(t, `INSERT INTO rows_t (id) VALUES (1)`)
		if err := tbl.Update(ctx, pool, []any{1}, math.MaxInt64, dbguard.Col("value", "max")); err != nil {
			t.Fatal(err)
		}
		before := cc.Calls.Load()
		err := tbl.Update(ctx, pool, []any{1}, math.MaxInt64+1, dbguard.Col("value", "over"))
		if !errors.Is(err, fence.ErrInvalidToken) {
			t.Fatalf("token 2^63 on SQLite = %v; want fence.ErrInvalidToken", err)
		}
		g, _ := dbguard.New(dbguard.SQLite)
		err = g.BeginFunc(ctx, pool, "r", math.MaxInt64+1, func(*sql.Tx) error { return nil })
		if !errors.Is(err, fence.ErrInvalidToken) {
			t.Fatalf("BeginFunc with token 2^63 on SQLite = %v; want fence.ErrInvalidToken", err)
		}
		if n := cc.Calls.Load() - before; n != 0 {
			t.Fatalf("the refused writes ran %d statements", n)
		}
		if v, lv, _ := rowState(t, db.SQL, "rows_t", 1); v != "max" || lv != math.MaxInt64 {
			t.Fatalf("row = %q/%d", v, lv)
		}
	})
}

// TestWriteKinds: Insert, Upsert and Delete, each accepted, stale, and
// told apart from a missing or existing row.
func TestWriteKinds(t *testing.T) {
	for _, d := range dialects {
		t.Run(d.String(), func(t *testing.T) {
			t.Parallel()
			db, tbl := newRows(t, d)
			ctx := testkit.Context(t)
			p := db.SQL
			must := func(what string, err error) {
				t.Helper()
				if err != nil {
					t.Fatalf("%s: %v", what, err)
				}
			}
			must("insert", tbl.Insert(ctx, p, []any{1}, 10, dbguard.Col("value", "a")))
			if err := tbl.Insert(ctx, p, []any{1}, 10, dbguard.Col("value", "b")); !errors.Is(err, fence.ErrExists) {
				t.Fatalf("insert over an equal lock_version = %v; want ErrExists", err)
			}
			if err := tbl.Insert(ctx, p, []any{1}, 9, dbguard.Col("value", "b")); !errors.Is(err, fence.ErrStaleToken) {
				t.Fatalf("insert over a newer lock_version = %v; want stale", err)
			}
			must("upsert new", tbl.Upsert(ctx, p, []any{2}, 5, dbguard.Col("value", "u")))
			must("upsert existing", tbl.Upsert(ctx, p, []any{1}, 11, dbguard.Col("value", "c")))
			if err := tbl.Upsert(ctx, p, []any{1}, 10, dbguard.Col("value", "d")); !errors.Is(err, fence.ErrStaleToken) {
				t.Fatalf("stale upsert = %v", err)
			}
			if v, lv, _ := rowState(t, db.SQL, "rows_t", 1); v != "c" || lv != 11 {
				t.Fatalf("row 1 = %q/%d; want c/11", v, lv)
			}
			if err := tbl.Delete(ctx, p, []any{1}, 10); !errors.Is(err, fence.ErrStaleToken) {
				t.Fatalf("stale delete = %v", err)
			}
			must("delete", tbl.Delete(ctx, p, []any{1}, 11))
			if _, _, ok := rowState(t, db.SQL, "rows_t", 1); ok {
				t.Fatal("row 1 still there")
			}
			if err := tbl.Delete(ctx, p, []any{1}, 11); !errors.Is(err, fence.ErrNotFound) {
				t.Fatalf("delete of a missing row = %v; want ErrNotFound", err)
			}
			// In a caller's transaction: the write is part of it.
			tx, err := p.BeginTx(ctx, nil)
			must("begin", err)
			must("update in tx", tbl.Update(ctx, tx, []any{2}, 6, dbguard.Col("value", "in tx")))
			if err := tbl.Update(ctx, tx, []any{2}, 5, dbguard.Col("value", "stale in tx")); !errors.Is(err, fence.ErrStaleToken) {
				t.Fatalf("stale update in tx = %v", err)
			}
			must("rollback", tx.Rollback())
			if v, lv, _ := rowState(t, db.SQL, "rows_t", 2); v != "u" || lv != 5 {
				t.Fatalf("row 2 after a rolled-back tx = %q/%d; want u/5", v, lv)
			}
		})
	}
}

// TestQuoting: names with the dialect's quote characters, semicolons and
// spaces are quoted, never executed.
func TestQuoting(t *testing.T) {
	for _, d := range dialects {
		t.Run(d.String(), func(t *testing.T) {
			t.Parallel()
			db := Open(t, d)
			table, key, col := "t`x\"; DROP TABLE y", "k`\"'", "v a;l`\" VALUES (x"
			db.Exec(t, `CREATE TABLE y (id INT)`)
			q := func(s string) string {
				if d == dbguard.MySQL {
					return "`" + replaceAll(s, "`", "``") + "`"
				}
				return `"` + replaceAll(s, `"`, `""`) + `"`
			}
			db.Exec(t, `CREATE TABLE `+q(table)+` (`+q(key)+` VARCHAR(20) PRIMARY KEY, `+q(col)+` `+valueColumn(d)+`, `+lockVersionColumn(d)+`)`)
			tbl, err := dbguard.NewTable(d, "", table, key)
			if err != nil {
				t.Fatal(err)
			}
			ctx := testkit.Context(t)
			if err := tbl.Insert(ctx, db.SQL, []any{"a'b"}, 3, dbguard.Col(col, "x'); --")); err != nil {
				t.Fatal(err)
			}
			if err := tbl.Update(ctx, db.SQL, []any{"a'b"}, 2, dbguard.Col(col, "stale")); !errors.Is(err, fence.ErrStaleToken) {
				t.Fatalf("stale update = %v", err)
			}
			var v string
			if err := db.SQL.QueryRowContext(ctx, `SELECT `+q(col)+` FROM `+q(table)).Scan(&v); err != nil || v != "x'); --" {
				t.Fatalf("value = %q, %v", v, err)
			}
			db.Exec(t, `SELECT COUNT(*) FROM y`) // still there
		})
	}
}

func replaceAll(s, old, new string) string {
	out := ""
	for i := 0; i < len(s); {
		if len(s)-i >= len(old) && s[i:i+len(old)] == old {
			out += new
			i += len(old)
			continue
		}
		out += s[i : i+1]
		i++
	}
	return out
}

// TestSetupErrors: a missing table, a missing lock_version, a key with no
// unique index.
func TestSetupErrors(t *testing.T) {
	for _, d := range dialects {
		t.Run(d.String(), func(t *testing.T) {
			t.Parallel()
			db := Open(t, d)
			ctx := testkit.Context(t)
			nope, _ := dbguard.NewTable(d, "", "nope", "id")
			if err := nope.Update(ctx, db.SQL, []any{1}, 1); !errors.Is(err, fence.ErrNoTable) {
				t.Errorf("missing table = %v; want ErrNoTable", err)
			}
			db.Exec(t, `CREATE TABLE nolv (id BIGINT PRIMARY KEY, value TEXT)`)
			nolv, _ := dbguard.NewTable(d, "", "nolv", "id")
			if err := nolv.Update(ctx, db.SQL, []any{1}, 1); !errors.Is(err, fence.ErrNoLockVersion) ||
				!strings.Contains(err.Error(), "fencekit migrate add-lock-version --dialect "+d.String()+" --table nolv --apply") {
				t.Errorf("no lock_version = %v; want ErrNoLockVersion naming the command", err)
			}
			db.Exec(t, `CREATE TABLE dup (id BIGINT, value `+valueColumn(d)+`, `+lockVersionColumn(d)+`)`)
			db.Exec(t, `INSERT INTO dup (id) VALUES (1), (1), (2)`)
			dup, _ := dbguard.NewTable(d, "", "dup", "id")
			if err := dup.Update(ctx, db.SQL, []any{1}, 5, dbguard.Col("value", "x")); !errors.Is(err, fence.ErrAmbiguousKey) {
				t.Errorf("update of a duplicated key = %v; want ErrAmbiguousKey", err)
			}
			if err := dup.Update(ctx, db.SQL, []any{2}, 5, dbguard.Col("value", "x")); err != nil {
				t.Errorf("update of a unique key without a unique index = %v; want it written (exact path)", err)
			}
			if err := dup.Insert(ctx, db.SQL, []any{3}, 5); !errors.Is(err, fence.ErrAmbiguousKey) {
				t.Errorf("insert without a unique index = %v; want ErrAmbiguousKey", err)
			}
			g, _ := dbguard.New(d, dbguard.WithDatabase(map[dbguard.Dialect]string{dbguard.MySQL: "fk_no_such_db", dbguard.SQLite: "temp"}[d]))
			err := g.BeginFunc(ctx, db.SQL, "r", 1, func(*sql.Tx) error { return nil })
			if !errors.Is(err, fence.ErrNotMigrated) {
				t.Errorf("BeginFunc without the table = %v; want ErrNotMigrated", err)
			}
		})
	}
}

// TestBadInputBeforeIO: every bad argument is refused, all at once,
// before any statement.
func TestBadInputBeforeIO(t *testing.T) {
	db, tbl := newRows(t, dbguard.SQLite)
	pool, cc := db.OpenCounting(t)
	ctx := testkit.Context(t)
	before := cc.Calls.Load()
	err := tbl.Update(ctx, pool, []any{nil}, 0, dbguard.Col("lock_version", 1), dbguard.Col("id", 2), dbguard.Col("", 3))
	for _, want := range []error{fence.ErrInvalidToken, fence.ErrInvalidArgument} {
		if !errors.Is(err, want) {
			t.Errorf("bad update = %v; want it to match %v", err, want)
		}
	}
	g, _ := dbguard.New(dbguard.SQLite)
	if err := g.BeginFunc(ctx, pool, "", 1, nil); !errors.Is(err, fence.ErrInvalidArgument) {
		t.Errorf("BeginFunc with no name and no function = %v", err)
	}
	if err := g.BeginFunc(ctx, pool, "a\x00b", 1, func(*sql.Tx) error { return nil }); !errors.Is(err, fence.ErrInvalidArgument) {
		t.Errorf("BeginFunc with a NUL in the name = %v", err)
	}
	if n := cc.Calls.Load() - before; n != 0 {
		t.Fatalf("bad input ran %d statements", n)
	}
	if _, err := dbguard.NewTable(dbguard.Dialect(0), "", "t", "id"); !errors.Is(err, fence.ErrInvalidArgument) {
		t.Errorf("unknown dialect = %v", err)
	}
	if _, err := dbguard.NewTable(dbguard.MySQL, "", "t ", "lock_version", "k", "k"); !errors.Is(err, fence.ErrInvalidArgument) {
		t.Errorf("bad table = %v", err)
	}
	if _, err := dbguard.New(dbguard.MySQL, dbguard.WithTxOptions(sql.TxOptions{ReadOnly: true})); !errors.Is(err, fence.ErrInvalidArgument) {
		t.Errorf("read-only tx options = %v", err)
	}
	if _, err := dbguard.New(dbguard.SQLite, dbguard.WithTxOptions(sql.TxOptions{Isolation: sql.LevelReadCommitted})); !errors.Is(err, fence.ErrInvalidArgument) {
		t.Errorf("READ COMMITTED on SQLite = %v; want ErrInvalid (SQLite is serializable)", err)
	}
	if _, err := dbguard.New(dbguard.MySQL, dbguard.WithTxOptions(sql.TxOptions{Isolation: sql.LevelReadCommitted})); err != nil {
		t.Errorf("READ COMMITTED on MySQL = %v", err)
	}
}

// TestEndedContextIsPlain: a write whose context has already ended sends
// nothing, and says so with a plain error (never an unknown outcome), in a
// transaction as well.
func TestEndedContextIsPlain(t *testing.T) {
	for _, d := range dialects {
		t.Run(d.String(), func(t *testing.T) {
			t.Parallel()
			db, tbl := newRows(t, d)
			db.Exec(t, `INSERT INTO rows_t (id) VALUES (1)`)
			tx, err := db.SQL.BeginTx(testkit.Context(t), nil)
			if err != nil {
				t.Fatal(err)
			}
			defer tx.Rollback() //nolint:errcheck
			ctx, cancel := context.WithCancel(context.Background())
			cancel()
			for _, target := range []dbguard.DBTX{db.SQL, tx} {
				err := tbl.Update(ctx, target, []any{1}, 5, dbguard.Col("value", "x"))
				if !errors.Is(err, context.Canceled) || errors.Is(err, fence.ErrOutcomeUnknown) {
					t.Errorf("Update with an ended context on %T = %v; want a plain context.Canceled", target, err)
				}
			}
		})
	}
}
