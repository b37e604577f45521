package dbguard

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"
	"math"
	"reflect"
	"strings"

	"github.com/fencekit/fencekit/fence"
	"github.com/fencekit/fencekit/internal/names"
	"github.com/fencekit/fencekit/internal/rowguard"
)

// Dialect selects the SQL a guard speaks. The guard imports no driver:
// open the database with the driver of your choice (the dialect's
// documentation names the tested ones) and pass the dialect by value.
type Dialect int

const (
	// MySQL is MySQL 8 and MariaDB 10.5 or later, through
	// github.com/go-sql-driver/mysql (tested against MariaDB 10.11, the
	// server Debian 12 ships; Oracle MySQL was not available to test).
	// The lock_version column and the resource table's token are BIGINT
	// UNSIGNED, so every token (up to 2^64-1) is stored exactly. Driver
	// errors are recognized by the driver's *mysql.MySQLError (its
	// exported Number), found without importing the driver.
	MySQL Dialect = iota + 1
	// SQLite is SQLite 3.35 or later, through modernc.org/sqlite (no
	// cgo; tested with v1.62.0). SQLite's integers are signed 64-bit, so
	// a token above 2^63-1 is refused before any I/O (fence.ErrInvalidToken).
	// Driver errors are recognized by their Code() int method, which
	// modernc.org/sqlite's *sqlite.Error has.
	SQLite
)

// String returns "mysql" or "sqlite".
func (d Dialect) String() string {
	switch d {
	case MySQL:
		return "mysql"
	case SQLite:
		return "sqlite"
	}
	return fmt.Sprintf("Dialect(%d)", int(d))
}

func (d Dialect) valid() bool { return d == MySQL || d == SQLite }

// DBTX is what a Table needs to run a statement: the shape that *sql.DB,
// *sql.Conn and *sql.Tx all have. Pass a *sql.Tx to make a fenced write
// part of your transaction.
type DBTX interface {
	ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error)
	QueryContext(ctx context.Context, query string, args ...any) (*sql.Rows, error)
	QueryRowContext(ctx context.Context, query string, args ...any) *sql.Row
}

// TxBeginner begins a transaction: *sql.DB and *sql.Conn satisfy it.
type TxBeginner interface {
	BeginTx(ctx context.Context, opts *sql.TxOptions) (*sql.Tx, error)
}

var (
	_ DBTX       = (*sql.DB)(nil)
	_ DBTX       = (*sql.Conn)(nil)
	_ DBTX       = (*sql.Tx)(nil)
	_ TxBeginner = (*sql.DB)(nil)
	_ TxBeginner = (*sql.Conn)(nil)
)

// Column is one column of a row and the value to write to it: Name, and
// Value, passed to the driver as a bind parameter, never formatted into
// SQL. It is the same type as sqlguard.Column.
type Column = rowguard.Column

// Col returns Column{Name: name, Value: value}.
func Col(name string, value any) Column { return Column{Name: name, Value: value} }

// Names of the toolkit's objects, created by package migrations.
const (
	// ResourceTable holds the newest token of each resource fenced with a
	// Guard.
	ResourceTable = "fencekit_resource_tokens"
	// LockVersionColumn is the column row-level fencing reads and writes
	// on a fenced table: BIGINT UNSIGNED NOT NULL (MySQL) or INTEGER NOT
	// NULL (SQLite), never written by anything else.
	LockVersionColumn = "lock_version"
)

// The guard's errors are fence's, shared by every guard (see the package
// doc, "Outcomes and errors"): a missing row is a *fence.NotFoundError, a
// row that exists already fence.ErrExists, a key matching several rows
// fence.ErrAmbiguousKey, a conflict worth retrying a *fence.RetryableError,
// bad input fence.ErrInvalidArgument, and a database not set up for the
// guard a *fence.SetupError that names the fix (fence.ErrNotMigrated,
// fence.ErrNoTable, fence.ErrNoLockVersion, fence.ErrLockVersionType,
// fence.ErrLedgerTable; lease.ErrSetup is the same sentinel as
// fence.ErrSetup).

