package migrations

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/fencekit/fencekit/internal/lockversion"
	"github.com/fencekit/fencekit/internal/pgident"
)

// LockVersionColumn is the column row-level fencing reads and writes.
const LockVersionColumn = lockversion.Column

// LockVersionConstraint is the name of the CHECK (lock_version >= 0)
// constraint the lock_version migration adds. CHECK constraint names are
// unique per table, so every fenced table uses the same name.
const LockVersionConstraint = "fencekit_lock_version_nonnegative"

// TableName names a table exactly as PostgreSQL stores it (no case folding).
// An empty Schema means the table is found through the search_path. With
// WithDialect, Schema is the MySQL database (empty: the connection's
// current one) or the SQLite schema (empty: main), and the names are used
// exactly as given, without PostgreSQL's limits (Validate).
type TableName struct {
	Schema string
	Name   string
}

// Validate reports an error wrapping ErrInvalid when the name cannot be
// used: an empty table name, or a part that is longer than 63 bytes, is not
// valid UTF-8 or contains a NUL or other control character.
func (t TableName) Validate() error {
	var errs []error
	if t.Schema != "" {
		errs = append(errs, checkIdent("schema", t.Schema))
	}
	errs = append(errs, checkIdent("table", t.Name))
	return errors.Join(errs...)
}

// String returns the name quoted for SQL, schema-qualified when Schema is
// set: "shop"."orders".
func (t TableName) String() string {
	if t.Schema == "" {
		return pgx.Identifier{t.Name}.Sanitize()
	}
	return pgx.Identifier{t.Schema, t.Name}.Sanitize()
}

// ParseTableName parses "table" or "schema.table" the way PostgreSQL reads
// a name in SQL: unquoted parts are folded to lower case (ASCII letters
// only), double-quoted parts are kept exactly ("My Schema"."Orders", with ""
// for a quote inside). It returns an error wrapping ErrInvalid for an empty
// part, more than two parts or an unterminated quote.
func ParseTableName(s string) (TableName, error) {
	var parts []string
	rest := s
	for {
		var part string
		if strings.HasPrefix(rest, `"`) {
			var b strings.Builder
			i := 1
			closed := false
			for i < len(rest) {
				if rest[i] == '"' {
					if i+1 < len(rest) && rest[i+1] == '"' {
						b.WriteByte('"')
						i += 2
						continue
					}
					closed = true
					i++
					break
				}
				b.WriteByte(rest[i])
				i++
			}
			if !closed {
				return TableName{}, fmt.Errorf("%w: table name %q: unterminated quote", ErrInvalid, s)
			}
			part, rest = b.String(), rest[i:]
			if part == "" {
				return TableName{}, fmt.Errorf("%w: table name %q: empty quoted identifier", ErrInvalid, s)
			}
		} else {
			end := strings.IndexByte(rest, '.')
			if end < 0 {
				end = len(rest)
			}
			part, rest = rest[:end], rest[end:]
			if strings.Contains(part, `"`) {
				return TableName{}, fmt.Errorf("%w: table name %q: misplaced quote", ErrInvalid, s)
			}
			if part == "" {
				return TableName{}, fmt.Errorf("%w: table name %q: empty name", ErrInvalid, s)
			}
			part = asciiLower(part)
		}
		parts = append(parts, part)
		if rest == "" {
			break
		}
		if rest[0] != '.' {
			return TableName{}, fmt.Errorf("%w: table name %q: expected '.' after a quoted name", ErrInvalid, s)
		}
		rest = rest[1:]
		if rest == "" {
			return TableName{}, fmt.Errorf("%w: table name %q: empty name after '.'", ErrInvalid, s)
		}
	}
	var t TableName
	switch len(parts) {
	case 1:
		t = TableName{Name: parts[0]}
	case 2:
		t = TableName{Schema: parts[0], Name: parts[1]}
	default:
		return TableName{}, fmt.Errorf("%w: table name %q: want table or schema.table", ErrInvalid, s)
	}
	if err := t.Validate(); err != nil {
		return TableName{}, err
	}
	return t, nil
}

