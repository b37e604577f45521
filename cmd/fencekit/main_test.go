package main

import (
	"bytes"
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"errors"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	_ "github.com/jackc/pgx/v5/stdlib"
	"go.uber.org/goleak"

	"github.com/fencekit/fencekit/internal/testkit/testenv"
)

func TestMain(m *testing.M) {
	// Re-executed by TestBinaryExitStatus, or as a worker of fencekit
	// verify (os.Executable is the test binary): behave as the real
	// command.
	if os.Getenv("FENCEKIT_TEST_RUN_MAIN") == "1" || len(os.Args) > 1 && os.Args[1] == workerCommand {
		main()
		return
	}
	goleak.VerifyTestMain(m)
}

// fencekit runs the command in-process with FENCE_POSTGRES_URL set to the
// test database, and returns its exit status and output.
func fencekit(t *testing.T, args ...string) (int, string, string) {
	t.Helper()
	var stdout, stderr bytes.Buffer
	getenv := func(k string) string {
		if k == databaseURLVar {
			return testenv.PostgresURL()
		}
		return ""
	}
	code := run(context.Background(), args, &stdout, &stderr, getenv)
	return code, stdout.String(), stderr.String()
}

func newSchema(t *testing.T) (string, *sql.DB) {
	t.Helper()
	var b [4]byte
	if _, err := rand.Read(b[:]); err != nil {
		t.Fatal(err)
	}
	schema := "fkcli_" + hex.EncodeToString(b[:])
	db, err := sql.Open("pgx", testenv.PostgresURL())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := db.Exec("CREATE SCHEMA " + schema); err != nil {
		db.Close()
		t.Fatalf("PostgreSQL is required for these tests (%s=%s; run scripts/test.sh): %v",
			testenv.PostgresURLVar, testenv.PostgresURL(), err)
	}
	t.Cleanup(func() {
		defer db.Close()
		if _, err := db.Exec("DROP SCHEMA " + schema + " CASCADE"); err != nil {
			t.Errorf("drop schema: %v", err)
		}
	})
	return schema, db
}

func TestHelpAndUsageErrors(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		args     []string
		code     int
		stdout   string
		stderr   string
		noDBVars bool
	}{
		{[]string{"help"}, 0, "fencekit migrate up", "", false},
		{[]string{"--help"}, 0, "add-lock-version", "", false},
		{[]string{"migrate", "--help"}, 0, "Usage:", "", false},
		{[]string{"migrate", "up", "--help"}, 0, "--database-url", "", false},
		{[]string{"migrate", "add-lock-version", "-h"}, 0, "--apply", "", false},
		// The error for a missing table suggests --offline: help lists it.
		{[]string{"help"}, 0, "--offline  do not connect", "", false},
		{nil, 2, "", "Usage:", false},
		{[]string{"frobnicate"}, 2, "", `unknown command "frobnicate"`, false},
		{[]string{"migrate"}, 2, "", "missing subcommand", false},
		{[]string{"migrate", "sideways"}, 2, "", `unknown subcommand "sideways"`, false},
		{[]string{"migrate", "up", "--bogus"}, 2, "", "flag provided but not defined: -bogus", false},
		{[]string{"migrate", "up", "extra"}, 2, "", "unexpected arguments", false},
		{[]string{"migrate", "add-lock-version"}, 2, "", "--table is required", false},
		{[]string{"migrate", "add-lock-version", "--table", "a.b.c"}, 2, "", "want table or schema.table", false},
		{[]string{"migrate", "add-lock-version", "--table", "t", "--apply", "--offline"}, 2, "", "--offline cannot be used with --apply", false},
		{[]string{"migrate", "up", "--timeout", "0s"}, 2, "", "--timeout must be positive", false},
		{[]string{"migrate", "up", "--database-url", "postgres://u:secret@h:notaport/db"}, 1, "", "bad database URL", false},
		{[]string{"migrate", "status", "--database-url", "postgres://postgres@127.0.0.1:1/test?connect_timeout=5"}, 1, "", "cannot connect to the database", false},
		// A wrong database name: the server answered.
		{[]string{"migrate", "status", "--database-url", noSuchDatabaseURL()}, 1, "", `the database server refused the connection: failed to connect to `, false},
		{[]string{"migrate", "status", "--database-url", noSuchDatabaseURL()}, 1, "", `database "fencekit_no_such_db" does not exist`, false},
	} {
		t.Run(strings.Join(tc.args, " "), func(t *testing.T) {
			code, stdout, stderr := fencekit(t, tc.args...)
			if code != tc.code || !strings.Contains(stdout, tc.stdout) || !strings.Contains(stderr, tc.stderr) {
				t.Fatalf("exit %d, stdout %q, stderr %q; want exit %d, stdout with %q, stderr with %q",
					code, stdout, stderr, tc.code, tc.stdout, tc.stderr)
			}
			if strings.Contains(stderr, "secret") {
				t.Fatalf("stderr leaks the password: %s", stderr)
			}
		})
	}
	// No URL at all.
	var stdout, stderr bytes.Buffer
	code := run(context.Background(), []string{"migrate", "up"}, &stdout, &stderr, func(string) string { return "" })
	if code != 1 || !strings.Contains(stderr.String(), "no database URL") {
		t.Fatalf("no URL: exit %d, stderr %q", code, stderr.String())
	}
}

