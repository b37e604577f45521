// Package migrations holds fencekit's database migrations and the tools to
// add a lock_version column to your own tables.
//
// # The toolkit's own tables
//
// Resource-level fencing (package sqlguard's Guard) keeps one row per
// resource in a table named fencekit_resource_tokens and advances it through
// a function named fencekit_advance_token. Both are created by goose v3 SQL
// migrations embedded in this package. They run through goose's Provider
// API with fencekit's own version table (fencekit_goose_version) and with
// goose's global registry disabled, so they never collide with the host
// application's goose migrations, even in the same schema.
//
// Leases kept in PostgreSQL (package lease/pglease) live in two more
// tables created the same way: fencekit_leases (table mode: one row per
// lease name, kept after release so that its token only grows) and
// fencekit_session_leases (session mode: the last token of each name),
// with fencekit_lease_waiters and fencekit_session_lease_waiters (each
// mode's lines of waiters: one row per owner waiting in line for a name)
// and fencekit_lease_ended_owners and fencekit_session_lease_ended_owners
// (the owners each mode ended, one row per name and owner, kept for
// driver.EndedOwnerTTL, with the functions that read and prune them;
// migration 00007).
// The ledger of once-per-period jobs (sqlguard.Ledger, for
// lease.Manager.RunOnce) is fencekit_job_runs: one row per run, keyed by
// the job and the run key (migration 00006; on MySQL and SQLite, for
// dbguard.Ledger, migration 00002 of their own). A job table of one's own,
// fenced by each attempt's token (sqlguard.Jobs), is fencekit_jobs
// (migration 00008): one row per job, claimed with SELECT ... FOR UPDATE
// SKIP LOCKED.
//
// Everything is created in the connection's current schema: the first schema
// of its search_path that exists. To put the tables in a schema of your
// choosing, open the database with Open(url, schema), or set search_path in
// the connection string. Runs of Up and Down on the same schema are
// serialized with a PostgreSQL advisory lock derived from the schema name.
//
// # lock_version on your tables
//
// Row-level fencing (sqlguard.Table) needs a column
//
//	lock_version BIGINT NOT NULL DEFAULT 0 CHECK (lock_version >= 0)
//
// on each fenced table. LockVersionMigration and WriteLockVersionMigration
// generate a goose migration that adds it (idempotently) to a named table,
// and ApplyLockVersion runs that migration's Up section directly. Existing
// rows get lock_version 0, so the first fenced write with any valid token
// succeeds. The command fencekit migrate add-lock-version wraps both.
//
// lock_version must be written by the guard and nothing else: a plain UPDATE
// that does not go through sqlguard is not fenced, and a stale holder using
// one can overwrite newer data. See package sqlguard.
//
// # MySQL/MariaDB and SQLite
//
// Package dbguard's tables have migrations of their own, embedded beside
// these. Every function above takes them with one option,
// WithDialect(DialectMySQL) or WithDialect(DialectSQLite): Up, Down,
// DownTo, Status, NewProvider, FS, ApplyLockVersion, LockVersionMigration
// and WriteLockVersionMigration. Without it they work on PostgreSQL.
package migrations

import (
	"context"
	"database/sql"
	"embed"
	"errors"
	"fmt"
	"hash/fnv"
	"io/fs"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/stdlib"
	"github.com/pressly/goose/v3"
	"github.com/pressly/goose/v3/database"
	"github.com/pressly/goose/v3/lock"
)

// Names of the objects these migrations create. Package sqlguard uses the
// same names.
const (
	// VersionTable is goose's version table for fencekit's migrations. It is
	// distinct from goose's default (goose_db_version), so the host
	// application's own goose migrations are tracked separately.
	VersionTable = "fencekit_goose_version"
	// ResourceTable holds one row per fenced resource: its newest token.
	ResourceTable = "fencekit_resource_tokens"
	// AdvanceFunction is the function that advances a resource's token.
	AdvanceFunction = "fencekit_advance_token"
	// LedgerTable holds the runs of once-per-period jobs, keyed by job and
	// run key (migration 00006).
	LedgerTable = "fencekit_job_runs"
	// LedgerMigration is the version of the migration that creates
	// LedgerTable.
	LedgerMigration = 6
	// JobsTable is the job table of sqlguard.Jobs: one row per job, its
	// state, its attempt's claim and the attempt's fencing token
	// (migration 00008).
	JobsTable = "fencekit_jobs"
	// JobsMigration is the version of the migration that creates
	// JobsTable.
	JobsMigration = 8
	// LedgerMigrationFor is the version of the MySQL and SQLite migration
	// that creates LedgerTable (dbguard.Ledger).
	LedgerMigrationFor = 2
)

//go:embed sql/*.sql sqlmysql/*.sql sqlsqlite/*.sql
var embedded embed.FS

