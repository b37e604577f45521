package fence

import (
	"errors"
	"fmt"
)

// The errors below are the vocabulary every guard shares (sqlguard,
// dbguard, blobguard, dynamoguard), beside ErrStaleToken, ErrInvalidToken
// and ErrOutcomeUnknown: a guard returns them, wrapped with what it was
// doing, and a caller matches them with errors.Is and errors.As whatever
// the store. A guard adds a sentinel of its own only for what its store
// alone has (blobguard.ErrConflict, dynamoguard.ErrCanceled).
//
// Every outcome of a guarded write is one of: nil (applied), stale
// (ErrStaleToken), unknown (ErrOutcomeUnknown), retryable (ErrRetryable),
// a setup problem that names its fix (ErrSetup), bad input
// (ErrInvalidArgument, before any I/O), or another error that says what
// the store answered (ErrNotFound, ErrExists, ErrAmbiguousKey,
// ErrNotFenced, or the store's own).

// ErrInvalidArgument is matched, before any I/O, by an argument or option
// a guard cannot use: a nil database or client, an empty or malformed
// name, a key of the wrong shape, an invalid option. ErrInvalidToken is a
// kind of it: errors.Is(err, ErrInvalidArgument) holds for a bad token
// too. Nothing was sent.
var ErrInvalidArgument = errors.New("fence: invalid argument")

// ErrInvalidToken is returned before any I/O when a token cannot be used at
// all: the zero token, or a token a particular store cannot represent (for
// example one above the int64 range for a PostgreSQL bigint column). It is
// a kind of ErrInvalidArgument.
var ErrInvalidToken error = &kind{msg: "fence: invalid token", of: ErrInvalidArgument}

// ErrRetryable is matched (through a *RetryableError) by a failure that
// says nothing about the token and may succeed when the whole write or
// transaction is tried again: a serialization failure, a deadlock, a lock
// wait timeout, a busy database, a row with the key created by another
// writer at the same time. Nothing was written. Never returned for a stale
// token, nor for a conflict that no retry clears.
var ErrRetryable = errors.New("fence: retryable conflict")

// ErrNotFound is matched (through a *NotFoundError) when the target of a
// write that needs one (an update, a delete of a row) or of a read does
// not exist. Nothing was written.
var ErrNotFound = errors.New("fence: not found")

// ErrExists is returned by a create (an Insert) when the target exists
// already and its token is not newer than the presented one (when it is
// newer, the error is a *StaleError instead). Nothing was written.
var ErrExists = errors.New("fence: already exists")

// ErrAmbiguousKey is returned when a key matches more than one record, so
// that it does not name one target: the key columns are not a unique key,
// or the store matches the key's value against several rows. Nothing was
// written, unless the error says otherwise.
var ErrAmbiguousKey = errors.New("fence: key matches more than one row")

// ErrNotFenced is returned when the target holds a record no guard wrote
// (no token, or one the guard cannot read): its token is unknown, so the
// guard neither overwrites it nor returns it as fenced.
var ErrNotFenced = errors.New("fence: not written by a guard")

// ErrSetup is matched by an error that retrying cannot fix: the store
// answers, but it is not set up for what was asked (tables or columns are
// missing or of the wrong type, migrations were not run, privileges or
// credentials are refused, the store ignores the conditions fencing rests
// on). The guards' start-up checks (Check) and their writes return it as a
// *SetupError that names the fix; so do the lease backends: lease.ErrSetup
// and driver.ErrSetup are this very value, so that one errors.Is stops a
// retry loop whichever side is not set up.
var ErrSetup = errors.New("fence: the store is not set up")