func TestMigrateCommands(t *testing.T) {
	t.Parallel()
	schema, db := newSchema(t)
	s := "--schema=" + schema
	expect := func(wantCode int, want string, args ...string) string {
		t.Helper()
		code, stdout, stderr := fencekit(t, args...)
		if code != wantCode || !strings.Contains(stdout+stderr, want) {
			t.Fatalf("fencekit %v: exit %d, stdout %q, stderr %q; want exit %d and %q", args, code, stdout, stderr, wantCode, want)
		}
		return stdout
	}
	expect(0, "00003_fencekit_leases.sql", "migrate", "up", s)
	expect(0, "up to date", "migrate", "up", s)
	expect(0, "applied", "migrate", "status", s)

	if _, err := db.Exec(`CREATE TABLE ` + schema + `.orders (id int PRIMARY KEY); INSERT INTO ` + schema + `.orders SELECT generate_series(1, 5)`); err != nil {
		t.Fatal(err)
	}
	expect(0, "-- +goose Up", "migrate", "add-lock-version", s, "--table", schema+".orders")
	out := expect(0, "added lock_version to "+`"`+schema+`"."orders": every existing row starts at lock_version 0`,
		"migrate", "add-lock-version", s, "--table", schema+".Orders", "--apply")
	if strings.Contains(out, "existing rows: 0") {
		t.Fatalf("--apply on a table of 5 rows says %q", out)
	}
	expect(0, "already has lock_version: nothing changed", "migrate", "add-lock-version", s, "--table", "orders", "--apply") // again, via --schema
	// A lock_version added by hand, nullable and unchecked, is completed,
	// and the command says so.
	if _, err := db.Exec(`CREATE TABLE ` + schema + `.partial (id int PRIMARY KEY, lock_version bigint)`); err != nil {
		t.Fatal(err)
	}
	expect(0, "had lock_version without all of its rules: it is now NOT NULL", "migrate", "add-lock-version", s, "--table", "partial", "--apply")
	expect(0, "already has lock_version: nothing changed", "migrate", "add-lock-version", s, "--table", "partial", "--apply")
	var n int
	if err := db.QueryRow(`SELECT count(*) FROM ` + schema + `.orders WHERE lock_version = 0`).Scan(&n); err != nil || n != 5 {
		t.Fatalf("rows with lock_version 0: %d, %v", n, err)
	}
	dir := t.TempDir()
	out = expect(0, "wrote ", "migrate", "add-lock-version", s, "--table", "orders", "--out", dir)
	files, _ := filepath.Glob(filepath.Join(dir, "*_fencekit_lock_version_*.sql"))
	if len(files) != 1 || !strings.Contains(out, files[0]) {
		t.Fatalf("files %v, output %q", files, out)
	}
	// A second run for the same table is refused, even a second later.
	expect(1, "a lock_version migration for this table already exists: "+files[0], "migrate", "add-lock-version", s, "--table", "orders", "--out", dir)
	if again, _ := filepath.Glob(filepath.Join(dir, "*.sql")); len(again) != 1 {
		t.Fatalf("after the second --out: %v", again)
	}
	expect(1, "table not found", "migrate", "add-lock-version", s, "--table", "missing", "--apply")
	expect(1, "table not found", "migrate", "add-lock-version", s, "--table", "missing", "--out", dir)
	expect(0, "-- +goose Up", "migrate", "add-lock-version", s, "--table", "missing", "--offline")
	expect(1, `schema "`+schema+`_nope" does not exist (create it with CREATE SCHEMA, or pass an existing schema to --schema)`, "migrate", "up", "--schema", schema+"_nope")

	expect(0, "down", "migrate", "down", s)
	expect(0, "pending", "migrate", "status", s)
	expect(0, "nothing to roll back", "migrate", "down", s)
	expect(0, "OK", "migrate", "up", s)
	var exists bool
	if err := db.QueryRow(`SELECT to_regclass($1) IS NOT NULL`, pgx.Identifier{schema, "fencekit_resource_tokens"}.Sanitize()).Scan(&exists); err != nil || !exists {
		t.Fatalf("table after up: %v, %v", exists, err)
	}
}