// IsRetryable reports whether err is worth retrying as a whole
// transaction: it matches fence.ErrRetryable, or it carries a driver error that
// is a MySQL deadlock or lock wait timeout or SQLite's SQLITE_BUSY or
// SQLITE_LOCKED (for example one returned by your own statements inside
// Guard.BeginFunc). A stale token is never retryable.
func IsRetryable(err error) bool { return rowguard.Retryable(err, driverRetryable) }

// driverRetryable reports whether err carries a MySQL deadlock or lock wait
// timeout, or SQLite's SQLITE_BUSY or SQLITE_LOCKED.
func driverRetryable(err error) bool {
	if n, ok := mysqlNumber(err); ok {
		return n == myDeadlock || n == myLockWaitTimeout
	}
	if c, ok := sqliteCode(err); ok {
		return c&0xff == sqliteBusy || c&0xff == sqliteLocked
	}
	return false
}

// Driver error numbers the guard interprets.
const (
	myDupEntry        = 1062 // ER_DUP_ENTRY
	myDeadlock        = 1213 // ER_LOCK_DEADLOCK
	myLockWaitTimeout = 1205 // ER_LOCK_WAIT_TIMEOUT
	myNoSuchTable     = 1146 // ER_NO_SUCH_TABLE
	myBadField        = 1054 // ER_BAD_FIELD_ERROR
	myOutOfRange      = 1264 // ER_WARN_DATA_OUT_OF_RANGE, an error in strict mode
	myTxInProgress    = 1568 // ER_CANT_CHANGE_TX_CHARACTERISTICS
	myDBAccessDenied  = 1044 // ER_DBACCESS_DENIED_ERROR
	myTableDenied     = 1142 // ER_TABLEACCESS_DENIED_ERROR
	myColumnDenied    = 1143 // ER_COLUMNACCESS_DENIED_ERROR
	myReadOnly        = 1290 // ER_OPTION_PREVENTS_STATEMENT (read_only)
	myReadOnlyTx      = 1792 // ER_CANT_EXECUTE_IN_READ_ONLY_TRANSACTION

	sqliteError      = 1
	sqliteBusy       = 5
	sqliteLocked     = 6
	sqliteConstraint = 19
	sqliteReadOnly   = 8
	sqliteAuth       = 23
)

// mysqlNumber returns the error number of a *mysql.MySQLError
// (github.com/go-sql-driver/mysql) in err's chain: a pointer to a struct
// named MySQLError with an exported uint16 field Number. It is read by
// reflection so that the guard's module does not require the driver.
func mysqlNumber(err error) (int, bool) {
	var n int
	found := walk(err, func(e error) bool {
		v := reflect.ValueOf(e)
		if v.Kind() != reflect.Pointer || v.IsNil() || v.Elem().Kind() != reflect.Struct {
			return false
		}
		if v.Elem().Type().Name() != "MySQLError" {
			return false
		}
		f := v.Elem().FieldByName("Number")
		if !f.IsValid() || f.Kind() != reflect.Uint16 {
			return false
		}
		n = int(f.Uint())
		return true
	})
	return n, found
}

// sqliteCode returns the result code of a SQLite error in err's chain:
// an error with a Code() int method (modernc.org/sqlite's *sqlite.Error).
func sqliteCode(err error) (int, bool) {
	var c interface{ Code() int }
	if errors.As(err, &c) && !rowguard.IsNil(c) {
		return c.Code(), true
	}
	return 0, false
}

// walk calls f on err and every error it wraps, depth first, until f
// returns true.
func walk(err error, f func(error) bool) bool {
	if err == nil {
		return false
	}
	if f(err) {
		return true
	}
	switch u := err.(type) {
	case interface{ Unwrap() error }:
		return walk(u.Unwrap(), f)
	case interface{ Unwrap() []error }:
		for _, e := range u.Unwrap() {
			if walk(e, f) {
				return true
			}
		}
	}
	return false
}

