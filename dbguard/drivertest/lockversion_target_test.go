package drivertest

import (
	"database/sql"
	"errors"
	"strconv"
	"testing"

	"github.com/go-sql-driver/mysql"

	"github.com/fencekit/fencekit/dbguard"
	"github.com/fencekit/fencekit/fence"
	"github.com/fencekit/fencekit/internal/testkit"
)

// rawRow reads value and lock_version of row id of table as the database
// prints them (a DOUBLE's lock_version is no uint64), or ok=false.
func rawRow(t *testing.T, db *sql.DB, table string, id int64) (value, lv string, ok bool) {
	t.Helper()
	err := db.QueryRowContext(testkit.Context(t), `SELECT value, CAST(lock_version AS CHAR) FROM `+table+` WHERE id = ?`, id).Scan(&value, &lv)
	if errors.Is(err, sql.ErrNoRows) {
		return "", "", false
	}
	if err != nil {
		t.Fatal(err)
	}
	return value, lv, true
}

// TestLockVersionTypeWhereTheStatementRuns: one Table checked its
// lock_version column at its first write, on one database; its writes then
// reach a table whose lock_version is of another type: on a second
// database, or the same table altered afterwards. The statement that
// reaches it must refuse it (ErrLockVersionType, nothing written), not
// compare tokens in that type: as a DOUBLE (or a FLOAT, or text compared
// as a number) 2^60-1 equals 2^60, so a stale token was accepted; an INT
// in a session without strict mode clips a token to 2^31-1, so a later,
// lower token passes.
func TestLockVersionTypeWhereTheStatementRuns(t *testing.T) {
	const high, low = fence.Token(1 << 60), fence.Token(1<<60 - 1)
	type target struct {
		name  string
		typ   string
		store fence.Token // the newest token the row holds
		write fence.Token // the token the writes present
		// edit changes the second database's pool (MySQL), nil for none.
		edit func(*mysql.Config)
		// alter: the same table as the first write's, altered after it.
		alter bool
	}
	cases := map[dbguard.Dialect][]target{
		dbguard.MySQL: {
			{name: "double", typ: "DOUBLE", store: high, write: low},
			{name: "float", typ: "FLOAT", store: high, write: low},
			{name: "varchar", typ: "VARCHAR(30)", store: high, write: low},
			{name: "decimal-scale", typ: "DECIMAL(30,2)", store: high, write: low},
			{name: "signed-bigint", typ: "BIGINT", store: high, write: low},
			{name: "int", typ: "INT", store: 7, write: high},
			{name: "int-unsigned", typ: "INT UNSIGNED", store: 7, write: high},
			{name: "int-not-strict", typ: "INT", store: 7, write: 3_000_000_000,
				edit: func(c *mysql.Config) { c.Params = map[string]string{"sql_mode": "''"} }},
			{name: "altered-to-double", typ: "DOUBLE", store: high, write: low, alter: true},
		},
		dbguard.SQLite: {
			{name: "real", typ: "REAL", store: high, write: low},
			{name: "text", typ: "TEXT", store: high, write: low},
			{name: "altered-to-real", typ: "REAL", store: high, write: low, alter: true},
		},
	}
	for _, d := range dialects {
		for _, tc := range cases[d] {
			t.Run(d.String()+"/"+tc.name, func(t *testing.T) {
				t.Parallel()
				first, tbl := newRows(t, d)
				ctx := testkit.Context(t)
				first.Exec(t, `INSERT INTO rows_t (id) VALUES (1)`)
				if err := tbl.Update(ctx, first.SQL, []any{1}, 1, dbguard.Col("value", "checked")); err != nil {
					t.Fatalf("the first write, on a table of the right type: %v", err)
				}
				second := Open(t, d)
				if tc.alter {
					second = first
					if d == dbguard.MySQL {
						second.Exec(t, `ALTER TABLE rows_t MODIFY lock_version `+tc.typ+` NOT NULL DEFAULT 0`)
					} else {
						// SQLite cannot change a column's type: build the
						// table again under its name.
						second.Exec(t, `ALTER TABLE rows_t RENAME TO old_rows`)
						second.Exec(t, `CREATE TABLE rows_t (id BIGINT PRIMARY KEY, value `+valueColumn(d)+`, lock_version `+tc.typ+` NOT NULL DEFAULT 0)`)
						second.Exec(t, `DROP TABLE old_rows`)
					}
					second.Exec(t, `DELETE FROM rows_t`)
				} else {
					second.Exec(t, `CREATE TABLE rows_t (id BIGINT PRIMARY KEY, value `+valueColumn(d)+`, lock_version `+tc.typ+` NOT NULL DEFAULT 0)`)
				}
				// The newest token, written by a holder before (and its
				// value), as the database stores it.
				second.Exec(t, `INSERT INTO rows_t (id, value, lock_version) VALUES (1, 'newest', ?)`, tokenArg(d, tc.store))
				pool := second.OpenWith(t, tc.edit, nil)
				beforeV, beforeLV, _ := rawRow(t, second.SQL, "rows_t", 1)
				writes := map[string]func() error{
					"update": func() error {
						return tbl.Update(ctx, pool, []any{1}, tc.write, dbguard.Col("value", "stale"))
					},
					"upsert": func() error {
						return tbl.Upsert(ctx, pool, []any{1}, tc.write, dbguard.Col("value", "stale"))
					},
					"update in a transaction": func() error {
						tx, err := pool.BeginTx(ctx, nil)
						if err != nil {
							t.Fatal(err)
						}
						werr := tbl.Update(ctx, tx, []any{1}, tc.write, dbguard.Col("value", "stale"))
						if err := tx.Commit(); err != nil {
							t.Fatal(err)
						}
						return werr
					},
					"delete": func() error { return tbl.Delete(ctx, pool, []any{1}, tc.write) },
				}
				names := []string{"update", "upsert", "update in a transaction"}
				if tc.write < tc.store {
					// A Delete stores no token: over an INT, which
					// compares exactly, a newer token deletes the row.
					names = append(names, "delete")
				}
				for _, name := range names {
					err := writes[name]()
					if !errors.Is(err, fence.ErrLockVersionType) {
						t.Errorf("%s with token %d over lock_version %s holding %s = %v; want ErrLockVersionType", name, tc.write, tc.typ, beforeLV, err)
					}
					v, lv, ok := rawRow(t, second.SQL, "rows_t", 1)
					if !ok || v != beforeV || lv != beforeLV {
						t.Fatalf("%s: the row went from %q/%s to %q/%s (present: %v); want it unchanged", name, beforeV, beforeLV, v, lv, ok)
					}
				}
			})
		}
	}
}

// tokenArg is a token as a bind parameter of dialect d.
func tokenArg(d dbguard.Dialect, tok fence.Token) any {
	if d == dbguard.SQLite {
		return int64(tok)
	}
	return strconv.FormatUint(uint64(tok), 10)
}
