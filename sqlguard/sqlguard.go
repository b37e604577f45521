package sqlguard

import (
	"context"
	"errors"
	"fmt"
	"math"
	"reflect"

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
// primary key or a unique key). Nothing was written.
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
// values, an empty resource name. Bad tokens match fence.ErrInvalidToken
// instead.
var ErrInvalid = errors.New("sqlguard: invalid argument")

// ErrNotMigrated is returned by a Guard when the toolkit's table or
// function does not exist in the schema it looks in: run
// migrations.Up (or fencekit migrate up) there, or fix Options.Schema.
var ErrNotMigrated = errors.New("sqlguard: fencekit tables not found (run fencekit migrations)")

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
