// Command fencekit manages fencekit's database objects, and lets an
// operator see and end leases and push tokens to guarded resources.
//
//	fencekit lease ls [PREFIX]           the leases of a store: holder, owner, token, time left, waiters
//	fencekit lease show NAME             one lease
//	fencekit lease watch NAME            each change of one lease as it happens
//	fencekit lease revoke NAME           end the current grant (audited); the next token is greater
//	fencekit fence advance --token N ... push a token to a guarded resource; never lowers one
//	fencekit verify [flags]              run the history checks against your stores, with faults
//	fencekit verify --recheck FILE       check a recorded history again
//	fencekit migrate up                  create or update fencekit's tables
//	fencekit migrate down [--to N]       roll them back (all of them by default)
//	fencekit migrate status              show which migrations are applied
//	fencekit migrate add-lock-version --table [schema.]table [--table ...] [--apply] [--out DIR] [--offline]
//	fencekit version                     print the version (also --version)
//
// Every migrate command takes --database-url (default: $FENCE_POSTGRES_URL)
// and --schema (the schema for fencekit's tables; default: the first
// existing schema of the connection's search_path). Run fencekit help for
// the details. The exit status is 0 on success, 1 on failure and 2 for a
// usage error.
package main

import (
	"context"
	"database/sql"
	"errors"
	"flag"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/signal"
	"runtime"
	"runtime/debug"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/pressly/goose/v3"

	"github.com/fencekit/fencekit/migrations"
)

const databaseURLVar = "FENCE_POSTGRES_URL"