// TestBinaryExitStatus runs the real command as a process: exit statuses
// are what a shell sees.
func TestBinaryExitStatus(t *testing.T) {
	t.Parallel()
	schema, _ := newSchema(t)
	for _, tc := range []struct {
		args []string
		code int
	}{
		{[]string{"help"}, 0},
		{[]string{"migrate", "up", "--schema", schema}, 0},
		{[]string{"migrate", "add-lock-version", "--table", schema + ".nope", "--apply"}, 1},
		{[]string{"migrate", "nope"}, 2},
	} {
		cmd := exec.Command(os.Args[0], tc.args...)
		cmd.Env = append(os.Environ(), "FENCEKIT_TEST_RUN_MAIN=1", databaseURLVar+"="+testenv.PostgresURL())
		out, err := cmd.CombinedOutput()
		code := 0
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			code = ee.ExitCode()
		} else if err != nil {
			t.Fatal(err)
		}
		if code != tc.code {
			t.Errorf("fencekit %v: exit %d, want %d; output:\n%s", tc.args, code, tc.code, out)
		}
	}
}

// noSuchDatabaseURL is the test server's URL with a database that does not
// exist.
func noSuchDatabaseURL() string {
	u, err := url.Parse(testenv.PostgresURL())
	if err != nil {
		panic(err)
	}
	u.Path = "/fencekit_no_such_db"
	return u.String()
}

// TestStatusReadOnly runs migrate status on a read-only session, before
// and after migrate up: it must answer, and create nothing.
func TestStatusReadOnly(t *testing.T) {
	t.Parallel()
	schema, db := newSchema(t)
	u, err := testenv.ReadOnlyPostgresURL("")
	if err != nil {
		t.Fatal(err)
	}
	ro := "--database-url=" + u

	code, stdout, stderr := fencekit(t, "migrate", "status", ro, "--schema", schema)
	if code != 0 || !strings.Contains(stdout, "pending") {
		t.Fatalf("status before up, read-only: exit %d, stdout %q, stderr %q", code, stdout, stderr)
	}
	var exists bool
	if err := db.QueryRow(`SELECT to_regclass($1) IS NOT NULL`, pgx.Identifier{schema, "fencekit_goose_version"}.Sanitize()).Scan(&exists); err != nil || exists {
		t.Fatalf("status created the version table: %v, %v", exists, err)
	}
	if code, _, stderr := fencekit(t, "migrate", "up", "--schema", schema); code != 0 {
		t.Fatalf("up: %s", stderr)
	}
	code, stdout, stderr = fencekit(t, "migrate", "status", ro, "--schema", schema)
	if code != 0 || !strings.Contains(stdout, "applied") || strings.Contains(stdout, "pending") {
		t.Fatalf("status after up, read-only: exit %d, stdout %q, stderr %q", code, stdout, stderr)
	}
}