// storeErr reports whether err is the database's own answer (a driver
// error carrying the server's or library's error code): the statement
// failed there and changed nothing.
func (d Dialect) storeErr(err error) bool {
	switch d {
	case MySQL:
		_, ok := mysqlNumber(err)
		return ok
	case SQLite:
		_, ok := sqliteCode(err)
		return ok
	}
	return false
}

// retryable reports whether err is a driver's deadlock, lock timeout or
// busy database.
func (d Dialect) retryable(err error) bool {
	return !errors.Is(err, fence.ErrRetryable) && !errors.Is(err, fence.ErrStaleToken) && driverRetryable(err)
}

// dupKey reports whether err is a unique-constraint violation.
func (d Dialect) dupKey(err error) bool {
	if n, ok := mysqlNumber(err); ok && d == MySQL {
		return n == myDupEntry
	}
	if c, ok := sqliteCode(err); ok && d == SQLite {
		// SQLITE_CONSTRAINT_PRIMARYKEY (1555) and _UNIQUE (2067).
		return c == 1555 || c == 2067
	}
	return false
}

// uniqueName says which unique index a unique-constraint violation err
// was on: the index MySQL names, or the columns of the constraint SQLite
// names ("another unique index" when the message names neither).
func (d Dialect) uniqueName(err error) string {
	msg := err.Error()
	if d == MySQL {
		// "Duplicate entry 'v' for key 'name'" (MySQL 8: 'table.name');
		// the value may hold anything, the name is last.
		if i := strings.LastIndex(msg, " for key '"); i >= 0 && strings.HasSuffix(msg, "'") {
			return "unique index " + d.quote(msg[i+len(" for key '"):len(msg)-1])
		}
		return "another unique index"
	}
	// "UNIQUE constraint failed: t.a, t.b", and modernc.org/sqlite's code
	// after it: "... t.a (2067)".
	i := strings.LastIndex(msg, "constraint failed: ")
	if i < 0 {
		return "another unique index"
	}
	cols := msg[i+len("constraint failed: "):]
	if j := strings.LastIndex(cols, " ("); j >= 0 {
		cols = cols[:j]
	}
	return "the unique constraint on " + cols
}

// wrapDBErr wraps a database error from op, turning deadlocks, lock
// timeouts and busy databases into a *fence.RetryableError, and a refused
// privilege or a read-only database into a *fence.SetupError naming the
// fix. The driver's error stays in the chain.
func (d Dialect) wrapDBErr(op string, err error) error {
	if d.retryable(err) {
		return &fence.RetryableError{Op: "dbguard: " + op, Err: err}
	}
	if fix := d.setupFix(err); fix != "" {
		return &fence.SetupError{Err: fmt.Errorf("dbguard: %s: %w", op, err), Fix: fix}
	}
	return fmt.Errorf("dbguard: %s: %w", op, err)
}

// setupFix returns the fix for a driver error that retrying cannot fix (a
// privilege refused, a read-only server or file), or "".
func (d Dialect) setupFix(err error) string {
	if n, ok := mysqlNumber(err); ok && d == MySQL {
		switch n {
		case myDBAccessDenied, myTableDenied, myColumnDenied:
			return "grant the database user what the guard needs: SELECT, INSERT, UPDATE, DELETE on the fenced tables, fencekit_resource_tokens and fencekit_job_runs (Guard.Check and Table.Check name what is missing)"
		case myReadOnly, myReadOnlyTx:
			return "connect to a server that takes writes (the primary, with read_only off), outside a read-only transaction"
		}
	}
	if c, ok := sqliteCode(err); ok && d == SQLite {
		switch c & 0xff {
		case sqliteReadOnly:
			return "open the database file read-write (file permissions, mode=ro in the DSN)"
		case sqliteAuth:
			return "allow the statement in the connection's authorizer"
		}
	}
	return ""
}

