package migrations_test

import (
	"context"
	"database/sql"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/pressly/goose/v3"

	"github.com/fencekit/fencekit/migrations"
)

func TestParseTableName(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		in      string
		want    migrations.TableName
		wantErr bool
	}{
		{"orders", migrations.TableName{Name: "orders"}, false},
		{"Shop.Orders", migrations.TableName{Schema: "shop", Name: "orders"}, false},
		{`"Shop"."Orders"`, migrations.TableName{Schema: "Shop", Name: "Orders"}, false},
		{`"my.schema"."a""b"`, migrations.TableName{Schema: "my.schema", Name: `a"b`}, false},
		{`public."we'ird; DROP TABLE x"`, migrations.TableName{Schema: "public", Name: `we'ird; DROP TABLE x`}, false},
		{"", migrations.TableName{}, true},
		{".orders", migrations.TableName{}, true},
		{"shop.", migrations.TableName{}, true},
		{"a.b.c", migrations.TableName{}, true},
		{`"unterminated`, migrations.TableName{}, true},
		{`""`, migrations.TableName{}, true},
		{`"a"b`, migrations.TableName{}, true},
		{`a"b`, migrations.TableName{}, true},
		{"a\x00b", migrations.TableName{}, true},
		{"line\nbreak", migrations.TableName{}, true},
		{strings.Repeat("x", 64), migrations.TableName{}, true},
	} {
		got, err := migrations.ParseTableName(tc.in)
		if tc.wantErr {
			if !errors.Is(err, migrations.ErrInvalid) {
				t.Errorf("ParseTableName(%q) = %+v, %v; want ErrInvalid", tc.in, got, err)
			}
			continue
		}
		if err != nil || got != tc.want {
			t.Errorf("ParseTableName(%q) = %+v, %v; want %+v", tc.in, got, err, tc.want)
		}
	}
}

func TestLockVersionMigrationText(t *testing.T) {
	t.Parallel()
	text, err := migrations.LockVersionMigration(migrations.TableName{Schema: "shop", Name: "orders"})
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		"-- +goose Up", "-- +goose StatementBegin", "-- +goose StatementEnd", "-- +goose Down",
		`ALTER TABLE "shop"."orders" ADD COLUMN IF NOT EXISTS lock_version bigint NOT NULL DEFAULT 0`,
		"CHECK (lock_version >= 0)",
		`ALTER TABLE "shop"."orders" DROP CONSTRAINT IF EXISTS fencekit_lock_version_nonnegative`,
		`ALTER TABLE "shop"."orders" DROP COLUMN IF EXISTS lock_version`,
	} {
		if !strings.Contains(text, want) {
			t.Errorf("migration lacks %q:\n%s", want, text)
		}
	}
	if _, err := migrations.LockVersionMigration(migrations.TableName{}); !errors.Is(err, migrations.ErrInvalid) {
		t.Errorf("empty name: %v", err)
	}
}

// lockVersionState reads the column's type, nullability and default, the
// constraint's presence and the number of rows whose lock_version is not 0.
func lockVersionState(t testing.TB, db *sql.DB, table string) (colType string, notNull bool, def string, check bool) {
	t.Helper()
	ctx := context.Background()
	err := db.QueryRowContext(ctx, `
		SELECT format_type(a.atttypid, a.atttypmod), a.attnotnull, coalesce(pg_get_expr(d.adbin, d.adrelid), '')
		FROM pg_attribute a LEFT JOIN pg_attrdef d ON d.adrelid = a.attrelid AND d.adnum = a.attnum
		WHERE a.attrelid = $1::regclass AND a.attname = 'lock_version' AND NOT a.attisdropped`, table).
		Scan(&colType, &notNull, &def)
	if errors.Is(err, sql.ErrNoRows) {
		return "", false, "", false
	}
	if err != nil {
		t.Fatal(err)
	}
	check = queryBool(t, db, `SELECT EXISTS (SELECT 1 FROM pg_constraint WHERE conrelid = $1::regclass AND conname = $2)`,
		table, migrations.LockVersionConstraint)
	return colType, notNull, def, check
}