// ErrNoSchema is returned when the connection has no current schema to
// create tables in (no schema of its search_path exists).
var ErrNoSchema = errors.New("migrations: no current schema (no schema in search_path exists)")

// ErrInvalid is returned, before any I/O, for an argument that cannot be
// used: a nil database, an empty or malformed table name.
var ErrInvalid = errors.New("migrations: invalid argument")

// ErrTableNotFound is returned when a table named for a lock_version
// migration does not exist.
var ErrTableNotFound = errors.New("migrations: table not found")

// FS returns the embedded SQL migrations (goose format) of the dialect
// (Options.Dialect: PostgreSQL unless WithDialect says otherwise) at the
// root of the returned file system. The only error is an unknown dialect
// (ErrInvalid).
func FS(opts ...Option) (fs.FS, error) {
	o, err := applyOptions(opts)
	if err != nil {
		return nil, err
	}
	return dialectFS(o.Dialect)
}

// Open returns a *sql.DB over pgx's database/sql driver for databaseURL
// (a postgres:// URL or a key=value DSN). If schema is not empty, every
// connection's search_path is set to that schema alone, so the migrations
// create and find fencekit's tables there. Open does no I/O; the schema must
// exist when the migrations run. The caller closes the returned DB.
func Open(databaseURL, schema string) (*sql.DB, error) {
	if databaseURL == "" {
		return nil, fmt.Errorf("%w: empty database URL", ErrInvalid)
	}
	cfg, err := pgx.ParseConfig(databaseURL)
	if err != nil {
		// pgx redacts recognizable passwords in its parse errors.
		return nil, fmt.Errorf("%w: bad database URL: %w", ErrInvalid, err)
	}
	if schema != "" {
		if err := checkIdent("schema", schema); err != nil {
			return nil, err
		}
		cfg.RuntimeParams["search_path"] = pgx.Identifier{schema}.Sanitize()
	}
	return stdlib.OpenDB(*cfg), nil
}

// NewProvider returns a goose Provider over fencekit's embedded migrations
// for db, configured with fencekit's own version table, goose's global
// registry disabled, and an advisory lock derived from the connection's
// current schema. ctx bounds the one query that reads the current schema.
// Use it for the goose operations that Up, Down and Status do not cover.
// Do not call the Provider's Close unless you mean to close db: goose's
// Close closes the database it was given.
//
// WithDialect(DialectMySQL) or WithDialect(DialectSQLite) gives a Provider
// of those migrations instead, with the same version table and goose's
// global registry disabled, and without I/O. goose has no session lock for
// these databases: the migrations are idempotent (CREATE TABLE IF NOT
// EXISTS), so two concurrent runs end in the same state, and one of them
// may fail on goose's version row.
func NewProvider(ctx context.Context, db *sql.DB, opts ...Option) (*goose.Provider, error) {
	if db == nil {
		return nil, fmt.Errorf("%w: nil database", ErrInvalid)
	}
	o, err := applyOptions(opts)
	if err != nil {
		return nil, err
	}
	if o.Dialect != DialectPostgres {
		return newSQLProvider(db, o.Dialect)
	}
	var schema sql.NullString
	if err := db.QueryRowContext(ctx, "SELECT current_schema()").Scan(&schema); err != nil {
		return nil, fmt.Errorf("migrations: read current schema: %w", err)
	}
	if !schema.Valid {
		return nil, noSchema(ctx, db)
	}
	locker, err := lock.NewPostgresSessionLocker(
		lock.WithLockID(lockID(schema.String)),
		lock.WithLockTimeout(1, 300), // retry every second for 5 minutes
		lock.WithUnlockTimeout(1, 60),
	)
	if err != nil {
		return nil, fmt.Errorf("migrations: session locker: %w", err)
	}
	fsys, err := dialectFS(DialectPostgres)
	if err != nil {
		return nil, err
	}
	p, err := goose.NewProvider(goose.DialectPostgres, db, fsys,
		goose.WithTableName(VersionTable),
		goose.WithDisableGlobalRegistry(true),
		goose.WithSessionLocker(locker),
	)
	if err != nil {
		return nil, fmt.Errorf("migrations: goose provider: %w", err)
	}
	return p, nil
}

// lockID is the advisory lock key for migrations of one schema, so that
// runs on different schemas do not wait for each other.
func lockID(schema string) int64 {
	h := fnv.New64a()
	h.Write([]byte("fencekit migrations\x00"))
	h.Write([]byte(schema))
	return int64(h.Sum64())
}

