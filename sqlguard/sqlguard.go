package sqlguard

import (
	"context"
	"database/sql/driver"
	"errors"
	"fmt"
	"math"
	"reflect"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/fencekit/fencekit/fence"
	"github.com/fencekit/fencekit/internal/pgident"
)

// DBTX is what the guard needs to run a statement: the shape that
// *pgxpool.Pool, *pgx.Conn and pgx.Tx all have (and that sqlc generates).
// Pass a pgx.Tx to make a fenced write part of your transaction.
type DBTX interface {
	Exec(ctx context.Context, sql string, arguments ...any) (pgconn.CommandTag, error)
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// Beginner starts a transaction, as in pgx.BeginFunc. *pgxpool.Pool,
// *pgx.Conn and pgx.Tx (a savepoint) satisfy it.
type Beginner interface {
	Begin(ctx context.Context) (pgx.Tx, error)
}

// TxBeginner starts a transaction with options. *pgxpool.Pool and
// *pgx.Conn satisfy it; Guard.BeginFunc uses it when Options.TxOptions is
// set.
type TxBeginner interface {
	BeginTx(ctx context.Context, txOptions pgx.TxOptions) (pgx.Tx, error)
}

var (
	_ DBTX       = (*pgxpool.Pool)(nil)
	_ DBTX       = (*pgx.Conn)(nil)
	_ DBTX       = pgx.Tx(nil)
	_ Beginner   = (*pgxpool.Pool)(nil)
	_ Beginner   = (*pgx.Conn)(nil)
	_ Beginner   = pgx.Tx(nil)
	_ TxBeginner = (*pgxpool.Pool)(nil)
	_ TxBeginner = (*pgx.Conn)(nil)
)

// Names of the toolkit's objects, created by package migrations.
const (
	// ResourceTable holds the newest token of each resource fenced with a
	// Guard.
	ResourceTable = "fencekit_resource_tokens"
	// AdvanceFunction is the function a Guard calls to advance a
	// resource's token.
	AdvanceFunction = "fencekit_advance_token"
	// LockVersionColumn is the column row-level fencing reads and writes
	// on a fenced table: BIGINT NOT NULL, never written by anything else.
	LockVersionColumn = "lock_version"
)

// ErrNotFound is returned by Table.Update and Table.Delete when no row has
// the given key (in the statement's snapshot). Nothing was written.
var ErrNotFound = errors.New("sqlguard: row not found")

// ErrExists is returned by Table.Insert when a row with the key already
// exists and its lock_version is not newer than the presented token (when
// it is newer, the error is a *fence.StaleError instead). Nothing was
// written.
var ErrExists = errors.New("sqlguard: row already exists")

// ErrAmbiguousKey is returned by a Table write when the key matches more
// than one row: the key columns do not identify a row (they must be the
// primary key or a unique key). Nothing was written, except in one case
// the error then says: a connection that found a unique index on the key
// columns at its first write to the table, after which the index was
// dropped and duplicate keys were added (see the package doc).
var ErrAmbiguousKey = errors.New("sqlguard: key matches more than one row")

// ErrRetryable is matched (through a *RetryableError) by failures that say
// nothing about the token and may succeed when the whole transaction is
// tried again: serialization failures (SQLSTATE 40001), deadlocks (40P01),
// and a row with the key committed by another transaction after this
// statement's snapshot was taken. Never returned for a stale token. Use
// IsRetryable to test any error.
var ErrRetryable = errors.New("sqlguard: retryable conflict")

// ErrInvalid is returned, before any I/O, for an argument that cannot be
// used: a nil database or function, an empty, over-long or malformed
// identifier, a duplicate or ambiguous column, the wrong number of key
// values, a NULL key value, an empty resource name. Bad tokens match fence.ErrInvalidToken
// instead.
var ErrInvalid = errors.New("sqlguard: invalid argument")

// ErrLockVersionType is returned by a Table write, and nothing is written,
// when the table's lock_version column is not bigint (for example real,
// numeric, integer or text): such a column cannot hold every token
// exactly, and with a floating-point type a stale token can compare equal
// to a newer one. The check is part of the write's own statement, so it
// costs no round trip and follows the table as it is now. Change the
// column to bigint NOT NULL (migrations.ApplyLockVersion refuses to adopt
// a column of another type).
var ErrLockVersionType = errors.New("sqlguard: lock_version column is not bigint")

// ErrNotMigrated is returned by a Guard when the toolkit's table or
// function does not exist in the schema it looks in: run
// `fencekit migrate up` (or migrations.Up) there, or fix Options.Schema.
// The error says which schema and the command to run.
var ErrNotMigrated = errors.New("sqlguard: fencekit's table and function not found: run `fencekit migrate up` first")

// ErrNoLockVersion is returned by a Table write when the table has no
// lock_version column (SQLSTATE 42703 for that column): add it with
// `fencekit migrate add-lock-version --table <schema.table> --apply`, or
// with a migration that command writes (--out), or migrations.ApplyLockVersion.
// The error names the table and the command; errors.As still finds the
// *pgconn.PgError. Nothing was written.
var ErrNoLockVersion = errors.New("sqlguard: table has no lock_version column")

// RetryableError is the rich form of ErrRetryable. Err is the underlying
// error; for a serialization failure or deadlock it wraps the
// *pgconn.PgError, so errors.As still finds it.
type RetryableError struct {
	// Op says what was being done, for example `update "shop"."orders"`.
	Op string
	// Err is the cause.
	Err error
}

// Error describes the operation and its cause.
func (e *RetryableError) Error() string {
	return fmt.Sprintf("sqlguard: %s: retryable: %v", e.Op, e.Err)
}

// Unwrap returns the cause.
func (e *RetryableError) Unwrap() error { return e.Err }

// Is reports whether target is ErrRetryable.
func (e *RetryableError) Is(target error) bool { return target == ErrRetryable }

// SQLSTATE codes the guard interprets.
const (
	codeSerializationFailure = "40001"
	codeDeadlockDetected     = "40P01"
	codeUndefinedFunction    = "42883"
	codeUndefinedTable       = "42P01"
	codeInvalidSchemaName    = "3F000"
	codeUndefinedColumn      = "42703"
	// codeStale is raised by fencekit_advance_token (see package
	// migrations) when the presented token is older than the stored one.
	codeStale = "FK409"
)

// IsRetryable reports whether err is worth retrying as a whole
// transaction: it matches ErrRetryable, or it carries a *pgconn.PgError
// with SQLSTATE 40001 (serialization_failure) or 40P01
// (deadlock_detected), for example one returned by your own statements
// inside Guard.BeginFunc. A stale token is never retryable.
func IsRetryable(err error) bool {
	if err == nil || errors.Is(err, fence.ErrStaleToken) {
		return false
	}
	if errors.Is(err, ErrRetryable) {
		return true
	}
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && isRetryableCode(pgErr.Code)
}

func isRetryableCode(code string) bool {
	return code == codeSerializationFailure || code == codeDeadlockDetected
}

// wrapDBErr wraps a database error from op, turning serialization failures
// and deadlocks into a *RetryableError. The original error stays in the
// chain.
func wrapDBErr(op string, err error) error {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && isRetryableCode(pgErr.Code) {
		return &RetryableError{Op: op, Err: err}
	}
	return fmt.Errorf("sqlguard: %s: %w", op, err)
}

// noLockVersion returns an error matching ErrNoLockVersion when err is
// PostgreSQL's undefined_column for lock_version in stmt, and nil
// otherwise. The column is recognised by name in the message (quoted, as
// every translation of the message keeps it) or by the error's position in
// stmt, so that an undefined column of the caller's own is not taken for
// it. table is the table as `fencekit migrate add-lock-version --table`
// takes it.
func noLockVersion(op, table, stmt string, err error) error {
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) || pgErr.Code != codeUndefinedColumn {
		return nil
	}
	at := false
	if r := []rune(stmt); pgErr.Position > 0 && int(pgErr.Position) <= len(r) {
		at = strings.HasPrefix(string(r[pgErr.Position-1:]), LockVersionColumn)
	}
	if !at && !strings.Contains(pgErr.Message, `"`+LockVersionColumn+`"`) {
		return nil
	}
	return fmt.Errorf("sqlguard: %s: %w: add it with `fencekit migrate add-lock-version --table %s --apply` (or migrations.ApplyLockVersion): %w",
		op, ErrNoLockVersion, table, err)
}

