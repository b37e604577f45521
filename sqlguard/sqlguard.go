package sqlguard

import (
	"context"
	"errors"
	"fmt"
	"math"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/fencekit/fencekit/fence"
	"github.com/fencekit/fencekit/internal/pgident"
	"github.com/fencekit/fencekit/internal/rowguard"
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

// The guard's errors are fence's, shared by every guard (see the package
// doc, "Outcomes and errors"): a missing row is a *fence.NotFoundError, a
// row that exists already fence.ErrExists, a key matching several rows
// fence.ErrAmbiguousKey, a conflict worth retrying a *fence.RetryableError,
// bad input fence.ErrInvalidArgument, and a database not set up for the
// guard a *fence.SetupError that names the fix (fence.ErrNotMigrated,
// fence.ErrNoTable, fence.ErrNoLockVersion, fence.ErrLockVersionType,
// fence.ErrLedgerTable; lease.ErrSetup is the same sentinel as
// fence.ErrSetup).

// SQLSTATE codes the guard interprets.
const (
	codeSerializationFailure = "40001"
	codeDeadlockDetected     = "40P01"
	codeUndefinedFunction    = "42883"
	codeUndefinedTable       = "42P01"
	codeInvalidSchemaName    = "3F000"
	codeUndefinedColumn      = "42703"
	codeInsufficientPriv     = "42501"
	// codeStale is raised by fencekit_advance_token (see package
	// migrations) when the presented token is older than the stored one.
	codeStale = "FK409"
)

// IsRetryable reports whether err is worth retrying as a whole
// transaction: it matches fence.ErrRetryable, or it carries a *pgconn.PgError
// with SQLSTATE 40001 (serialization_failure) or 40P01
// (deadlock_detected), for example one returned by your own statements
// inside Guard.BeginFunc. A stale token is never retryable.
func IsRetryable(err error) bool {
	return rowguard.Retryable(err, func(err error) bool {
		var pgErr *pgconn.PgError
		return errors.As(err, &pgErr) && isRetryableCode(pgErr.Code)
	})
}

func isRetryableCode(code string) bool {
	return code == codeSerializationFailure || code == codeDeadlockDetected
}

// wrapDBErr wraps a database error from op, turning serialization failures
// and deadlocks into a *fence.RetryableError and a refused privilege into
// a *fence.SetupError naming the grant. The original error stays in the
// chain.
func wrapDBErr(op string, err error) error {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		switch {
		case isRetryableCode(pgErr.Code):
			return &fence.RetryableError{Op: "sqlguard: " + op, Err: err}
		case pgErr.Code == codeInsufficientPriv:
			return &fence.SetupError{Err: fmt.Errorf("sqlguard: %s: %w", op, err),
				Fix: "grant this connection's role what the guard needs: SELECT, INSERT, UPDATE, DELETE on the fenced tables and fencekit_resource_tokens, EXECUTE on fencekit_advance_token (Guard.Check and Table.Check name what is missing)"}
		}
	}
	return fmt.Errorf("sqlguard: %s: %w", op, err)
}

// noLockVersion returns a *fence.SetupError matching
// fence.ErrNoLockVersion, naming the command that adds it, when err is
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
	return noLockVersionErr(op, table, err)
}

// noLockVersionErr is the error for a table without lock_version: err is
// the database's error, or nil when a check found it.
func noLockVersionErr(op, table string, err error) error {
	what := fmt.Errorf("sqlguard: %s: %w", op, fence.ErrNoLockVersion)
	if err != nil {
		what = fmt.Errorf("%w: %w", what, err)
	}
	return &fence.SetupError{Err: what,
		Fix: "add it with `fencekit migrate add-lock-version --table " + table + " --apply` (or migrations.ApplyLockVersion)"}
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
func checkIdent(kind, s string) error { return pgident.Check(fence.ErrInvalidArgument, kind, s) }
