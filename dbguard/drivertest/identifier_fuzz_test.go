package drivertest

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/fencekit/fencekit/dbguard"
	"github.com/fencekit/fencekit/fence"
)

// FuzzIdentifiers: whatever the names of the table, key column and value
// column, the guard either refuses them before any I/O (ErrInvalid) or
// writes through them exactly, on both engines; a name is never executed
// as SQL. The seeds run with every go test; go test -fuzz explores more
// (scripts/fuzz.sh).
func FuzzIdentifiers(f *testing.F) {
	for _, s := range [][3]string{
		{"t", "id", "v"},
		{"t`x", "k\"y", "v'z"},
		{"x\"; DROP TABLE y; --", "`; DROP TABLE y; --", "a b"},
		{"é✓", "ключ", "值"},
		{"t\\", "k\\`", "v\\\""},
		{"UPPER", "Key", "Select"},
	} {
		f.Add(s[0], s[1], s[2])
	}
	dbs := map[dbguard.Dialect]*DB{}
	for _, d := range dialects {
		dbs[d] = Open(f, d)
		dbs[d].Exec(f, `CREATE TABLE y (id INT)`)
	}
	f.Fuzz(func(t *testing.T, table, key, col string) {
		for _, d := range dialects {
			db := dbs[d]
			tbl, err := dbguard.NewTable(d, "", table, key)
			if err != nil {
				if !errors.Is(err, fence.ErrInvalidArgument) {
					t.Fatalf("NewTable(%q, %q) = %v; want ErrInvalid or nil", table, key, err)
				}
				continue
			}
			if key == col || col == dbguard.LockVersionColumn || key == dbguard.LockVersionColumn || strings.EqualFold(key, col) ||
				strings.EqualFold(col, dbguard.LockVersionColumn) || strings.EqualFold(table, "y") {
				continue
			}
			if d == dbguard.MySQL && (!utf8.ValidString(col) || strings.HasSuffix(col, " ") || utf8.RuneCountInString(col) > 64) {
				continue
			}
			q := func(s string) string {
				if d == dbguard.MySQL {
					return "`" + strings.ReplaceAll(s, "`", "``") + "`"
				}
				return `"` + strings.ReplaceAll(s, `"`, `""`) + `"`
			}
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			ddl := `CREATE TABLE ` + q(table) + ` (` + q(key) + ` VARCHAR(50) PRIMARY KEY, ` + q(col) + ` ` + valueColumn(d) + `, ` + lockVersionColumn(d) + `)`
			if _, err := db.SQL.ExecContext(ctx, ddl); err != nil {
				continue // a name this server does not take (MySQL: outside the BMP, reserved, ...)
			}
			func() {
				defer db.SQL.ExecContext(ctx, `DROP TABLE `+q(table)) //nolint:errcheck
				err := tbl.Insert(ctx, db.SQL, []any{"k'1"}, 7, dbguard.Col(col, "v'; --"))
				if errors.Is(err, fence.ErrInvalidArgument) && (!utf8.ValidString(col) || strings.IndexByte(col, 0) >= 0 || col == "") {
					return // refused before any I/O: a name the guard does not take
				}
				if err != nil {
					t.Fatalf("%v: Insert through %q.%q/%q = %v", d, table, key, col, err)
				}
				if err := tbl.Update(ctx, db.SQL, []any{"k'1"}, 6, dbguard.Col(col, "stale")); !errors.Is(err, fence.ErrStaleToken) {
					t.Fatalf("%v: stale Update through %q.%q/%q = %v", d, table, key, col, err)
				}
				var v string
				if err := db.SQL.QueryRowContext(ctx, `SELECT `+q(col)+` FROM `+q(table)).Scan(&v); err != nil || v != "v'; --" {
					t.Fatalf("%v: value %q, %v", d, v, err)
				}
			}()
			if _, err := db.SQL.ExecContext(ctx, `SELECT COUNT(*) FROM y`); err != nil {
				t.Fatalf("%v: table y is gone after names %q, %q, %q: %v", d, table, key, col, err)
			}
		}
	})
}