func asciiLower(s string) string {
	b := []byte(s)
	for i, c := range b {
		if 'A' <= c && c <= 'Z' {
			b[i] = c + ('a' - 'A')
		}
	}
	return string(b)
}

// checkIdent validates one identifier (see pgident.Check).
func checkIdent(kind, s string) error { return pgident.Check(ErrInvalid, kind, s) }

// lockVersionUp is the Up section's one statement: a DO block that adds the
// column and the check if they are missing, and fails if a lock_version
// column exists with another type than bigint. The table appears in it
// only as an identifier quoted by pgx (a DO block takes no parameters);
// its type is read with the expression package sqlguard checks on every
// write (internal/lockversion), and the block holds no other value.
func lockVersionUp(t TableName) string {
	ident := t.String()
	body := `
BEGIN
    ALTER TABLE ` + ident + ` ADD COLUMN IF NOT EXISTS ` + lockversion.Column + ` ` + lockversion.Type + ` NOT NULL DEFAULT 0;
    IF NOT (` + lockversion.IsBigint(ident) + `) THEN
        RAISE EXCEPTION 'fencekit: column lock_version exists with type %, want ` + lockversion.Type + `',
            pg_catalog.format_type(` + lockversion.TypeOf(ident) + `, NULL);
    END IF;
    ALTER TABLE ` + ident + ` ALTER COLUMN ` + lockversion.Column + ` SET NOT NULL;
    BEGIN
        ALTER TABLE ` + ident + ` ADD CONSTRAINT ` + LockVersionConstraint + ` CHECK (` + lockversion.Column + ` >= 0);
    EXCEPTION WHEN duplicate_object THEN
        NULL; -- added by an earlier run
    END;
END
`
	// The identifier may contain anything but control characters, so
	// the block's dollar quote is chosen not to occur in it.
	tag := "$fencekit$"
	for i := 1; strings.Contains(body, tag); i++ {
		tag = fmt.Sprintf("$fencekit%d$", i)
	}
	return "DO " + tag + body + tag
}

// lockVersionDown removes the check and the column.
func lockVersionDown(t TableName) []string {
	ident := t.String()
	return []string{
		"ALTER TABLE " + ident + " DROP CONSTRAINT IF EXISTS " + LockVersionConstraint,
		"ALTER TABLE " + ident + " DROP COLUMN IF EXISTS " + lockversion.Column,
	}
}

// LockVersionMigration returns the text of a goose SQL migration that adds
// lock_version to table t: Up adds the column (BIGINT NOT NULL DEFAULT 0)
// if it is missing, fails if a lock_version column exists with another
// type than bigint, makes an existing bigint column NOT NULL (which fails
// if it holds NULLs), and adds a CHECK (lock_version >= 0) constraint
// named LockVersionConstraint if it is missing; Down drops both. Up and
// Down may each run more than once. It does no I/O; it returns an error
// wrapping ErrInvalid for a bad name.
//
// With WithDialect(DialectMySQL) or WithDialect(DialectSQLite) Up adds
// lock_version BIGINT UNSIGNED NOT NULL DEFAULT 0 (MySQL/MariaDB: every
// token exactly) or INTEGER NOT NULL DEFAULT 0 with a CHECK that keeps it a
// non-negative integer (SQLite), and Down drops it. Unlike the PostgreSQL
// one it is not idempotent (neither MySQL 8 nor SQLite has ADD COLUMN IF
// NOT EXISTS): goose runs it once. The name may not be empty, nor hold a
// NUL or a line break (ErrInvalid).
//
// goose reads every line that starts with "--" and contains "+goose" as an
// annotation, and ends a statement outside StatementBegin/StatementEnd at
// a line whose last word before any "--" ends in ";". So the table's name
// appears in no comment, and every statement, each of which names the
// table, is wrapped in StatementBegin/StatementEnd: whatever the name holds
// (no line break: Validate refuses control characters), goose reads the
// file as written. The file name says which table it is for.
func LockVersionMigration(t TableName, opts ...Option) (string, error) {
	o, err := applyOptions(opts)
	if err != nil {
		return "", err
	}
	if o.Dialect != DialectPostgres {
		return sqlLockVersionMigration(o.Dialect, t.Schema, t.Name)
	}
	if err := t.Validate(); err != nil {
		return "", err
	}
	var b strings.Builder
	b.WriteString("-- Adds fencekit's lock_version column to the table named below (generated by fencekit).\n")
	b.WriteString("-- Once the table is fenced, every write to it must go through sqlguard:\n")
	b.WriteString("-- a plain UPDATE is not fenced and lets a stale lock holder overwrite newer rows.\n")
	statement := func(stmt string) {
		b.WriteString("-- +goose StatementBegin\n")
		b.WriteString(stmt)
		b.WriteString(";\n-- +goose StatementEnd\n")
	}
	b.WriteString("\n-- +goose Up\n")
	statement(lockVersionUp(t))
	b.WriteString("\n-- +goose Down\n")
	for _, stmt := range lockVersionDown(t) {
		statement(stmt)
	}
	return b.String(), nil
}