// Kinds of setup problem that more than one guard finds. Each matches
// ErrSetup; a guard returns them inside a *SetupError that names the fix.
var (
	// ErrNotMigrated: the toolkit's own tables (or functions) are not
	// where the guard looks: run `fencekit migrate up` there.
	ErrNotMigrated error = &kind{msg: "fence: the toolkit's tables are not migrated", of: ErrSetup}
	// ErrNoTable: the table the guard writes does not exist.
	ErrNoTable error = &kind{msg: "fence: table not found", of: ErrSetup}
	// ErrNoLockVersion: a table fenced row by row has no lock_version
	// column.
	ErrNoLockVersion error = &kind{msg: "fence: table has no lock_version column", of: ErrSetup}
	// ErrLockVersionType: a table's lock_version column cannot hold every
	// token exactly (a floating-point, narrower or text type), so tokens
	// would not compare as tokens. Nothing was written.
	ErrLockVersionType error = &kind{msg: "fence: lock_version column cannot hold every token", of: ErrSetup}
	// ErrLedgerTable: a ledger's table is missing, or cannot keep the runs
	// of jobs apart (it is not keyed by job and run key), or cannot record
	// a run done.
	ErrLedgerTable error = &kind{msg: "fence: the ledger's table cannot record the runs of jobs", of: ErrSetup}
)

// kind is a sentinel that is a kind of another: errors.Is(k, k.of) holds.
type kind struct {
	msg string
	of  error
}

func (k *kind) Error() string        { return k.msg }
func (k *kind) Is(target error) bool { return target == k.of }

// SetupError is the rich form of ErrSetup: a store problem that retrying
// cannot fix, and what to do about it. errors.Is(err, ErrSetup) is true
// for it, and errors.Is/As see the store's error through Unwrap. Its text
// is one line: the error followed by the fix in parentheses (the fix
// alone when Err is nil, for a problem a check found by itself).
type SetupError struct {
	// Err is the problem: a sentinel such as ErrNoLockVersion wrapped
	// with what was found, joined with the store's error where there is
	// one (nil when a check found the problem without one).
	Err error
	// Fix says what to change: the command to run, the column to add, the
	// grant to make, the variable to set.
	Fix string
}

func (e *SetupError) Error() string {
	if e.Err == nil {
		return e.Fix
	}
	return e.Err.Error() + " (" + e.Fix + ")"
}

// Is makes errors.Is(err, ErrSetup) match.
func (e *SetupError) Is(target error) bool { return target == ErrSetup }

// Unwrap returns the problem.
func (e *SetupError) Unwrap() error { return e.Err }

// Setup returns a *SetupError for err (formatted as fmt.Errorf formats
// format and args, so %w wraps) with fix.
func Setup(fix, format string, args ...any) *SetupError {
	return &SetupError{Err: fmt.Errorf(format, args...), Fix: fix}
}

// RetryableError is the rich form of ErrRetryable: what was being done
// and why it may succeed when tried again.
type RetryableError struct {
	// Op says what was being done, with the guard's name: for example
	// `sqlguard: update "shop"."orders"`.
	Op string
	// Err is the cause (the store's error, where there is one: errors.As
	// still finds it).
	Err error
}

// Error describes the operation and its cause.
func (e *RetryableError) Error() string {
	return fmt.Sprintf("%s: retryable: %v", e.Op, e.Err)
}

// Unwrap returns the cause.
func (e *RetryableError) Unwrap() error { return e.Err }

// Is reports whether target is ErrRetryable.
func (e *RetryableError) Is(target error) bool { return target == ErrRetryable }

// NotFoundError is the rich form of ErrNotFound, which every guard
// returns for a missing target. errors.Is(err, ErrNotFound) is true for
// it.
type NotFoundError struct {
	// Resource names the target, in the format of the guard's errors (a
	// row, an object, an item).
	Resource string
	// Tombstone is the token of the tombstone a fenced delete left there
	// (blobguard, dynamoguard), or None when the target holds nothing.
	Tombstone Token
	// Version is the guard's own record of that tombstone, for a
	// conditional write over it (blobguard.Version, which PutIf takes),
	// or nil when the guard has none. Only the guard makes one.
	Version any
}

// Error says which target was not found.
func (e *NotFoundError) Error() string {
	if e.Tombstone != None {
		return fmt.Sprintf("fence: not found: %s (deleted with token %d)", e.Resource, e.Tombstone)
	}
	return "fence: not found: " + e.Resource
}

// Is reports whether target is ErrNotFound.
func (e *NotFoundError) Is(target error) bool { return target == ErrNotFound }
