package migrations_test

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"regexp"
	"strings"
	"sync"
	"testing"
	"testing/fstest"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/pressly/goose/v3"
	"go.uber.org/goleak"

	"github.com/fencekit/fencekit/internal/testkit/testenv"
	"github.com/fencekit/fencekit/migrations"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

var nonIdent = regexp.MustCompile(`[^a-z0-9]+`)

// newSchema creates a throwaway schema, dropped when the test ends, and
// returns its name and a *sql.DB whose search_path is that schema.
func newSchema(t testing.TB) (string, *sql.DB) {
	t.Helper()
	var b [4]byte
	if _, err := rand.Read(b[:]); err != nil {
		t.Fatal(err)
	}
	name := nonIdent.ReplaceAllString(strings.ToLower(t.Name()), "_")
	if len(name) > 40 {
		name = name[len(name)-40:]
	}
	schema := "fkm_" + name + "_" + hex.EncodeToString(b[:])

	admin, err := sql.Open("pgx", testenv.PostgresURL())
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if _, err := admin.ExecContext(ctx, "CREATE SCHEMA "+pgx.Identifier{schema}.Sanitize()); err != nil {
		admin.Close()
		t.Fatalf("PostgreSQL is required for these tests (%s=%s; run scripts/test.sh): create schema: %v",
			testenv.PostgresURLVar, testenv.PostgresURL(), err)
	}
	t.Cleanup(func() {
		defer admin.Close()
		if _, err := admin.ExecContext(context.Background(), "DROP SCHEMA "+pgx.Identifier{schema}.Sanitize()+" CASCADE"); err != nil {
			t.Errorf("drop schema: %v", err)
		}
	})
	db, err := migrations.Open(testenv.PostgresURL(), schema)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() }) // before the schema is dropped
	return schema, db
}

func queryBool(t testing.TB, db *sql.DB, q string, args ...any) bool {
	t.Helper()
	var v bool
	if err := db.QueryRowContext(context.Background(), q, args...).Scan(&v); err != nil {
		t.Fatalf("%s: %v", q, err)
	}
	return v
}

// objects reports which of the toolkit's objects exist in schema.
func objects(t *testing.T, db *sql.DB, schema string) (table, fn, version bool) {
	t.Helper()
	table = queryBool(t, db, `SELECT to_regclass($1) IS NOT NULL`, pgx.Identifier{schema, migrations.ResourceTable}.Sanitize())
	fn = queryBool(t, db, `SELECT EXISTS (SELECT 1 FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace WHERE n.nspname = $1 AND p.proname = $2)`,
		schema, migrations.AdvanceFunction)
	version = queryBool(t, db, `SELECT to_regclass($1) IS NOT NULL`, pgx.Identifier{schema, migrations.VersionTable}.Sanitize())
	return table, fn, version
}

// embeddedFS is migrations.FS(opts...), which fails only for an unknown
// dialect.
func embeddedFS(t *testing.T, opts ...migrations.Option) fs.FS {
	t.Helper()
	fsys, err := migrations.FS(opts...)
	if err != nil {
		t.Fatal(err)
	}
	return fsys
}

func TestUpDownUp(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	schema, db := newSchema(t)

	files, err := fs.Glob(embeddedFS(t), "*.sql")
	if err != nil || len(files) == 0 {
		t.Fatalf("embedded migrations: %v, %v", files, err)
	}
	all := len(files)
	for round := 1; round <= 2; round++ {
		res, err := migrations.Up(ctx, db)
		if err != nil {
			t.Fatalf("round %d: Up: %v", round, err)
		}
		if len(res) != all || res[0].Source.Version != 1 || res[0].Direction != "up" {
			t.Fatalf("round %d: Up results %v", round, res)
		}
		if table, fn, version := objects(t, db, schema); !table || !fn || !version {
			t.Fatalf("round %d after Up: table %v, function %v, version table %v", round, table, fn, version)
		}
		if queryBool(t, db, `SELECT to_regclass($1) IS NOT NULL`, pgx.Identifier{schema, "goose_db_version"}.Sanitize()) {
			t.Fatal("goose's default version table was created")
		}
		// Up again: nothing to do.
		if res, err := migrations.Up(ctx, db); err != nil || len(res) != 0 {
			t.Fatalf("second Up = %v, %v", res, err)
		}
		st, err := migrations.Status(ctx, db)
		if err != nil || len(st) != all || st[all-1].State != goose.StateApplied {
			t.Fatalf("Status = %v, %v", st, err)
		}
		// The function works and keeps the fence.
		var tok int64
		if err := db.QueryRowContext(ctx, `SELECT fencekit_advance_token('r', 5)`).Scan(&tok); err != nil || tok != 5 {
			t.Fatalf("advance = %d, %v", tok, err)
		}
		_, err = db.ExecContext(ctx, `SELECT fencekit_advance_token('r', 4)`)
		if err == nil || !strings.Contains(err.Error(), "FK409") || !strings.Contains(err.Error(), "current 5") {
			t.Fatalf("stale advance: %v", err)
		}

		res, err = migrations.Down(ctx, db)
		if err != nil || len(res) != all || res[0].Direction != "down" {
			t.Fatalf("round %d: Down = %v, %v", round, res, err)
		}
		if table, fn, _ := objects(t, db, schema); table || fn {
			t.Fatalf("round %d after Down: table %v, function %v", round, table, fn)
		}
		st, err = migrations.Status(ctx, db)
		if err != nil || len(st) != all || st[0].State != goose.StatePending {
			t.Fatalf("Status after Down = %v, %v", st, err)
		}
	}
	if _, err := migrations.Up(ctx, db); err != nil {
		t.Fatalf("final Up: %v", err)
	}
}