func TestApplyLockVersion(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	schema, db := newSchema(t)
	exec := func(q string) {
		t.Helper()
		if _, err := db.ExecContext(ctx, q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	exec(`CREATE TABLE orders (id int PRIMARY KEY, note text)`)
	exec(`INSERT INTO orders SELECT g, 'n' || g FROM generate_series(1, 50) g`)
	tbl := migrations.TableName{Schema: schema, Name: "orders"}

	for i := range 2 { // applying twice is harmless
		if err := migrations.ApplyLockVersion(ctx, db, tbl); err != nil {
			t.Fatalf("apply #%d: %v", i+1, err)
		}
		typ, notNull, def, check := lockVersionState(t, db, tbl.String())
		if typ != "bigint" || !notNull || def != "0" || !check {
			t.Fatalf("apply #%d: lock_version %s notnull=%v default=%q check=%v", i+1, typ, notNull, def, check)
		}
		var n, zero int
		if err := db.QueryRowContext(ctx, `SELECT count(*), count(*) FILTER (WHERE lock_version = 0) FROM orders`).Scan(&n, &zero); err != nil {
			t.Fatal(err)
		}
		if n != 50 || zero != 50 {
			t.Fatalf("apply #%d: %d rows, %d with lock_version 0", i+1, n, zero)
		}
	}
	_, err := db.ExecContext(ctx, `UPDATE orders SET lock_version = -1 WHERE id = 1`)
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) || pgErr.Code != "23514" {
		t.Fatalf("negative lock_version: %v, want check violation", err)
	}

	// Unqualified names are found through the search_path.
	exec(`CREATE TABLE items (id int)`)
	if err := migrations.ApplyLockVersion(ctx, db, migrations.TableName{Name: "items"}); err != nil {
		t.Fatal(err)
	}

	if err := migrations.RemoveLockVersion(ctx, db, tbl); err != nil {
		t.Fatal(err)
	}
	if typ, _, _, _ := lockVersionState(t, db, tbl.String()); typ != "" {
		t.Fatalf("lock_version still there after remove: %s", typ)
	}
	if err := migrations.RemoveLockVersion(ctx, db, tbl); err != nil {
		t.Fatalf("remove twice: %v", err)
	}

	// A lock_version column of the wrong type is an error, not skipped.
	for _, typ := range []string{"int", "real", "numeric", "text"} {
		exec(`CREATE TABLE "wrong ` + typ + `" (id int, lock_version ` + typ + ` NOT NULL)`)
		err = migrations.ApplyLockVersion(ctx, db, migrations.TableName{Schema: schema, Name: "wrong " + typ})
		if err == nil || !strings.Contains(err.Error(), "want bigint") {
			t.Fatalf("wrong type %s: %v", typ, err)
		}
	}
	// A nullable bigint one is made NOT NULL, unless it holds NULLs.
	exec(`CREATE TABLE nullable (id int, lock_version bigint)`)
	exec(`INSERT INTO nullable VALUES (1, 0)`)
	if err := migrations.ApplyLockVersion(ctx, db, migrations.TableName{Schema: schema, Name: "nullable"}); err != nil {
		t.Fatal(err)
	}
	if _, notNull, _, check := lockVersionState(t, db, pgx.Identifier{schema, "nullable"}.Sanitize()); !notNull || !check {
		t.Fatalf("nullable: not null %v, check %v", notNull, check)
	}
	exec(`CREATE TABLE nulls (id int, lock_version bigint)`)
	exec(`INSERT INTO nulls VALUES (1, NULL)`)
	if err := migrations.ApplyLockVersion(ctx, db, migrations.TableName{Schema: schema, Name: "nulls"}); err == nil {
		t.Fatal("a lock_version holding NULLs was adopted")
	}

	for _, missing := range []migrations.TableName{{Schema: schema, Name: "nope"}, {Schema: "no_such_schema_fk", Name: "orders"}, {Name: "nope"}} {
		if err := migrations.ApplyLockVersion(ctx, db, missing); !errors.Is(err, migrations.ErrTableNotFound) {
			t.Errorf("missing %s: %v, want ErrTableNotFound", missing, err)
		}
		if err := migrations.RemoveLockVersion(ctx, db, missing); !errors.Is(err, migrations.ErrTableNotFound) {
			t.Errorf("remove missing %s: %v, want ErrTableNotFound", missing, err)
		}
	}
	if err := migrations.ApplyLockVersion(ctx, nil, tbl); !errors.Is(err, migrations.ErrInvalid) {
		t.Errorf("nil db: %v", err)
	}
	if err := migrations.ApplyLockVersion(ctx, db, migrations.TableName{Name: "a\x00"}); !errors.Is(err, migrations.ErrInvalid) {
		t.Errorf("NUL: %v", err)
	}
}

// TestGeneratedMigrationRunsUnderGoose writes the lock_version migration
// for tables (one with a hostile name) and runs it with goose: up, up again,
// down, up.
func TestGeneratedMigrationRunsUnderGoose(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	schema, db := newSchema(t)
	hostile := `we"ird'; DROP TABLE canary; -- \ $fencekit$`
	for _, q := range []string{
		`CREATE TABLE canary (id int)`,
		`CREATE TABLE orders (id int PRIMARY KEY)`,
		`INSERT INTO orders SELECT generate_series(1, 10)`,
		`CREATE TABLE "we""ird'; DROP TABLE canary; -- \ $fencekit$" (id int)`,
		`INSERT INTO "we""ird'; DROP TABLE canary; -- \ $fencekit$" VALUES (1), (2)`,
	} {
		if _, err := db.ExecContext(ctx, q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	dir := t.TempDir()
	v := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	tables := []migrations.TableName{{Schema: schema, Name: "orders"}, {Schema: schema, Name: hostile}}
	for i, tbl := range tables {
		path, err := migrations.WriteLockVersionMigration(dir, tbl, v.Add(time.Duration(i)*time.Second))
		if err != nil {
			t.Fatal(err)
		}
		if base := filepath.Base(path); i == 0 && (!strings.HasPrefix(base, "20260102030405_fencekit_lock_version_fkm_") || !strings.HasSuffix(base, ".sql")) {
			t.Fatalf("file name %s", filepath.Base(path))
		}
	}
	if _, err := migrations.WriteLockVersionMigration(dir, tables[0], v); err == nil {
		t.Fatal("a second migration with the same version was written")
	}

	p, err := goose.NewProvider(goose.DialectPostgres, db, os.DirFS(dir),
		goose.WithDisableGlobalRegistry(true), goose.WithTableName("app_goose_version"))
	if err != nil {
		t.Fatal(err)
	}
	check := func(step string, want bool) {
		t.Helper()
		for _, tbl := range tables {
			typ, notNull, def, chk := lockVersionState(t, db, tbl.String())
			has := typ == "bigint" && notNull && def == "0" && chk
			if has != want || (!want && typ != "") {
				t.Fatalf("%s: %s lock_version %q notnull=%v default=%q check=%v, want present=%v", step, tbl, typ, notNull, def, chk, want)
			}
		}
	}
	if res, err := p.Up(ctx); err != nil || len(res) != 2 {
		t.Fatalf("up: %v, %v", res, err)
	}
	check("up", true)
	if n := queryInt(t, db, `SELECT count(*) FROM orders WHERE lock_version = 0`); n != 10 {
		t.Fatalf("%d orders with lock_version 0, want 10", n)
	}
	// The Up section again, directly, is harmless (idempotent).
	for _, tbl := range tables {
		if err := migrations.ApplyLockVersion(ctx, db, tbl); err != nil {
			t.Fatal(err)
		}
	}
	check("apply again", true)
	if _, err := p.DownTo(ctx, 0); err != nil {
		t.Fatal(err)
	}
	check("down", false)
	if _, err := p.Up(ctx); err != nil {
		t.Fatal(err)
	}
	check("up again", true)
	if n := queryInt(t, db, `SELECT count(*) FROM canary`); n != 0 {
		t.Fatalf("canary: %d", n) // still exists (the query would fail otherwise)
	}
}

func queryInt(t testing.TB, db *sql.DB, q string) int {
	t.Helper()
	var n int
	if err := db.QueryRowContext(context.Background(), q).Scan(&n); err != nil {
		t.Fatalf("%s: %v", q, err)
	}
	return n
}

// TestWriteLockVersionMigrationOncePerTable: a second migration for the
// same table is refused (goose would run both); another table's is not.
func TestWriteLockVersionMigrationOncePerTable(t *testing.T) {
	dir := t.TempDir()
	orders := migrations.TableName{Schema: "shop", Name: "orders"}
	first, err := migrations.WriteLockVersionMigration(dir, orders, time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC))
	if err != nil {
		t.Fatal(err)
	}
	_, err = migrations.WriteLockVersionMigration(dir, orders, time.Date(2026, 1, 2, 3, 4, 6, 0, time.UTC))
	if !errors.Is(err, migrations.ErrMigrationExists) || !strings.Contains(err.Error(), first) {
		t.Fatalf("second migration for %s: %v; want ErrMigrationExists naming %s", orders, err, first)
	}
	// shop_orders and "shop_orders" share a file name, not a table.
	other := migrations.TableName{Name: "shop_orders"}
	if _, err := migrations.WriteLockVersionMigration(dir, other, time.Date(2026, 1, 2, 3, 4, 7, 0, time.UTC)); err != nil {
		t.Fatalf("migration for %s: %v", other, err)
	}
}
