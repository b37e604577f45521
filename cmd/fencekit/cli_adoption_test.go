package main

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/pressly/goose/v3"

	"github.com/fencekit/fencekit/migrations"
)

// version and --version say which fencekit this is and the newest
// migration it applies (read from the embedded files, not hard-coded).
func TestVersion(t *testing.T) {
	t.Parallel()
	names, err := filepath.Glob("../../migrations/sql/*.sql")
	if err != nil || len(names) == 0 {
		t.Fatalf("migration files: %v, %v", names, err)
	}
	newest := filepath.Base(names[len(names)-1])
	newest = strings.TrimLeft(newest[:strings.IndexByte(newest, '_')], "0")
	for _, arg := range []string{"version", "--version", "-version"} {
		code, stdout, stderr := fencekit(t, arg)
		if code != 0 || stderr != "" || !regexp.MustCompile(`^fencekit \S+.* \(go1\.[0-9.]+\); fencekit migrations up to version `+newest+"\n$").MatchString(stdout) {
			t.Fatalf("fencekit %s: exit %d, stdout %q, stderr %q", arg, code, stdout, stderr)
		}
	}
}

// Several --table in one add-lock-version: each table is checked before
// anything is written, and each gets its own migration file with a version
// of its own, even when all are written in the same second.
func TestAddLockVersionSeveralTables(t *testing.T) {
	t.Parallel()
	schema, db := newSchema(t)
	s := "--schema=" + schema
	for _, name := range []string{"a", "b", "c"} {
		if _, err := db.Exec(`CREATE TABLE ` + schema + `.` + name + ` (id int PRIMARY KEY)`); err != nil {
			t.Fatal(err)
		}
	}
	if code, _, stderr := fencekit(t, "migrate", "up", s); code != 0 {
		t.Fatalf("up: %s", stderr)
	}
	dir := t.TempDir()
	// One missing table: nothing is written for the others either.
	code, _, stderr := fencekit(t, "migrate", "add-lock-version", s, "--table", "a", "--table", "nope", "--table", "b", "--out", dir)
	if code != 1 || !strings.Contains(stderr, "table not found") {
		t.Fatalf("with a missing table: exit %d, %q", code, stderr)
	}
	if files, _ := filepath.Glob(filepath.Join(dir, "*")); len(files) != 0 {
		t.Fatalf("files written although a table was missing: %v", files)
	}
	code, stdout, stderr := fencekit(t, "migrate", "add-lock-version", s, "--table", "a", "--table", "b", "--table", "c", "--out", dir)
	if code != 0 {
		t.Fatalf("exit %d: %s", code, stderr)
	}
	files, _ := filepath.Glob(filepath.Join(dir, "*.sql"))
	if len(files) != 3 || strings.Count(stdout, "wrote ") != 3 {
		t.Fatalf("files %v, output %q", files, stdout)
	}
	versions := map[string]bool{}
	for _, f := range files {
		versions[filepath.Base(f)[:14]] = true
	}
	if len(versions) != 3 {
		t.Fatalf("versions of %v collide", files)
	}
	// goose takes the directory as it is.
	if _, err := goose.NewProvider(goose.DialectPostgres, db, os.DirFS(dir)); err != nil {
		t.Fatal(err)
	}
	code, stdout, stderr = fencekit(t, "migrate", "add-lock-version", s, "--table", "a", "--table", "b", "--apply")
	if code != 0 || strings.Count(stdout, "added lock_version to") != 2 {
		t.Fatalf("--apply of two tables: exit %d, stdout %q, stderr %q", code, stdout, stderr)
	}
}

// A version already used in the directory (by a file generated in the same
// second, or any other migration) moves the new file to the next free
// second; nothing is overwritten.
func TestMigrationVersionsNeverCollide(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	at := time.Date(2026, 12, 2, 3, 4, 5, 0, time.UTC)
	if err := os.WriteFile(filepath.Join(dir, "20261202030405_theirs.sql"), []byte("-- +goose Up\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, name := range []string{"one", "two"} {
		p, err := migrations.WriteMigrationFile(dir, name, "-- +goose Up\n", at)
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, filepath.Base(p))
	}
	want := []string{"20261202030406_one.sql", "20261202030407_two.sql"}
	if strings.Join(got, " ") != strings.Join(want, " ") {
		t.Fatalf("wrote %v, want %v", got, want)
	}
	if b, _ := os.ReadFile(filepath.Join(dir, "20261202030405_theirs.sql")); string(b) != "-- +goose Up\n" {
		t.Fatal("an existing file changed")
	}
}

// A table that is not found is reported with where it was looked for.
func TestTableNotFoundNamesTheSchemaSearched(t *testing.T) {
	t.Parallel()
	schema, _ := newSchema(t)
	code, _, stderr := fencekit(t, "migrate", "add-lock-version", "--schema="+schema, "--table", "nope")
	if code != 1 || !strings.Contains(stderr, "table not found") || !strings.Contains(stderr, "search_path: "+schema) {
		t.Fatalf("unqualified: exit %d, %q; want the search_path named", code, stderr)
	}
	code, _, stderr = fencekit(t, "migrate", "add-lock-version", "--table", schema+".nope", "--apply")
	if code != 1 || !strings.Contains(stderr, `looked in schema "`+schema+`"`) {
		t.Fatalf("qualified, --apply: exit %d, %q; want the schema named", code, stderr)
	}
}
