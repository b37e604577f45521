package migrations

import (
	"context"
	"database/sql"
	"fmt"
	"io/fs"
	"strings"

	"github.com/pressly/goose/v3"
	"github.com/pressly/goose/v3/database"
)

// MySQL and SQLite (package dbguard) have migrations of their own, in the
// same goose format and with the same version table name, embedded beside
// the PostgreSQL ones. They run over any *sql.DB: this package imports no
// MySQL or SQLite driver, so a program that uses one of them opens the
// database with its own driver (github.com/go-sql-driver/mysql,
// modernc.org/sqlite) and inherits nothing of the other.

// Dialects the functions of this package take, through WithDialect:
// goose's own names.
const (
	DialectPostgres = goose.DialectPostgres
	DialectMySQL    = goose.DialectMySQL
	DialectSQLite   = goose.DialectSQLite3
)

// Options are what the functions of this package take besides their
// arguments. The zero value means PostgreSQL.
type Options struct {
	// Dialect is the database the migrations are for: DialectPostgres
	// (the default, when empty), DialectMySQL (MySQL and MariaDB) or
	// DialectSQLite. Another dialect makes every function return an error
	// matching ErrInvalid, before any I/O.
	Dialect goose.Dialect
}

// Option sets a field of Options.
type Option func(*Options)

// WithDialect sets Options.Dialect: the functions of this package then
// work on MySQL/MariaDB (DialectMySQL) or SQLite (DialectSQLite) instead of
// PostgreSQL.
func WithDialect(d goose.Dialect) Option { return func(o *Options) { o.Dialect = d } }

// applyOptions applies opts to the defaults and checks the dialect.
func applyOptions(opts []Option) (Options, error) {
	var o Options
	for _, f := range opts {
		if f != nil {
			f(&o)
		}
	}
	switch o.Dialect {
	case "":
		o.Dialect = DialectPostgres
	case DialectPostgres, DialectMySQL, DialectSQLite:
	default:
		return o, fmt.Errorf("%w: no fencekit migrations for dialect %q (want %q, %q or %q)",
			ErrInvalid, o.Dialect, DialectPostgres, DialectMySQL, DialectSQLite)
	}
	return o, nil
}

// dialectFS returns the embedded migrations of a checked dialect.
func dialectFS(dialect goose.Dialect) (fs.FS, error) {
	dir := "sql"
	switch dialect {
	case DialectMySQL:
		dir = "sqlmysql"
	case DialectSQLite:
		dir = "sqlsqlite"
	}
	return fs.Sub(embedded, dir)
}

// newSQLProvider is NewProvider for MySQL/MariaDB and SQLite.
func newSQLProvider(db *sql.DB, dialect goose.Dialect) (*goose.Provider, error) {
	fsys, err := dialectFS(dialect)
	if err != nil {
		return nil, err
	}
	p, err := goose.NewProvider(dialect, db, fsys,
		goose.WithTableName(VersionTable),
		goose.WithDisableGlobalRegistry(true),
	)
	if err != nil {
		return nil, fmt.Errorf("migrations: goose provider: %w", err)
	}
	return p, nil
}

// sqlStatus is Status for MySQL/MariaDB and SQLite, over p, a provider of
// dialect's migrations.
func sqlStatus(ctx context.Context, db *sql.DB, p *goose.Provider, dialect goose.Dialect) ([]*goose.MigrationStatus, error) {
	var exists string
	var storeDialect database.Dialect
	switch dialect {
	case DialectMySQL:
		storeDialect = database.DialectMySQL
		exists = `SELECT COUNT(*) FROM information_schema.TABLES WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = ?`
	default:
		storeDialect = database.DialectSQLite3
		exists = `SELECT COUNT(*) FROM sqlite_schema WHERE type = 'table' AND name = ?`
	}
	store, err := database.NewStore(storeDialect, VersionTable)
	if err != nil {
		return nil, fmt.Errorf("migrations: status: %w", err)
	}
	tx, err := db.BeginTx(ctx, &sql.TxOptions{ReadOnly: dialect == DialectMySQL})
	if err != nil {
		return nil, fmt.Errorf("migrations: status: %w", err)
	}
	defer tx.Rollback() //nolint:errcheck // read only: nothing to keep
	var n int
	if err := tx.QueryRowContext(ctx, exists, VersionTable).Scan(&n); err != nil {
		return nil, fmt.Errorf("migrations: status: %w", err)
	}
	applied := map[int64]bool{}
	if n > 0 {
		ms, err := store.ListMigrations(ctx, tx)
		if err != nil {
			return nil, fmt.Errorf("migrations: status: %w", err)
		}
		for _, m := range ms {
			if m.IsApplied {
				applied[m.Version] = true
			}
		}
	}
	var out []*goose.MigrationStatus
	for _, src := range p.ListSources() {
		st := &goose.MigrationStatus{Source: src, State: goose.StatePending}
		if applied[src.Version] {
			st.State = goose.StateApplied
		}
		out = append(out, st)
	}
	return out, nil
}