// ErrMigrationExists is returned by WriteLockVersionMigration when dir
// already holds a lock_version migration for the same table: a second one
// would only repeat the first (goose runs both, and rolling one back would
// drop the column the other added). Nothing is written.
var ErrMigrationExists = errors.New("migrations: a lock_version migration for this table already exists")

// WriteLockVersionMigration writes LockVersionMigration(t) into dir as
// <version>_fencekit_lock_version_<table>.sql (see WriteMigrationFile for
// how the version is chosen) and returns the file's path. It never
// overwrites a file, and fails with an error matching ErrMigrationExists
// (naming the file) if dir already holds this table's lock_version
// migration (a *_fencekit_lock_version_*.sql file with the same text).
// With WithDialect it writes that dialect's migration, named
// <version>_fencekit_lock_version_<db>_<table>.sql.
func WriteLockVersionMigration(dir string, t TableName, version time.Time, opts ...Option) (string, error) {
	o, err := applyOptions(opts)
	if err != nil {
		return "", err
	}
	text, err := LockVersionMigration(t, opts...)
	if err != nil {
		return "", err
	}
	what := t.String()
	if o.Dialect != DialectPostgres {
		what = t.Name
		if t.Schema != "" {
			what = t.Schema + "." + t.Name
		}
	}
	return writeLockVersionFile(dir, fileSafe(t), what, text, version)
}

// writeLockVersionFile writes one dialect's lock_version migration text for
// the table named what (in file names: word).
func writeLockVersionFile(dir, word, what, text string, version time.Time) (string, error) {
	if dir == "" {
		return "", fmt.Errorf("%w: empty directory", ErrInvalid)
	}
	earlier, _ := filepath.Glob(filepath.Join(dir, "*_fencekit_lock_version_*.sql"))
	for _, path := range earlier {
		if b, err := os.ReadFile(path); err == nil && string(b) == text {
			return "", fmt.Errorf("%w: %s is %s's (nothing written)", ErrMigrationExists, path, what)
		}
	}
	return WriteMigrationFile(dir, "fencekit_lock_version_"+word, text, version)
}

// maxVersionSteps bounds how many seconds past the asked version
// WriteMigrationFile looks for a free one.
const maxVersionSteps = 3600

