package main

import (
	"bytes"
	"context"
	"database/sql"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"
)

func runCLI(t *testing.T, env map[string]string, args ...string) (int, string, string) {
	t.Helper()
	var out, errOut bytes.Buffer
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	code := run(ctx, args, &out, &errOut, func(k string) string { return env[k] })
	return code, out.String(), errOut.String()
}

// TestMigrateSQLite: up, status (read-only: a status of a fresh database
// leaves no version table behind), add-lock-version --apply, on a SQLite
// file.
func TestMigrateSQLite(t *testing.T) {
	path := filepath.Join(t.TempDir(), "app.db")
	db, err := sql.Open("sqlite", "file:"+path)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	if _, err := db.Exec(`CREATE TABLE orders (id INTEGER PRIMARY KEY, status TEXT)`); err != nil {
		t.Fatal(err)
	}
	checkDialect(t, db, nil, "sqlite", path, "orders", `SELECT COUNT(*) FROM sqlite_schema WHERE name = ?`,
		`SELECT type FROM pragma_table_info('orders') WHERE name = 'lock_version'`, "INTEGER")
	// status only reads: it works on a read-only database, where up fails.
	fresh := filepath.Join(t.TempDir(), "fresh.db")
	fdb, err := sql.Open("sqlite", "file:"+fresh)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := fdb.Exec(`CREATE TABLE t (id INTEGER)`); err != nil {
		t.Fatal(err)
	}
	fdb.Close()
	ro := "file:" + fresh + "?mode=ro"
	code, out, errOut := runCLI(t, nil, "migrate", "status", "--dialect", "sqlite", "--database-url", ro)
	if code != 0 || !strings.Contains(out, "pending") {
		t.Fatalf("status on a read-only database = %d\n%s%s", code, out, errOut)
	}
	code, _, errOut = runCLI(t, nil, "migrate", "up", "--dialect", "sqlite", "--database-url", ro)
	if code == 0 {
		t.Fatalf("up on a read-only database succeeded; the read-only check proves nothing\n%s", errOut)
	}
}

// mysqlDatabase makes a throwaway database on the machine's MariaDB
// (FENCE_MYSQL_URL), dropped when t ends, and returns its DSN's config and
// a connection to the server.
func mysqlDatabase(t *testing.T) (*mysql.Config, *sql.DB) {
	t.Helper()
	dsn := os.Getenv(mysqlURLVar)
	if dsn == "" {
		dsn = "root@tcp(127.0.0.1:3306)/test"
	}
	cfg, err := mysql.ParseDSN(dsn)
	if err != nil {
		t.Fatal(err)
	}
	admin, err := sql.Open("mysql", cfg.FormatDSN())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { admin.Close() })
	name := fmt.Sprintf("fk_cli_%d", time.Now().UnixNano())
	if _, err := admin.Exec("CREATE DATABASE " + name); err != nil {
		t.Fatalf("MariaDB at %s (scripts/services.sh ensure_mariadb): %v", cfg.Addr, err)
	}
	t.Cleanup(func() { _, _ = admin.Exec("DROP DATABASE " + name) })
	cfg.DBName = name
	return cfg, admin
}

// TestMigrateMySQL: the same on a throwaway MariaDB database.
func TestMigrateMySQL(t *testing.T) {
	cfg, _ := mysqlDatabase(t)
	name := cfg.DBName
	db, err := sql.Open("mysql", cfg.FormatDSN())
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	if _, err := db.Exec(`CREATE TABLE orders (id BIGINT PRIMARY KEY, status TEXT)`); err != nil {
		t.Fatal(err)
	}
	checkDialect(t, db, map[string]string{mysqlURLVar: cfg.FormatDSN()}, "mysql", "", name+".orders",
		`SELECT COUNT(*) FROM information_schema.TABLES WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = ?`,
		`SELECT COLUMN_TYPE FROM information_schema.COLUMNS WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = 'orders' AND COLUMN_NAME = 'lock_version'`,
		"bigint(20) unsigned")
}

func checkDialect(t *testing.T, db *sql.DB, env map[string]string, dialect, url, table, tableExists, lvType, wantType string) {
	t.Helper()
	args := func(a ...string) []string {
		a = append(a, "--dialect", dialect)
		if url != "" {
			a = append(a, "--database-url", url)
		}
		return a
	}
	count := func(q string, arg any) int {
		var n int
		if err := db.QueryRow(q, arg).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	code, out, errOut := runCLI(t, env, args("migrate", "status")...)
	if code != 0 || !strings.Contains(out, "pending") {
		t.Fatalf("status = %d\n%s%s", code, out, errOut)
	}
	if n := count(tableExists, "fencekit_goose_version"); n != 0 {
		t.Fatalf("status created the version table")
	}
	if code, out, errOut = runCLI(t, env, args("migrate", "up")...); code != 0 {
		t.Fatalf("up = %d\n%s%s", code, out, errOut)
	}
	if n := count(tableExists, "fencekit_resource_tokens"); n != 1 {
		t.Fatalf("up did not create fencekit_resource_tokens")
	}
	if code, out, _ = runCLI(t, env, args("migrate", "status")...); code != 0 || !strings.Contains(out, "applied") || strings.Contains(out, "pending") {
		t.Fatalf("status after up = %d\n%s", code, out)
	}
	if code, out, _ = runCLI(t, env, args("migrate", "up")...); code != 0 || !strings.Contains(out, "up to date") {
		t.Fatalf("second up = %d\n%s", code, out)
	}
	if code, out, errOut = runCLI(t, env, args("migrate", "add-lock-version", "--table", table, "--apply")...); code != 0 {
		t.Fatalf("add-lock-version = %d\n%s%s", code, out, errOut)
	}
	var typ string
	if err := db.QueryRow(lvType).Scan(&typ); err != nil || typ != wantType {
		t.Fatalf("lock_version type %q, %v; want %q", typ, err, wantType)
	}
	// Again: nothing to do.
	if code, out, errOut = runCLI(t, env, args("migrate", "add-lock-version", "--table", table, "--apply")...); code != 0 {
		t.Fatalf("second add-lock-version = %d\n%s%s", code, out, errOut)
	}
	if code, _, errOut = runCLI(t, env, args("migrate", "add-lock-version", "--table", "nope", "--apply")...); code != 1 || !strings.Contains(errOut, "not found") {
		t.Fatalf("add-lock-version of a missing table = %d\n%s", code, errOut)
	}
	if code, out, _ = runCLI(t, env, args("migrate", "add-lock-version", "--table", table, "--offline")...); code != 0 || !strings.Contains(out, "+goose Up") {
		t.Fatalf("printed migration = %d\n%s", code, out)
	}
}
