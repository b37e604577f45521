package main

import (
	"context"
	"os"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/pressly/goose/v3"
)

// TestAddLockVersionOutParsesUnderGoose: the file that add-lock-version
// --out writes is parsed and run by goose itself, up and down, whatever
// the table is called: names that contain goose's annotation marker, a
// comment marker or a semicolon must not change how goose reads the file.
func TestAddLockVersionOutParsesUnderGoose(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	schema, db := newSchema(t)
	for i, name := range []string{
		"t +goose Down",
		"-- +goose StatementEnd",
		"x -- +goose NO TRANSACTION",
		"semi;",
		"a --b;",
		"+goose ENVSUB ON $HOME",
	} {
		ident := pgx.Identifier{schema, name}.Sanitize()
		if _, err := db.Exec(`CREATE TABLE ` + ident + ` (id int PRIMARY KEY); INSERT INTO ` + ident + ` VALUES (1), (2)`); err != nil {
			t.Fatal(err)
		}
		dir := t.TempDir()
		code, stdout, stderr := fencekit(t, "migrate", "add-lock-version", "--schema="+schema, "--table", ident, "--out", dir)
		if code != 0 || !strings.Contains(stdout, "wrote ") {
			t.Fatalf("%q: exit %d, stdout %q, stderr %q", name, code, stdout, stderr)
		}
		p, err := goose.NewProvider(goose.DialectPostgres, db, os.DirFS(dir),
			goose.WithDisableGlobalRegistry(true), goose.WithTableName(schema+".goose_"+string(rune('a'+i))))
		if err != nil {
			t.Fatalf("%q: %v", name, err)
		}
		lockVersion := func() (typ string, zeros int) {
			t.Helper()
			err := db.QueryRow(`SELECT coalesce((SELECT format_type(atttypid, atttypmod) FROM pg_attribute
				WHERE attrelid = $1::regclass AND attname = 'lock_version' AND NOT attisdropped), '')`, ident).Scan(&typ)
			if err != nil {
				t.Fatal(err)
			}
			if typ != "" {
				if err := db.QueryRow(`SELECT count(*) FROM ` + ident + ` WHERE lock_version = 0`).Scan(&zeros); err != nil {
					t.Fatal(err)
				}
			}
			return typ, zeros
		}
		if res, err := p.Up(ctx); err != nil || len(res) != 1 {
			t.Fatalf("%q: goose up: %v, %v", name, res, err)
		}
		if typ, zeros := lockVersion(); typ != "bigint" || zeros != 2 {
			t.Fatalf("%q: after up, lock_version %q with %d zeros", name, typ, zeros)
		}
		if _, err := p.DownTo(ctx, 0); err != nil {
			t.Fatalf("%q: goose down: %v", name, err)
		}
		if typ, _ := lockVersion(); typ != "" {
			t.Fatalf("%q: after down, lock_version is still %q", name, typ)
		}
	}
}