// TestHostGooseMigrationsCoexist: the host application's own goose
// migrations, in the same schema with goose's defaults, are tracked
// separately from fencekit's.
func TestHostGooseMigrationsCoexist(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	schema, db := newSchema(t)
	host := fstest.MapFS{
		"00001_host.sql": {Data: []byte("-- +goose Up\nCREATE TABLE host_things (id int);\n-- +goose Down\nDROP TABLE host_things;\n")},
		"00002_more.sql": {Data: []byte("-- +goose Up\nCREATE TABLE host_more (id int);\n-- +goose Down\nDROP TABLE host_more;\n")},
	}
	hp, err := goose.NewProvider(goose.DialectPostgres, db, host, goose.WithDisableGlobalRegistry(true))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := hp.Up(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := migrations.Up(ctx, db); err != nil {
		t.Fatal(err)
	}
	if v, err := hp.GetDBVersion(ctx); err != nil || v != 2 {
		t.Fatalf("host version = %d, %v", v, err)
	}
	if _, err := migrations.Down(ctx, db); err != nil {
		t.Fatal(err)
	}
	if !queryBool(t, db, `SELECT to_regclass($1) IS NOT NULL`, pgx.Identifier{schema, "host_more"}.Sanitize()) {
		t.Fatal("fencekit's Down touched the host's tables")
	}
	if v, err := hp.GetDBVersion(ctx); err != nil || v != 2 {
		t.Fatalf("host version after fencekit Down = %d, %v", v, err)
	}
}

func TestConcurrentUp(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	schema, _ := newSchema(t)
	var wg sync.WaitGroup
	errs := make([]error, 3)
	for i := range errs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			db, err := migrations.Open(testenv.PostgresURL(), schema)
			if err != nil {
				errs[i] = err
				return
			}
			defer db.Close()
			_, errs[i] = migrations.Up(ctx, db)
		}()
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			t.Errorf("concurrent Up: %v", err)
		}
	}
}

func TestOpenAndSchemaErrors(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for _, tc := range []struct {
		name, url, schema string
	}{
		{"empty URL", "", ""},
		{"bad URL", "postgres://user:secret@host:notaport/db", ""},
		{"NUL in schema", testenv.PostgresURL(), "a\x00b"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			db, err := migrations.Open(tc.url, tc.schema)
			if db != nil || !errors.Is(err, migrations.ErrInvalid) {
				t.Fatalf("Open = %v, %v; want ErrInvalid", db, err)
			}
			if strings.Contains(err.Error(), "secret") {
				t.Fatalf("error leaks the password: %v", err)
			}
		})
	}
	db, err := migrations.Open(testenv.PostgresURL(), "fkm_no_such_schema_"+strings.Repeat("x", 8))
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	if _, err := migrations.Up(ctx, db); !errors.Is(err, migrations.ErrNoSchema) {
		t.Fatalf("Up without a schema: %v, want ErrNoSchema", err)
	}
	if _, err := migrations.Up(ctx, nil); !errors.Is(err, migrations.ErrInvalid) {
		t.Fatalf("Up(nil): %v", err)
	}
	if _, err := migrations.DownTo(ctx, db, -1); !errors.Is(err, migrations.ErrInvalid) {
		t.Fatalf("DownTo(-1): %v", err)
	}
}

