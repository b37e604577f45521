package drivertest

import (
	"context"
	"database/sql"
	"errors"
	"github.com/fencekit/fencekit/fence"
	"slices"
	"strings"
	"testing"

	"github.com/fencekit/fencekit/dbguard"
	"github.com/fencekit/fencekit/internal/testkit"
)

// tableRows reads every row of table as text, in order, for comparing a
// table before and after a write.
func tableRows(t *testing.T, db *sql.DB, table string) []string {
	t.Helper()
	rows, err := db.QueryContext(testkit.Context(t), `SELECT CAST(k AS CHAR), value, CAST(lock_version AS CHAR) FROM `+table+` ORDER BY 1`)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	var out []string
	for rows.Next() {
		var k, v, lv string
		if err := rows.Scan(&k, &v, &lv); err != nil {
			t.Fatal(err)
		}
		out = append(out, k+"|"+v+"|"+lv)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

// TestAmbiguousKeyChangesNothing: a key that the database matches against
// several rows, although a unique index holds the key column, must change
// none of them. MariaDB compares a number with a VARCHAR key as numbers
// (even in strict mode), so 1 matches '1', '01' and ' 1'. SQLite compares with the column's collation (NOCASE here) while the
// unique index is BINARY, so 'a' matches 'a' and 'A'. The success path's
// statement, which commits on its own, wrote every matching row before
// the guard counted them and said "nothing was written".
func TestAmbiguousKeyChangesNothing(t *testing.T) {
	type schema struct {
		name   string
		create []string
		key    any
	}
	cases := map[dbguard.Dialect][]schema{
		dbguard.MySQL: {
			{"number-against-varchar", []string{
				`CREATE TABLE amb (k VARCHAR(20) PRIMARY KEY, value TEXT NOT NULL, lock_version BIGINT UNSIGNED NOT NULL DEFAULT 0)`,
				`INSERT INTO amb (k, value) VALUES ('1', 'one'), ('01', 'zero-one'), (' 1', 'space-one'), ('2', 'two')`,
			}, 1},
		},
		dbguard.SQLite: {
			{"nocase-column-binary-index", []string{
				`CREATE TABLE amb (k TEXT NOT NULL COLLATE NOCASE, value TEXT NOT NULL, lock_version INTEGER NOT NULL DEFAULT 0)`,
				`CREATE UNIQUE INDEX amb_k ON amb (k COLLATE BINARY)`,
				`INSERT INTO amb (k, value) VALUES ('a', 'lower'), ('A', 'upper'), ('b', 'other')`,
			}, "a"},
		},
	}
	for _, d := range dialects {
		for _, sc := range cases[d] {
			t.Run(d.String()+"/"+sc.name, func(t *testing.T) {
				t.Parallel()
				db := Open(t, d)
				for _, q := range sc.create {
					db.Exec(t, q)
				}
				tbl, err := dbguard.NewTable(d, "", "amb", "k")
				if err != nil {
					t.Fatal(err)
				}
				ctx := testkit.Context(t)
				inTx := func(write func(ctx context.Context, db dbguard.DBTX) error) func(context.Context, dbguard.DBTX) error {
					return func(ctx context.Context, _ dbguard.DBTX) error {
						tx, err := db.SQL.BeginTx(ctx, nil)
						if err != nil {
							t.Fatal(err)
						}
						werr := write(ctx, tx)
						if err := tx.Commit(); err != nil {
							t.Fatal(err)
						}
						return werr
					}
				}
				update := func(ctx context.Context, p dbguard.DBTX) error {
					return tbl.Update(ctx, p, []any{sc.key}, 5, dbguard.Col("value", "written"))
				}
				writes := []struct {
					name string
					run  func(context.Context, dbguard.DBTX) error
				}{
					{"update", update},
					{"upsert", func(ctx context.Context, p dbguard.DBTX) error {
						return tbl.Upsert(ctx, p, []any{sc.key}, 5, dbguard.Col("value", "written"))
					}},
					{"delete", func(ctx context.Context, p dbguard.DBTX) error { return tbl.Delete(ctx, p, []any{sc.key}, 5) }},
					{"update in a transaction", inTx(update)},
				}
				before := tableRows(t, db.SQL, "amb")
				for _, w := range writes {
					err := w.run(ctx, db.SQL)
					if !errors.Is(err, fence.ErrAmbiguousKey) {
						t.Errorf("%s of key %v = %v; want ErrAmbiguousKey", w.name, sc.key, err)
					}
					if after := tableRows(t, db.SQL, "amb"); !slices.Equal(after, before) {
						t.Fatalf("%s of key %v (returned %v) changed the table:\nbefore %s\nafter  %s", w.name, sc.key, err,
							strings.Join(before, ", "), strings.Join(after, ", "))
					}
				}
			})
		}
	}
}