// WriteMigrationFile writes text into dir as the goose SQL migration
// <version>_<name>.sql and returns its path. The version is goose's
// timestamp format (YYYYMMDDHHMMSS, UTC) of at, or, when a file in dir
// already has that version (another migration generated in the same
// second, by this or an earlier run), the next second that no file in dir
// has: versions never collide, so goose never refuses the directory. It
// never overwrites a file (the file is created exclusively). Errors: the
// file system's, wrapped; ErrInvalid for an empty dir or name; an error
// when no version is free within an hour of at.
func WriteMigrationFile(dir, name, text string, at time.Time) (string, error) {
	if dir == "" || name == "" {
		return "", fmt.Errorf("%w: empty directory or name", ErrInvalid)
	}
	at = at.UTC().Truncate(time.Second)
	for i := 0; i < maxVersionSteps; i++ {
		v := at.Add(time.Duration(i) * time.Second).Format("20060102150405")
		if taken, _ := filepath.Glob(filepath.Join(dir, v+"_*")); len(taken) > 0 {
			continue
		}
		path := filepath.Join(dir, v+"_"+name+".sql")
		f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o644)
		if errors.Is(err, os.ErrExist) {
			continue
		}
		if err != nil {
			return "", fmt.Errorf("migrations: %w", err)
		}
		if _, err := f.WriteString(text); err != nil {
			f.Close()
			os.Remove(path)
			return "", fmt.Errorf("migrations: write %s: %w", path, err)
		}
		if err := f.Close(); err != nil {
			os.Remove(path)
			return "", fmt.Errorf("migrations: write %s: %w", path, err)
		}
		// Another writer may have taken the same version with another
		// name between the check and the create: all but the first name
		// in sort order give way and take a later version.
		if taken, _ := filepath.Glob(filepath.Join(dir, v+"_*")); len(taken) > 1 && taken[0] != path {
			os.Remove(path)
			continue
		}
		return path, nil
	}
	return "", fmt.Errorf("migrations: no free migration version in %s within %v of %s", dir, maxVersionSteps*time.Second, at.Format("20060102150405"))
}

// fileSafe turns a table name into [a-z0-9_]+ for a file name.
func fileSafe(t TableName) string {
	s := t.Name
	if t.Schema != "" {
		s = t.Schema + "_" + t.Name
	}
	var b strings.Builder
	for _, r := range asciiLower(s) {
		if ('a' <= r && r <= 'z') || ('0' <= r && r <= '9') {
			b.WriteRune(r)
		} else {
			b.WriteByte('_')
		}
	}
	out := b.String()
	if len(out) > 48 {
		out = out[:48]
	}
	return out
}

// TableExists reports whether t names an existing table (ordinary or
// partitioned) that the connection can see. ctx bounds the query.
func TableExists(ctx context.Context, db *sql.DB, t TableName) (bool, error) {
	if db == nil {
		return false, fmt.Errorf("%w: nil database", ErrInvalid)
	}
	if err := t.Validate(); err != nil {
		return false, err
	}
	var exists bool
	err := db.QueryRowContext(ctx,
		`SELECT EXISTS (SELECT 1 FROM pg_catalog.pg_class WHERE oid = to_regclass($1) AND relkind IN ('r', 'p'))`,
		t.String()).Scan(&exists)
	if err != nil {
		return false, fmt.Errorf("migrations: look up table %s: %w", t, err)
	}
	return exists, nil
}

// HasLockVersion reports whether table t has a lock_version column (of any
// type; ApplyLockVersion refuses one that is not bigint). It returns an
// error wrapping ErrTableNotFound when t does not exist. ctx bounds the
// query.
func HasLockVersion(ctx context.Context, db *sql.DB, t TableName) (bool, error) {
	st, err := LockVersionOf(ctx, db, t)
	return st.Column, err
}

// LockVersionState is what table t has of what ApplyLockVersion sets up.
type LockVersionState struct {
	Column  bool // a lock_version column (of any type)
	NotNull bool // ... declared NOT NULL
	Checked bool // the LockVersionConstraint check exists
}

// Complete reports whether ApplyLockVersion would change nothing (for a
// bigint column).
func (s LockVersionState) Complete() bool { return s.Column && s.NotNull && s.Checked }

