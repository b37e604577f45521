package sqlguard_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"

	"github.com/fencekit/fencekit/fence"
	"github.com/fencekit/fencekit/sqlguard"
)

// FuzzTableNamesAndKeys writes rows of a real table whose table and column
// names, key value and column value are fuzzed. NewTable refuses a name
// with ErrInvalid before any I/O, or every write lands on exactly the
// named table, column and row: the value reads back as written, an older
// token is rejected with the stored one, and no name or value can reach
// another object (a canary table must survive every input). A key or
// value PostgreSQL cannot store as text (a NUL byte, invalid UTF-8) is
// refused by the server and writes nothing.
func FuzzTableNamesAndKeys(f *testing.F) {
	for _, s := range [][5]string{
		{"orders", "id", "v", "k1", "hello"},
		{`we"ird'; DROP TABLE canary; --`, `i"d`, "v;", "'; DROP TABLE canary; --", "$1"},
		{"Orders", "ID", "Value", "ü", "ñ"},
		{"fencekit_cur", "id", "v", "k", "v"},
		{"t", "lock_version", "v", "k", "v"},
		{"t", "id", "lock_version", "k", "v"},
		{"t", "id", "id", "k", "v"},
		{"t", "id", "v", "a\x00b", "v"},
		{"t", "id", "v", "k", "\xff"},
		{strings.Repeat("t", 63), strings.Repeat("c", 63), "v", strings.Repeat("k", 300), ""},
		{strings.Repeat("t", 64), "id", "v", "k", "v"},
		{"", "id", "v", "k", "v"},
		{"t", "a\tb", "v", "k", "v"},
		{"$fencekit$", "$1", "?", "%s", "%v"},
	} {
		f.Add(s[0], s[1], s[2], s[3], s[4])
	}
	e := newEnv(f)
	e.exec(f, "CREATE TABLE canary (id int)")
	f.Fuzz(func(t *testing.T, table, keyCol, valCol, key, value string) {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		tbl, err := sqlguard.NewTable("", table, keyCol)
		if err != nil {
			if !errors.Is(err, fence.ErrInvalidArgument) {
				t.Fatalf("NewTable(%q, %q): %v; want ErrInvalid", table, keyCol, err)
			}
			return
		}
		if table == "canary" || strings.HasPrefix(table, "fencekit_") {
			return // the test's own tables
		}
		ident := pgx.Identifier{table}.Sanitize()
		kc, vc := pgx.Identifier{keyCol}.Sanitize(), pgx.Identifier{valCol}.Sanitize()
		colsOK := valCol != keyCol && valCol != sqlguard.LockVersionColumn && len(valCol) <= 63 && valCol != "" &&
			utf8.ValidString(valCol) && !strings.ContainsFunc(valCol, func(r rune) bool { return r < 0x20 || r == 0x7f })
		create := "CREATE TABLE " + ident + " (" + kc + " text PRIMARY KEY, lock_version bigint NOT NULL DEFAULT 0)"
		if colsOK {
			create = "CREATE TABLE " + ident + " (" + kc + " text PRIMARY KEY, " + vc + " text, lock_version bigint NOT NULL DEFAULT 0)"
		}
		if _, err := e.Pool.Exec(ctx, create); err != nil {
			t.Fatalf("%s: %v", create, err)
		}
		defer func() {
			if _, err := e.Pool.Exec(context.Background(), "DROP TABLE "+ident); err != nil {
				t.Errorf("drop: %v", err)
			}
			var n int
			if err := e.Pool.QueryRow(context.Background(), "SELECT count(*) FROM canary").Scan(&n); err != nil {
				t.Fatalf("the canary table is gone after table %q, columns %q, %q, key %q, value %q: %v", table, keyCol, valCol, key, value, err)
			}
		}()

		err = tbl.Insert(ctx, e.Pool, []any{key}, 5, sqlguard.Col(valCol, value))
		if !colsOK {
			if !errors.Is(err, fence.ErrInvalidArgument) {
				t.Fatalf("Insert with column %q (key column %q): %v; want ErrInvalid", valCol, keyCol, err)
			}
			return
		}
		storable := func(s string) bool { return utf8.ValidString(s) && !strings.ContainsRune(s, 0) }
		read := func() (string, int64, bool) {
			var v string
			var lv int64
			err := e.Pool.QueryRow(ctx, "SELECT "+vc+", lock_version FROM "+ident+" WHERE "+kc+" = $1", key).Scan(&v, &lv)
			if errors.Is(err, pgx.ErrNoRows) {
				return "", 0, false
			}
			if err != nil {
				t.Fatalf("read back: %v", err)
			}
			return v, lv, true
		}
		if !storable(key) || !storable(value) {
			if err == nil {
				t.Fatalf("Insert of key %q, value %q succeeded; PostgreSQL cannot store them as text", key, value)
			}
			var n int
			if err := e.Pool.QueryRow(ctx, "SELECT count(*) FROM "+ident).Scan(&n); err != nil || n != 0 {
				t.Fatalf("after a refused insert the table has %d rows (%v)", n, err)
			}
			return
		}
		if err != nil {
			t.Fatalf("Insert(%q: %q, %q: %q): %v", keyCol, key, valCol, value, err)
		}
		if v, lv, ok := read(); !ok || v != value || lv != 5 {
			t.Fatalf("read back %q lock_version %d (found %v); want %q, 5", v, lv, ok, value)
		}
		if err := tbl.Update(ctx, e.Pool, []any{key}, 4, sqlguard.Col(valCol, "stale")); !errors.Is(err, fence.ErrStaleToken) {
			t.Fatalf("Update with an older token: %v; want stale", err)
		} else if se, _ := fence.AsStale(err); se.Current != 5 {
			t.Fatalf("stale error names current %d; want 5", se.Current)
		}
		if err := tbl.Upsert(ctx, e.Pool, []any{key}, 6, sqlguard.Col(valCol, value+"!")); err != nil {
			t.Fatalf("Upsert: %v", err)
		}
		if v, lv, _ := read(); v != value+"!" || lv != 6 {
			t.Fatalf("after Upsert: %q lock_version %d", v, lv)
		}
		if err := tbl.Delete(ctx, e.Pool, []any{key}, 6); err != nil {
			t.Fatalf("Delete: %v", err)
		}
		if _, _, ok := read(); ok {
			t.Fatal("the row survived its Delete")
		}
	})
}