// sentErr maps the error of a statement that may have reached the server
// (a Table write's, a COMMIT's). A *pgconn.PgError is the server's answer:
// the statement failed and changed nothing. An error that pgx marks as
// raised before anything was sent (pgconn.SafeToRetry), or one after which
// the connection is still open and in step with the server (an argument
// that could not be encoded), is a plain failure. Anything else happened
// while the statement was in flight: the context ended or the connection
// broke after sending, and the server may still apply it, so the error
// matches fence.ErrOutcomeUnknown as well as its cause. conn is the
// connection the statement ran on, or nil when it is not known (a DBTX
// that is neither a pool, a connection nor a pgx.Tx); then only pgx's own
// mark tells a failure before sending.
func sentErr(op string, err error, conn *pgx.Conn) error {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) || pgconn.SafeToRetry(err) || errors.Is(err, pgx.ErrTxClosed) ||
		(conn != nil && !conn.IsClosed()) {
		return wrapDBErr(op, err)
	}
	return fmt.Errorf("sqlguard: %s: %w: %w", op, fence.ErrOutcomeUnknown, err)
}

// connOf returns the connection behind db when it is a *pgx.Conn or has
// one (pgx.Tx, *pgxpool.Conn), and nil otherwise.
func connOf(db any) *pgx.Conn {
	switch d := db.(type) {
	case *pgx.Conn:
		return d
	case interface{ Conn() *pgx.Conn }:
		return d.Conn()
	}
	return nil
}

// tokenArg converts a token to the bigint PostgreSQL stores, or returns an
// error wrapping fence.ErrInvalidToken.
func tokenArg(t fence.Token) (int64, error) {
	if err := t.Validate(); err != nil {
		return 0, err
	}
	if uint64(t) > math.MaxInt64 {
		return 0, fmt.Errorf("%w: token %d is above the PostgreSQL bigint range (max %d)", fence.ErrInvalidToken, uint64(t), int64(math.MaxInt64))
	}
	return int64(t), nil
}

// checkIdent validates one identifier (see pgident.Check).
func checkIdent(kind, s string) error { return pgident.Check(ErrInvalid, kind, s) }

// isNull reports whether pgx would send v as SQL NULL: v is nil, a nil
// pointer, map or slice, or a driver.Valuer (the pgtype types,
// database/sql's Null types) whose Value is nil.
func isNull(v any) bool {
	if isNil(v) {
		return true
	}
	if vr, ok := v.(driver.Valuer); ok {
		dv, err := vr.Value()
		return err == nil && dv == nil
	}
	return false
}

// isNil reports whether v is nil or a typed nil pointer (or other nilable
// value) inside an interface.
func isNil(v any) bool {
	if v == nil {
		return true
	}
	rv := reflect.ValueOf(v)
	switch rv.Kind() {
	case reflect.Pointer, reflect.Interface, reflect.Map, reflect.Slice, reflect.Func, reflect.Chan:
		return rv.IsNil()
	}
	return false
}