func main() {
	if len(os.Args) > 1 && os.Args[1] == workerCommand {
		// A worker of fencekit verify: its run stops it (a terminal's
		// Ctrl-C reaches the run, which stops its workers in order).
		signal.Ignore(os.Interrupt)
		os.Exit(runWorker(context.Background(), os.Stdin, os.Stdout, os.Stderr))
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := run(ctx, os.Args[1:], os.Stdout, os.Stderr, os.Getenv)
	stop()
	os.Exit(code)
}

// Exit statuses.
const (
	exitOK    = 0
	exitFail  = 1
	exitUsage = 2
)

const usage = `fencekit manages fencekit's database objects on PostgreSQL
(and, with --dialect, on MySQL/MariaDB and SQLite), shows and revokes
leases on every store, and pushes tokens to guarded resources.

Usage:
  fencekit lease ls|show|watch|revoke see and end leases (fencekit lease help)
  fencekit fence advance --token N    push a token to a guarded resource
                                      (fencekit fence help)
  fencekit verify [flags]             run the history checks against your own
                                      lease store and guarded store, with
                                      faults; a report and a re-checkable
                                      history (fencekit verify help)
  fencekit migrate up                 apply fencekit's migrations: create the
                                      fencekit_resource_tokens table and the
                                      fencekit_advance_token function (sqlguard),
                                      the fencekit_leases and
                                      fencekit_session_leases tables, their
                                      waiter tables, the
                                      fencekit_lease_ended_owners and
                                      fencekit_session_lease_ended_owners tables
                                      and their functions (pglease)
  fencekit migrate down [--to N]      roll back fencekit's migrations newer than
                                      version N (default 0: all of them; this
                                      drops every stored resource token and
                                      lease)
  fencekit migrate status             list fencekit's migrations and their state
  fencekit migrate add-lock-version --table [schema.]table [--table ...] [--apply] [--out DIR] [--offline]
                                      add the lock_version column that row-level
                                      fencing needs to your tables (repeat
                                      --table for several; each is checked
                                      before anything is written):
                                        --out DIR  write a goose migration file
                                                   per table (refused if DIR
                                                   already has one for the
                                                   table; its version is the
                                                   current second, or the next
                                                   one no file in DIR has)
                                        --apply    apply it to the database now
                                        neither    print the migration
                                        --offline  do not connect to check that
                                                   the table exists (not with
                                                   --apply)
  fencekit version                    print the version, the Go version and the
                                      newest fencekit migration it applies
                                      (also --version)
  fencekit help                       show this help

Flags of every migrate command:
  --dialect NAME      postgres (default), mysql (MySQL 8 or MariaDB 10.5+,
                      package dbguard) or sqlite (package dbguard)
  --database-url URL  PostgreSQL URL or DSN (default: $FENCE_POSTGRES_URL);
                      with --dialect mysql a go-sql-driver DSN such as
                      root@tcp(127.0.0.1:3306)/app (default: $FENCE_MYSQL_URL);
                      with --dialect sqlite the database file (or a
                      modernc.org/sqlite file: DSN)
  --schema NAME       schema for fencekit's tables, and where unqualified table
                      names are looked up (default: the connection's search_path)
  --timeout D         give up after this long (default 2m)

With --dialect mysql or sqlite, --table is [database.]table (MySQL) or
[schema.]table (SQLite), used exactly as given; --schema is not used (the
DSN names the database); add-lock-version adds BIGINT UNSIGNED NOT NULL
DEFAULT 0 (MySQL) or INTEGER NOT NULL DEFAULT 0 (SQLite).

Table names follow SQL: unquoted parts are folded to lower case, quoted parts
("My Table") are kept exactly. Once a table is fenced, every write to it must
go through package sqlguard: a plain UPDATE is not fenced.
`

func run(ctx context.Context, args []string, stdout, stderr io.Writer, getenv func(string) string) int {
	if len(args) == 0 {
		fmt.Fprint(stderr, usage)
		return exitUsage
	}
	switch args[0] {
	case "help", "-h", "-help", "--help":
		fmt.Fprint(stdout, usage)
		return exitOK
	case "version", "-version", "--version":
		fmt.Fprintln(stdout, versionLine())
		return exitOK
	case "migrate":
		return runMigrate(ctx, args[1:], stdout, stderr, getenv)
	case "lease":
		return runLease(ctx, args[1:], stdout, stderr, getenv)
	case "fence":
		return runFence(ctx, args[1:], stdout, stderr, getenv)
	case "verify":
		return runVerify(ctx, args[1:], stdout, stderr, getenv)
	default:
		fmt.Fprintf(stderr, "fencekit: unknown command %q (try fencekit help)\n", args[0])
		return exitUsage
	}
}

// common holds the flags every migrate command takes.
type common struct {
	url     string
	urlSet  bool
	schema  string
	dialect string
	timeout time.Duration
}

func (c *common) register(fs *flag.FlagSet, getenv func(string) string) {
	fs.StringVar(&c.url, "database-url", getenv(databaseURLVar), "PostgreSQL URL or DSN (default: $"+databaseURLVar+")")
	fs.StringVar(&c.schema, "schema", "", "schema for fencekit's tables (default: the connection's search_path)")
	fs.DurationVar(&c.timeout, "timeout", 2*time.Minute, "give up after this long")
	fs.StringVar(&c.dialect, "dialect", "postgres", "postgres, mysql (MySQL/MariaDB) or sqlite")
}

// open opens and pings the database, and checks that --schema exists.
func (c *common) open(ctx context.Context) (*sql.DB, error) {
	if c.url == "" {
		return nil, fmt.Errorf("no database URL: pass --database-url or set %s", databaseURLVar)
	}
	db, err := migrations.Open(c.url, c.schema)
	if err != nil {
		return nil, err
	}
	if err := db.PingContext(ctx); err != nil {
		db.Close()
		var pgErr *pgconn.PgError
		if errors.As(err, &pgErr) {
			// The server answered: it refused this database, user or
			// password.
			return nil, fmt.Errorf("the database server refused the connection: %w", err)
		}
		return nil, fmt.Errorf("cannot connect to the database: %w", err)
	}
	if c.schema != "" {
		var exists bool
		if err := db.QueryRowContext(ctx, `SELECT EXISTS (SELECT 1 FROM pg_catalog.pg_namespace WHERE nspname = $1)`, c.schema).Scan(&exists); err != nil {
			db.Close()
			return nil, fmt.Errorf("look up schema %q: %w", c.schema, err)
		}
		if !exists {
			db.Close()
			return nil, fmt.Errorf("schema %q does not exist (create it with CREATE SCHEMA, or pass an existing schema to --schema)", c.schema)
		}
	}
	return db, nil
}

func runMigrate(ctx context.Context, args []string, stdout, stderr io.Writer, getenv func(string) string) int {
	if len(args) == 0 {
		fmt.Fprint(stderr, "fencekit migrate: missing subcommand (up, down, status, add-lock-version)\n")
		return exitUsage
	}
	sub, args := args[0], args[1:]
	if sub == "help" || sub == "-h" || sub == "-help" || sub == "--help" {
		fmt.Fprint(stdout, usage)
		return exitOK
	}
	fs := flag.NewFlagSet("fencekit migrate "+sub, flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() { fmt.Fprint(stderr, usage) }
	var c common
	c.register(fs, getenv)
	var (
		to                 int64
		tables             tableList
		out                string
		apply, offline     bool
		known              = true
		needsTable, needDB bool
	)
	switch sub {
	case "up", "status":
		needDB = true
	case "down":
		fs.Int64Var(&to, "to", 0, "roll back migrations newer than this version")
		needDB = true
	case "add-lock-version":
		fs.Var(&tables, "table", "[schema.]table to add lock_version to (repeat it for several tables)")
		fs.StringVar(&out, "out", "", "write the goose migration file into this directory")
		fs.BoolVar(&apply, "apply", false, "apply the migration to the database now")
		fs.BoolVar(&offline, "offline", false, "do not check that the table exists (only without --apply)")
		needsTable = true
	default:
		known = false
	}
	if !known {
		fmt.Fprintf(stderr, "fencekit migrate: unknown subcommand %q (up, down, status, add-lock-version)\n", sub)
		return exitUsage
	}
	for _, a := range args {
		if a == "--" {
			break
		}
		if a == "-h" || a == "-help" || a == "--help" {
			fmt.Fprint(stdout, usage) // once, to stdout
			return exitOK
		}
	}
	if err := fs.Parse(args); err != nil {
		return exitUsage // flag already printed the problem and the usage
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "fencekit migrate %s: unexpected arguments %q\n", sub, fs.Args())
		return exitUsage
	}
	fs.Visit(func(f *flag.Flag) { c.urlSet = c.urlSet || f.Name == "database-url" })
	dialect, err := sqlDialect(c.dialect)
	if err != nil {
		fmt.Fprintf(stderr, "fencekit migrate %s: %v\n", sub, err)
		return exitUsage
	}
	if dialect != goose.DialectPostgres {
		return runOtherDialect(ctx, sub, dialect, &c, getenv, to, tables, out, apply, offline, stdout, stderr)
	}
	var tbls []migrations.TableName
	if needsTable {
		if len(tables) == 0 {
			fmt.Fprintf(stderr, "fencekit migrate %s: --table is required\n", sub)
			return exitUsage
		}
		for _, table := range tables {
			tbl, err := migrations.ParseTableName(table)
			if err != nil {
				fmt.Fprintf(stderr, "fencekit migrate %s: %v\n", sub, err)
				return exitUsage
			}
			tbls = append(tbls, tbl)
		}
		if offline && apply {
			fmt.Fprintf(stderr, "fencekit migrate %s: --offline cannot be used with --apply\n", sub)
			return exitUsage
		}
		needDB = !offline
	}
	if c.timeout <= 0 {
		fmt.Fprintf(stderr, "fencekit migrate %s: --timeout must be positive\n", sub)
		return exitUsage
	}

	ctx, cancel := context.WithTimeout(ctx, c.timeout)
	defer cancel()
	var db *sql.DB
	if needDB {
		var err error
		if db, err = c.open(ctx); err != nil {
			fmt.Fprintf(stderr, "fencekit migrate %s: %v\n", sub, err)
			return exitFail
		}
		defer db.Close()
	}
	switch sub {
	case "up":
		err = migrateUp(ctx, db, stdout)
	case "down":
		err = migrateDown(ctx, db, to, stdout)
	case "status":
		err = migrateStatus(ctx, db, stdout)
	case "add-lock-version":
		// Every table is checked before anything is written or applied.
		if db != nil && !apply {
			for _, tbl := range tbls {
				if err = tableMustExist(ctx, db, tbl); err != nil {
					break
				}
			}
		}
		for _, tbl := range tbls {
			if err != nil {
				break
			}
			err = addLockVersion(ctx, db, tbl, out, apply, stdout)
		}
	}
	if err != nil {
		fmt.Fprintf(stderr, "fencekit migrate %s: %v\n", sub, err)
		return exitFail
	}
	return exitOK
}

func migrateUp(ctx context.Context, db *sql.DB, w io.Writer) error {
	res, err := migrations.Up(ctx, db)
	for _, r := range res {
		fmt.Fprintln(w, r)
	}
	if err != nil {
		return err
	}
	if len(res) == 0 {
		fmt.Fprintln(w, "fencekit migrations are up to date")
	}
	return nil
}

func migrateDown(ctx context.Context, db *sql.DB, to int64, w io.Writer) error {
	res, err := migrations.DownTo(ctx, db, to)
	for _, r := range res {
		fmt.Fprintln(w, r)
	}
	if err != nil {
		return err
	}
	if len(res) == 0 {
		fmt.Fprintf(w, "nothing to roll back (fencekit migrations are at or below version %d)\n", to)
	}
	return nil
}

func migrateStatus(ctx context.Context, db *sql.DB, w io.Writer) error {
	var schema sql.NullString
	if err := db.QueryRowContext(ctx, "SELECT current_schema()").Scan(&schema); err != nil {
		return err
	}
	st, err := migrations.Status(ctx, db)
	if err != nil {
		return err
	}
	fmt.Fprintf(w, "fencekit migrations in schema %q (version table %s):\n", schema.String, migrations.VersionTable)
	for _, s := range st {
		applied := "-"
		if !s.AppliedAt.IsZero() {
			applied = s.AppliedAt.UTC().Format(time.RFC3339)
		}
		fmt.Fprintf(w, "  %-8s %-20s %s\n", s.State, applied, s.Source.Path)
	}
	return nil
}

// tableMustExist returns an error wrapping migrations.ErrTableNotFound,
// naming the schemas searched, when tbl does not exist.
func tableMustExist(ctx context.Context, db *sql.DB, tbl migrations.TableName) error {
	ok, err := migrations.TableExists(ctx, db, tbl)
	if err != nil {
		return err
	}
	if !ok {
		return fmt.Errorf("%w: %s (%s; use --offline to generate the migration anyway)", migrations.ErrTableNotFound, tbl, searched(ctx, db, tbl))
	}
	return nil
}

// searched says where tbl was looked for: its schema, or the connection's
// search_path for an unqualified name.
func searched(ctx context.Context, db *sql.DB, tbl migrations.TableName) string {
	if tbl.Schema != "" {
		return fmt.Sprintf("looked in schema %q", tbl.Schema)
	}
	var path string
	if err := db.QueryRowContext(ctx, `SELECT array_to_string(pg_catalog.current_schemas(false), ', ')`).Scan(&path); err != nil || path == "" {
		return "no schema of the search_path has it; qualify the name as schema.table or pass --schema"
	}
	return fmt.Sprintf("looked in the search_path: %s; qualify the name as schema.table or pass --schema", path)
}

func addLockVersion(ctx context.Context, db *sql.DB, tbl migrations.TableName, out string, apply bool, w io.Writer) error {
	if out != "" {
		path, err := migrations.WriteLockVersionMigration(out, tbl, time.Now())
		if err != nil {
			return err
		}
		fmt.Fprintf(w, "wrote %s\n", path)
	}
	if apply {
		had, err := migrations.LockVersionOf(ctx, db, tbl)
		if errors.Is(err, migrations.ErrTableNotFound) {
			return fmt.Errorf("%w (%s)", err, searched(ctx, db, tbl))
		}
		if err != nil {
			return err
		}
		if err := migrations.ApplyLockVersion(ctx, db, tbl); err != nil {
			return err
		}
		switch {
		case had.Complete():
			fmt.Fprintf(w, "%s already has lock_version: nothing changed\n", tbl)
		case had.Column:
			fmt.Fprintf(w, "%s had lock_version without all of its rules: it is now NOT NULL with its non-negative check (%s)\n", tbl, migrations.LockVersionConstraint)
		default:
			fmt.Fprintf(w, "added lock_version to %s: every existing row starts at lock_version 0, so the first fenced write with any token succeeds\n", tbl)
		}
	}
	if out == "" && !apply {
		text, err := migrations.LockVersionMigration(tbl)
		if err != nil {
			return err
		}
		fmt.Fprint(w, text)
	}
	return nil
}

// tableList is the value of a repeatable --table flag.
type tableList []string

func (l *tableList) String() string { return strings.Join(*l, ",") }

func (l *tableList) Set(v string) error {
	if v == "" {
		return errors.New("empty table name")
	}
	*l = append(*l, v)
	return nil
}

// versionLine says which fencekit this is: the module version it was built
// at ("(devel)" when built from a checkout, with the VCS revision when go
// build recorded one), the Go version, and the highest fencekit migration
// it applies.
func versionLine() string {
	v, rev, dirty, goVersion := "(unknown)", "", false, runtime.Version()
	if bi, ok := debug.ReadBuildInfo(); ok {
		v, goVersion = bi.Main.Version, bi.GoVersion
		for _, s := range bi.Settings {
			switch s.Key {
			case "vcs.revision":
				rev = s.Value
			case "vcs.modified":
				dirty = s.Value == "true"
			}
		}
	}
	if rev != "" {
		if len(rev) > 12 {
			rev = rev[:12]
		}
		v += " " + rev
		if dirty {
			v += "+dirty"
		}
	}
	line := fmt.Sprintf("fencekit %s (%s)", v, goVersion)
	if latest := latestMigration(); latest > 0 {
		line += fmt.Sprintf("; fencekit migrations up to version %d", latest)
	}
	return line
}

// latestMigration is the highest version among the embedded PostgreSQL
// migrations (0 if none can be read).
func latestMigration() int64 {
	fsys, err := migrations.FS()
	if err != nil {
		return 0
	}
	names, _ := fs.Glob(fsys, "*.sql")
	var latest int64
	for _, n := range names {
		digits := n[:strings.IndexFunc(n+"_", func(r rune) bool { return r < '0' || r > '9' })]
		if v, err := strconv.ParseInt(digits, 10, 64); err == nil && v > latest {
			latest = v
		}
	}
	return latest
}