// LockVersionOf reads what table t has of lock_version (two queries). It
// returns an error wrapping ErrTableNotFound when t does not exist. ctx
// bounds the queries.
func LockVersionOf(ctx context.Context, db *sql.DB, t TableName) (LockVersionState, error) {
	ok, err := TableExists(ctx, db, t)
	if err != nil {
		return LockVersionState{}, err
	}
	if !ok {
		return LockVersionState{}, fmt.Errorf("%w: %s", ErrTableNotFound, t)
	}
	var st LockVersionState
	err = db.QueryRowContext(ctx, `SELECT
		EXISTS (SELECT 1 FROM pg_catalog.pg_attribute WHERE attrelid = pg_catalog.to_regclass($1) AND attname = $2 AND NOT attisdropped),
		EXISTS (SELECT 1 FROM pg_catalog.pg_attribute WHERE attrelid = pg_catalog.to_regclass($1) AND attname = $2 AND NOT attisdropped AND attnotnull),
		EXISTS (SELECT 1 FROM pg_catalog.pg_constraint WHERE conrelid = pg_catalog.to_regclass($1) AND conname = $3)`,
		t.String(), LockVersionColumn, LockVersionConstraint).Scan(&st.Column, &st.NotNull, &st.Checked)
	if err != nil {
		return LockVersionState{}, fmt.Errorf("migrations: look up %s.%s: %w", t, LockVersionColumn, err)
	}
	return st, nil
}

// ApplyLockVersion runs the Up section of LockVersionMigration(t) on db now,
// outside goose's version tracking: afterwards t has lock_version (existing
// rows 0) and its check. Running it again changes nothing. It returns an
// error wrapping ErrTableNotFound when t does not exist. ctx bounds the
// check and the ALTER TABLE, which takes an ACCESS EXCLUSIVE lock on t and,
// when it adds the check, scans the table once.
//
// With WithDialect it adds lock_version to a MySQL/MariaDB or SQLite table
// as that dialect's LockVersionMigration does, unless the column is there
// already; a lock_version column of another type is refused (ErrInvalid:
// the guard would refuse to write through it). The name may not be empty
// nor hold a NUL (ErrInvalid).
func ApplyLockVersion(ctx context.Context, db *sql.DB, t TableName, opts ...Option) error {
	o, err := applyOptions(opts)
	if err != nil {
		return err
	}
	if o.Dialect != DialectPostgres {
		return applySQLLockVersion(ctx, db, o.Dialect, t.Schema, t.Name)
	}
	ok, err := TableExists(ctx, db, t)
	if err != nil {
		return err
	}
	if !ok {
		return fmt.Errorf("%w: %s", ErrTableNotFound, t)
	}
	if _, err := db.ExecContext(ctx, lockVersionUp(t)); err != nil {
		return fmt.Errorf("migrations: add lock_version to %s: %w", t, err)
	}
	return nil
}

// RemoveLockVersion runs the Down section of LockVersionMigration(t) on db
// now: it drops the check and the lock_version column, and with them the
// fencing of t's rows. It returns an error wrapping ErrTableNotFound when t
// does not exist. ctx bounds the check and the statements.
func RemoveLockVersion(ctx context.Context, db *sql.DB, t TableName) error {
	ok, err := TableExists(ctx, db, t)
	if err != nil {
		return err
	}
	if !ok {
		return fmt.Errorf("%w: %s", ErrTableNotFound, t)
	}
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		return fmt.Errorf("migrations: remove lock_version from %s: %w", t, err)
	}
	defer tx.Rollback() //nolint:errcheck // no-op after Commit
	for _, stmt := range lockVersionDown(t) {
		if _, err := tx.ExecContext(ctx, stmt); err != nil {
			return fmt.Errorf("migrations: remove lock_version from %s: %w", t, err)
		}
	}
	if err := tx.Commit(); err != nil {
		return fmt.Errorf("migrations: remove lock_version from %s: %w", t, err)
	}
	return nil
}
