package migrations_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/pressly/goose/v3"

	"github.com/fencekit/fencekit/migrations"
)

// FuzzParseTableName: ParseTableName never panics; it refuses with
// ErrInvalid, or returns a valid name that parses back to itself from its
// quoted form (String), the form the generated migrations use.
func FuzzParseTableName(f *testing.F) {
	for _, s := range []string{"orders", "shop.orders", `"My Schema"."Orders"`, `"we""ird"`, `a.b.c`, `"unterminated`, `.`, `a.`, `.a`,
		`"a"b`, `""`, `"a"."b"`, `ORDERS`, `"x.y"`, "a\x00", `"` + strings.Repeat("x", 64) + `"`, `Ünïcode`, `a . b`} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		tn, err := migrations.ParseTableName(s)
		if err != nil {
			if !errors.Is(err, migrations.ErrInvalid) {
				t.Fatalf("ParseTableName(%q): %v; want ErrInvalid", s, err)
			}
			return
		}
		if err := tn.Validate(); err != nil {
			t.Fatalf("ParseTableName(%q) = %+v, which is invalid: %v", s, tn, err)
		}
		back, err := migrations.ParseTableName(tn.String())
		if err != nil || back != tn {
			t.Fatalf("ParseTableName(%q) = %+v; its quoted form %s parses as %+v (%v)", s, tn, tn.String(), back, err)
		}
	})
}

// FuzzLockVersionMigrationUnderGoose generates the lock_version migration
// for a table with a fuzzed name, writes it as a file, and runs it with
// goose against a real table of that name: goose must read the file as
// written (Up adds a bigint NOT NULL lock_version with its check, Down
// removes it), whatever the name holds; a name that is not valid gets
// ErrInvalid and no file. A canary table must survive every input.
func FuzzLockVersionMigrationUnderGoose(f *testing.F) {
	for _, s := range [][2]string{
		{"", "orders"}, {"", `we"ird'; DROP TABLE canary; -- \ $fencekit$`}, {"", "-- +goose Down"}, {"", "x; -- +goose StatementEnd"},
		{"", "$fencekit1$"}, {"", "a;"}, {"", "Orders"}, {"", strings.Repeat("t", 63)}, {"", strings.Repeat("t", 64)},
		{"", "new\nline"}, {"", ""}, {"s\x00", "t"}, {"other", "t"}, {"", "ünï ; --"},
	} {
		f.Add(s[0], s[1])
	}
	schema, db := newSchema(f)
	ctx := context.Background()
	if _, err := db.ExecContext(ctx, "CREATE TABLE canary (id int)"); err != nil {
		f.Fatal(err)
	}
	v := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	f.Fuzz(func(t *testing.T, otherSchema, name string) {
		// A fuzzed schema only for the text; the table lives in the test's.
		text, err := migrations.LockVersionMigration(migrations.TableName{Schema: otherSchema, Name: name})
		if verr := (migrations.TableName{Schema: otherSchema, Name: name}).Validate(); (err == nil) != (verr == nil) || err != nil && !errors.Is(err, migrations.ErrInvalid) {
			t.Fatalf("LockVersionMigration: %v; Validate: %v", err, verr)
		}
		if err == nil && strings.Count(text, "-- +goose StatementBegin") != 3 {
			t.Fatalf("the migration has %d statements for goose, want 3:\n%s", strings.Count(text, "-- +goose StatementBegin"), text)
		}
		tn := migrations.TableName{Schema: schema, Name: name}
		dir := t.TempDir()
		path, err := migrations.WriteLockVersionMigration(dir, tn, v)
		if tn.Validate() != nil {
			if !errors.Is(err, migrations.ErrInvalid) || path != "" {
				t.Fatalf("WriteLockVersionMigration(%q): %q, %v; want ErrInvalid and no file", name, path, err)
			}
			return
		}
		if err != nil {
			t.Fatal(err)
		}
		if name == "canary" || name == "fk_fuzz_goose" {
			return
		}
		if _, err := db.ExecContext(ctx, "CREATE TABLE "+tn.String()+" (id int)"); err != nil {
			t.Fatalf("create %s: %v", tn, err)
		}
		defer func() {
			if _, err := db.ExecContext(ctx, "DROP TABLE "+tn.String()); err != nil {
				t.Errorf("drop %s: %v", tn, err)
			}
			if queryInt(t, db, `SELECT count(*) FROM canary`) != 0 {
				t.Fatal("canary changed")
			}
		}()
		p, err := goose.NewProvider(goose.DialectPostgres, db, os.DirFS(filepath.Dir(path)),
			goose.WithDisableGlobalRegistry(true), goose.WithTableName("fk_fuzz_goose"))
		if err != nil {
			t.Fatal(err)
		}
		if res, err := p.Up(ctx); err != nil || len(res) != 1 {
			t.Fatalf("goose up of the migration for %q: %v, %v\n%s", name, res, err, text)
		}
		typ, notNull, def, chk := lockVersionState(t, db, tn.String())
		if typ != "bigint" || !notNull || def != "0" || !chk {
			t.Fatalf("after up, %s.lock_version: %q notnull=%v default=%q check=%v", tn, typ, notNull, def, chk)
		}
		if _, err := p.DownTo(ctx, 0); err != nil {
			t.Fatalf("goose down: %v", err)
		}
		if typ, _, _, chk := lockVersionState(t, db, tn.String()); typ != "" || chk {
			t.Fatalf("after down, %s still has lock_version %q (check %v)", tn, typ, chk)
		}
		if _, err := db.ExecContext(ctx, "DROP TABLE fk_fuzz_goose"); err != nil {
			t.Fatal(err)
		}
	})
}