// The ledger's migration is the one LedgerMigration names, and it creates
// LedgerTable keyed by job and run key, so that the errors that name it
// (sqlguard.Ledger's) point at the right one.
func TestLedgerMigrationCreatesTheLedgerTable(t *testing.T) {
	files, err := fs.Glob(embeddedFS(t), fmt.Sprintf("%05d_*.sql", migrations.LedgerMigration))
	if err != nil || len(files) != 1 {
		t.Fatalf("migration %05d: %v, %v", migrations.LedgerMigration, files, err)
	}
	src, err := fs.ReadFile(embeddedFS(t), files[0])
	if err != nil {
		t.Fatal(err)
	}
	if s := string(src); !strings.Contains(s, "CREATE TABLE "+migrations.LedgerTable+" (") || !strings.Contains(s, "PRIMARY KEY (job, run_key)") {
		t.Fatalf("%s does not create %s keyed by (job, run_key):\n%s", files[0], migrations.LedgerTable, s)
	}
}

// The job table's migration is the one JobsMigration names, and it
// creates JobsTable with the columns sqlguard.Jobs reads and writes.
func TestJobsMigrationCreatesTheJobTable(t *testing.T) {
	files, err := fs.Glob(embeddedFS(t), fmt.Sprintf("%05d_*.sql", migrations.JobsMigration))
	if err != nil || len(files) != 1 {
		t.Fatalf("migration %05d: %v, %v", migrations.JobsMigration, files, err)
	}
	src, err := fs.ReadFile(embeddedFS(t), files[0])
	if err != nil {
		t.Fatal(err)
	}
	s := string(src)
	if !strings.Contains(s, "CREATE TABLE "+migrations.JobsTable+" (") {
		t.Fatalf("%s does not create %s:\n%s", files[0], migrations.JobsTable, s)
	}
	for _, col := range []string{"id ", "state ", "attempt ", "run_at ", "claimed_until ", "last_error ", "finished_at ", "lock_version "} {
		if !strings.Contains(s, "\n    "+col) {
			t.Errorf("%s: no column %q", files[0], strings.TrimSpace(col))
		}
	}
}

// On MySQL and SQLite too, the ledger's migration is the one
// LedgerMigrationFor names, and it creates LedgerTable keyed by job and
// run key (dbguard.Ledger's errors name it).
func TestLedgerMigrationForCreatesTheLedgerTable(t *testing.T) {
	for _, d := range []goose.Dialect{migrations.DialectMySQL, migrations.DialectSQLite} {
		fsys, err := migrations.FS(migrations.WithDialect(d))
		if err != nil {
			t.Fatal(err)
		}
		files, err := fs.Glob(fsys, fmt.Sprintf("%05d_*.sql", migrations.LedgerMigrationFor))
		if err != nil || len(files) != 1 {
			t.Fatalf("%s: migration %05d: %v, %v", d, migrations.LedgerMigrationFor, files, err)
		}
		src, err := fs.ReadFile(fsys, files[0])
		if err != nil {
			t.Fatal(err)
		}
		if s := string(src); !strings.Contains(s, "CREATE TABLE IF NOT EXISTS "+migrations.LedgerTable+" (") || !strings.Contains(s, "PRIMARY KEY (job, run_key)") {
			t.Fatalf("%s: %s does not create %s keyed by (job, run_key):\n%s", d, files[0], migrations.LedgerTable, s)
		}
	}
}

// Every function refuses a dialect it has no migrations for, with an
// error that matches ErrInvalid and names the dialects it has, before any
// I/O: db points at a port where nothing listens.
func TestUnknownDialectIsRefusedBeforeIO(t *testing.T) {
	db, err := sql.Open("pgx", "postgres://127.0.0.1:1/none?connect_timeout=1")
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	ctx := context.Background()
	bad := migrations.WithDialect("oracle")
	tbl := migrations.TableName{Name: "orders"}
	calls := map[string]error{}
	_, calls["FS"] = migrations.FS(bad)
	_, calls["NewProvider"] = migrations.NewProvider(ctx, db, bad)
	_, calls["Up"] = migrations.Up(ctx, db, bad)
	_, calls["Down"] = migrations.Down(ctx, db, bad)
	_, calls["DownTo"] = migrations.DownTo(ctx, db, 1, bad)
	_, calls["Status"] = migrations.Status(ctx, db, bad)
	calls["ApplyLockVersion"] = migrations.ApplyLockVersion(ctx, db, tbl, bad)
	_, calls["LockVersionMigration"] = migrations.LockVersionMigration(tbl, bad)
	_, calls["WriteLockVersionMigration"] = migrations.WriteLockVersionMigration(t.TempDir(), tbl, time.Now(), bad)
	for call, err := range calls {
		if !errors.Is(err, migrations.ErrInvalid) || !strings.Contains(err.Error(), `no fencekit migrations for dialect "oracle"`) {
			t.Errorf("%s with dialect oracle = %v, want ErrInvalid naming the dialects there are", call, err)
		}
	}
}