// Up applies every pending fencekit migration to db's current schema and
// returns what it applied (nothing when up to date). ctx bounds the whole
// run, including the wait for another run's lock (at most 5 minutes).
// With WithDialect it applies the migrations of MySQL/MariaDB (to the
// connection's current database) or SQLite (to main).
func Up(ctx context.Context, db *sql.DB, opts ...Option) ([]*goose.MigrationResult, error) {
	p, err := NewProvider(ctx, db, opts...)
	if err != nil {
		return nil, err
	}
	res, err := p.Up(ctx)
	if err != nil {
		if o, _ := applyOptions(opts); o.Dialect != DialectPostgres {
			return res, fmt.Errorf("migrations: up (%s): %w", o.Dialect, err)
		}
		return res, fmt.Errorf("migrations: up: %w", err)
	}
	return res, nil
}

// Down rolls back every fencekit migration in db's current schema: it drops
// fencekit's tables and with them every stored resource token. Tokens
// issued afterwards are accepted from zero again, so run it only when no
// fenced writer is left. ctx bounds the whole run. WithDialect selects
// the migrations of MySQL/MariaDB or SQLite, as for Up.
func Down(ctx context.Context, db *sql.DB, opts ...Option) ([]*goose.MigrationResult, error) {
	return DownTo(ctx, db, 0, opts...)
}

// DownTo rolls back fencekit migrations newer than version (0 rolls back
// all of them). ctx bounds the whole run. WithDialect selects the
// migrations of MySQL/MariaDB or SQLite, as for Up.
func DownTo(ctx context.Context, db *sql.DB, version int64, opts ...Option) ([]*goose.MigrationResult, error) {
	if version < 0 {
		return nil, fmt.Errorf("%w: negative version %d", ErrInvalid, version)
	}
	p, err := NewProvider(ctx, db, opts...)
	if err != nil {
		return nil, err
	}
	res, err := p.DownTo(ctx, version)
	if err != nil {
		return res, fmt.Errorf("migrations: down to %d: %w", version, err)
	}
	return res, nil
}

// noSchema is ErrNoSchema with the search_path that names no existing
// schema.
func noSchema(ctx context.Context, db *sql.DB) error {
	var path string
	if err := db.QueryRowContext(ctx, "SELECT pg_catalog.current_setting('search_path')").Scan(&path); err != nil {
		return ErrNoSchema
	}
	return fmt.Errorf("%w: search_path is %s, and none of its schemas exists: create the schema, or choose an existing one", ErrNoSchema, path)
}

// Status reports each fencekit migration and whether it is applied in db's
// current schema. It only reads: unlike goose's Provider.Status, it
// creates no version table and takes no lock, so it works on a read-only
// connection (a replica, default_transaction_read_only, a role with only
// SELECT) and while another run migrates. Every migration is pending when
// the version table does not exist. It reads in one READ ONLY transaction,
// so the answer is one snapshot. ctx bounds the queries.
//
// With WithDialect it reports the migrations of MySQL/MariaDB or SQLite,
// just as read-only: in one read-only transaction where the database has
// them (MySQL: START TRANSACTION READ ONLY; SQLite: a deferred transaction
// that only reads).
func Status(ctx context.Context, db *sql.DB, opts ...Option) ([]*goose.MigrationStatus, error) {
	p, err := NewProvider(ctx, db, opts...)
	if err != nil {
		return nil, err
	}
	if o, _ := applyOptions(opts); o.Dialect != DialectPostgres {
		return sqlStatus(ctx, db, p, o.Dialect)
	}
	store, err := database.NewStore(database.DialectPostgres, VersionTable)
	if err != nil {
		return nil, fmt.Errorf("migrations: status: %w", err)
	}
	tx, err := db.BeginTx(ctx, &sql.TxOptions{ReadOnly: true})
	if err != nil {
		return nil, fmt.Errorf("migrations: status: %w", err)
	}
	defer tx.Rollback() //nolint:errcheck // read only: nothing to keep
	var tracked bool
	if err := tx.QueryRowContext(ctx,
		`SELECT pg_catalog.to_regclass(pg_catalog.quote_ident(pg_catalog.current_schema()) || '.' || pg_catalog.quote_ident($1)) IS NOT NULL`,
		VersionTable).Scan(&tracked); err != nil {
		return nil, fmt.Errorf("migrations: status: look up %s: %w", VersionTable, err)
	}
	var st []*goose.MigrationStatus
	for _, src := range p.ListSources() {
		s := &goose.MigrationStatus{Source: src, State: goose.StatePending}
		if tracked {
			res, err := store.GetMigration(ctx, tx, src.Version)
			switch {
			case errors.Is(err, database.ErrVersionNotFound):
			case err != nil:
				return nil, fmt.Errorf("migrations: status: version %d: %w", src.Version, err)
			default:
				s.State, s.AppliedAt = goose.StateApplied, res.Timestamp
			}
		}
		st = append(st, s)
	}
	return st, nil
}