// lockVersionDDL returns the statement that adds lock_version to table
// (already quoted and qualified) for dialect: BIGINT UNSIGNED NOT NULL
// DEFAULT 0 on MySQL (every token exactly), INTEGER NOT NULL DEFAULT 0
// with a CHECK that keeps it an integer on SQLite.
func lockVersionDDL(dialect goose.Dialect, table string) (string, error) {
	switch dialect {
	case DialectMySQL:
		return "ALTER TABLE " + table + " ADD COLUMN lock_version BIGINT UNSIGNED NOT NULL DEFAULT 0", nil
	case DialectSQLite:
		return "ALTER TABLE " + table + ` ADD COLUMN lock_version INTEGER NOT NULL DEFAULT 0 CHECK (typeof(lock_version) = 'integer' AND lock_version >= 0)`, nil
	}
	return "", fmt.Errorf("%w: dialect %q", ErrInvalid, dialect)
}

// quoteTable quotes db.table (db may be empty) for dialect.
func quoteTable(dialect goose.Dialect, db, table string) string {
	q := func(s string) string { return `"` + strings.ReplaceAll(s, `"`, `""`) + `"` }
	if dialect == DialectMySQL {
		q = func(s string) string { return "`" + strings.ReplaceAll(s, "`", "``") + "`" }
	}
	if db == "" {
		return q(table)
	}
	return q(db) + "." + q(table)
}

// applySQLLockVersion is ApplyLockVersion for MySQL/MariaDB and SQLite: it
// adds lock_version to table (in database db, or the connection's current
// one when db is empty) unless it is there already; a lock_version column
// of another type is refused (the guard would refuse to write through it).
func applySQLLockVersion(ctx context.Context, conn *sql.DB, dialect goose.Dialect, db, table string) error {
	if conn == nil || table == "" || strings.IndexByte(table+db, 0) >= 0 {
		return fmt.Errorf("%w: nil database or empty or NUL-containing table name", ErrInvalid)
	}
	ddl, err := lockVersionDDL(dialect, quoteTable(dialect, db, table))
	if err != nil {
		return err
	}
	typ, exists, err := sqlLockVersionType(ctx, conn, dialect, db, table)
	if err != nil {
		return err
	}
	switch {
	case !exists:
		return fmt.Errorf("%w: %s", ErrTableNotFound, table)
	case typ == "":
		if _, err := conn.ExecContext(ctx, ddl); err != nil {
			return fmt.Errorf("migrations: add lock_version to %s: %w", table, err)
		}
		return nil
	case dialect == DialectMySQL && !strings.Contains(strings.ToLower(typ), "bigint") || dialect == DialectMySQL && !strings.Contains(strings.ToLower(typ), "unsigned"):
		return fmt.Errorf("%w: %s.lock_version is %s, want BIGINT UNSIGNED: change it before fencing the table", ErrInvalid, table, typ)
	case dialect == DialectSQLite && !strings.Contains(strings.ToUpper(typ), "INT"):
		return fmt.Errorf("%w: %s.lock_version is %s, want INTEGER: change it before fencing the table", ErrInvalid, table, typ)
	}
	return nil
}

// sqlLockVersionType returns lock_version's declared type ("" when the
// column is missing) and whether the table exists.
func sqlLockVersionType(ctx context.Context, conn *sql.DB, dialect goose.Dialect, db, table string) (string, bool, error) {
	var n int
	var typ string
	var err error
	if dialect == DialectMySQL {
		err = conn.QueryRowContext(ctx, `SELECT COUNT(*), COALESCE(MAX(CASE WHEN COLUMN_NAME = 'lock_version' THEN COLUMN_TYPE END), '')
			FROM information_schema.COLUMNS WHERE TABLE_SCHEMA = COALESCE(NULLIF(?, ''), DATABASE()) AND TABLE_NAME = ?`, db, table).Scan(&n, &typ)
	} else {
		if db == "" {
			db = "main"
		}
		err = conn.QueryRowContext(ctx, `SELECT COUNT(*), COALESCE(MAX(CASE WHEN name = 'lock_version' THEN coalesce(nullif(type, ''), 'BLOB') END), '')
			FROM pragma_table_info(?, ?)`, table, db).Scan(&n, &typ)
	}
	if err != nil {
		return "", false, fmt.Errorf("migrations: read %s's columns: %w", table, err)
	}
	return typ, n > 0, nil
}

// sqlLockVersionMigration is LockVersionMigration for MySQL/MariaDB and
// SQLite: a goose migration that adds lock_version to table (in database
// db, or the connection's current one when db is empty).
func sqlLockVersionMigration(dialect goose.Dialect, db, table string) (string, error) {
	if table == "" || strings.ContainsAny(table+db, "\x00\n\r") {
		return "", fmt.Errorf("%w: empty table name, or one with NUL or a line break", ErrInvalid)
	}
	q := quoteTable(dialect, db, table)
	up, err := lockVersionDDL(dialect, q)
	if err != nil {
		return "", err
	}
	return "-- Adds the lock_version column that row-level fencing (package dbguard)\n" +
		"-- needs to " + q + ". Generated by fencekit migrate add-lock-version.\n" +
		"-- Write " + q + " only through dbguard.Table once fenced.\n\n" +
		"-- +goose Up\n" + up + ";\n\n-- +goose Down\nALTER TABLE " + q + " DROP COLUMN lock_version;\n", nil
}