// sentErr maps the error of a statement that may have reached the
// database. The database's own answer, a driver's ErrBadConn (which by
// database/sql's contract means nothing was sent), a finished transaction
// and a connection that is still valid (the statement could not be
// encoded, or never left) are plain failures. Anything else happened
// while the statement was in flight, and the database may have applied
// it or may still apply it: the error matches fence.ErrOutcomeUnknown as
// well as its cause. conn is the connection the statement ran on, or nil
// when it is not known (inside a caller's *sql.Tx).
//
// A context that ended is never a plain failure here, even on a
// connection the driver still reports valid: an in-process driver
// (modernc.org/sqlite) can finish and commit the statement and still
// return the context's error. (The reliability suite's history check
// caught such a write at load 12-23: reported failed with "context
// deadline exceeded", read back applied.) A context that had ended before
// the statement was sent is reported plain by the callers, which check it
// first.
func (d Dialect) sentErr(ctx context.Context, op string, err error, conn *sql.Conn) error {
	ctxEnded := errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded)
	if d.storeErr(err) || errors.Is(err, driver.ErrBadConn) || errors.Is(err, sql.ErrTxDone) ||
		errors.Is(err, sql.ErrConnDone) || (!ctxEnded && conn != nil && connValid(conn)) {
		return d.wrapDBErr(op, err)
	}
	return fmt.Errorf("dbguard: %s: %w: %w", op, fence.ErrOutcomeUnknown, err)
}

// connValid reports whether the driver says conn's connection is still
// usable (driver.Validator); a driver that does not say is taken as
// broken.
func connValid(conn *sql.Conn) bool {
	valid := false
	_ = conn.Raw(func(dc any) error {
		if v, ok := dc.(driver.Validator); ok {
			valid = v.IsValid()
		}
		return nil
	})
	return valid
}

// tokenArg converts a token to the argument d stores, or returns an error
// wrapping fence.ErrInvalidToken.
func (d Dialect) tokenArg(t fence.Token) (any, error) {
	if err := t.Validate(); err != nil {
		return nil, err
	}
	if d == SQLite {
		if uint64(t) > math.MaxInt64 {
			return nil, fmt.Errorf("%w: token %d is above SQLite's integer range (max %d): store tokens of at most 2^63-1 in SQLite",
				fence.ErrInvalidToken, uint64(t), int64(math.MaxInt64))
		}
		return int64(t), nil
	}
	return uint64(t), nil
}

// maxIdentLen is the longest identifier d takes, in characters (MySQL:
// 64) or bytes (SQLite has no limit; this one keeps statements sane).
func (d Dialect) maxIdentLen() int {
	if d == MySQL {
		return 64
	}
	return 1024
}

// checkIdent validates one identifier for d.
func (d Dialect) checkIdent(kind, s string) error {
	if err := names.Check(fence.ErrInvalidArgument, kind+" name", s, names.Rules{Max: d.maxIdentLen(), CountRunes: d == MySQL}); err != nil {
		return err
	}
	if d == MySQL && strings.HasSuffix(s, " ") {
		// MySQL refuses names that end with a space.
		return fmt.Errorf("%w: %s name %q ends with a space", fence.ErrInvalidArgument, kind, s)
	}
	return nil
}

// quote quotes one identifier: `name` with backquotes doubled (MySQL,
// whatever sql_mode says: backquotes are always identifier quotes there),
// "name" with double quotes doubled (SQLite).
func (d Dialect) quote(s string) string {
	if d == MySQL {
		return "`" + strings.ReplaceAll(s, "`", "``") + "`"
	}
	return `"` + strings.ReplaceAll(s, `"`, `""`) + `"`
}

// qualified quotes db.name, or name alone when db is empty.
func (d Dialect) qualified(db, name string) string {
	if db == "" {
		return d.quote(name)
	}
	return d.quote(db) + "." + d.quote(name)
}
