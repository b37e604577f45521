package lease

import (
	"errors"
	"fmt"
	"time"

	"github.com/fencekit/fencekit/fence"
)

var (
	// ErrNotAcquired is returned by TryAcquire when another holder has the
	// lease, by Acquire (joined with the context's error) when its context
	// ends before the lease could be acquired, and by a Backend's Acquire
	// when the lease is held by another owner.
	ErrNotAcquired = errors.New("lease: not acquired")

	// ErrLost is matched by the error of a lease that ended without being
	// released: it expired at its local deadline without a successful
	// renewal, or a renew found another owner (or none) at the store. It is
	// returned by Lease.Renew and Lease.Release on such a lease, and is the
	// cause of its Context. The rich form is *LostError.
	ErrLost = errors.New("lease: lost")

	// ErrReleased is the cause of a lease's Context after Release, and is
	// returned by Lease.Renew on a released lease.
	ErrReleased = errors.New("lease: released")

	// ErrNotHeld is returned by a Backend's Renew and Release when the store
	// does not name the given owner and token as the holder (the lease
	// expired, was taken over, or was released). The Manager turns it into
	// ErrLost.
	ErrNotHeld = errors.New("lease: not held by this owner")

	// ErrExpiredAtStore is for backends: a cause passed to
	// Notifier.Lost that matches it (a ZooKeeper session that expired)
	// ends the lease as LostExpired rather than LostTakenOver. A backend
	// that cannot tell an expiry from a takeover (etcdlease sees only its
	// key deleted) reports the loss without it.
	ErrExpiredAtStore = errors.New("lease: the store let the grant expire")

	// ErrSetup is matched by a store error that retrying cannot fix: the
	// store answers, but it is not set up for leases (the lease tables or
	// schema are missing, the credentials or permissions are refused, the
	// database does not exist, the server only takes reads). A Backend
	// makes such an error match it, with a message that names the fix
	// ("run fencekit migrate up", the variable to set). Acquire, Run and
	// Election.Run return it at once instead of retrying until their
	// context ends; Manager.Check returns it before any lease is asked for.
	ErrSetup = errors.New("lease: the store is not set up for leases")

	// ErrInvalidOptions is matched by the error NewManager returns when the
	// options are unusable. The error lists every problem found.
	ErrInvalidOptions = errors.New("lease: invalid options")

	// ErrInvalidName is returned, before any I/O, for a lease name that is
	// empty, longer than MaxNameLen bytes, not valid UTF-8 or contains
	// control characters.
	ErrInvalidName = errors.New("lease: invalid name")
)

// NotAcquiredError is the rich form of ErrNotAcquired returned by a Backend
// (and passed on by TryAcquire) when another owner holds the lease.
// errors.Is(err, ErrNotAcquired) is true for it.
type NotAcquiredError struct {
	// Name is the lease name.
	Name string
	// RetryAfter is the store's estimate of how long the current holder's
	// grant has left (0 if unknown). Acquire uses it to time its next try.
	RetryAfter time.Duration
}

func (e *NotAcquiredError) Error() string {
	if e.RetryAfter > 0 {
		return fmt.Sprintf("lease: not acquired: %q is held by another owner (expires in %v unless renewed)", e.Name, e.RetryAfter)
	}
	return fmt.Sprintf("lease: not acquired: %q is held by another owner", e.Name)
}

// Is makes errors.Is(err, ErrNotAcquired) match.
func (e *NotAcquiredError) Is(target error) bool { return target == ErrNotAcquired }

// SetupError is the rich form of ErrSetup that backends return: a store
// error that retrying cannot fix, and what to do about it.
// errors.Is(err, ErrSetup) is true for it, and errors.Is/As see the
// store's error through Unwrap. Its text is one line: the store's error
// followed by the fix in parentheses (the fix alone when Err is nil, for a
// refusal a Check found by itself).
type SetupError struct {
	// Err is the store's error (nil when a check found the problem without
	// one).
	Err error
	// Fix says what to change: the command to run, the variable to set,
	// the grant to make.
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

// Unwrap returns the store's error.
func (e *SetupError) Unwrap() error { return e.Err }

// LostReason says why a lease was lost.
type LostReason string

const (
	// LostExpired: the local deadline passed without a successful renewal
	// (the store was unreachable, slow, or the process was paused).
	LostExpired LostReason = "expired"
	// LostTakenOver: the store no longer names this holder (another owner
	// holds the lease, or its key is gone).
	LostTakenOver LostReason = "taken over"
)

// LostError is the rich form of ErrLost. errors.Is(err, ErrLost) is true for
// it, and errors.Is/As also see the last store error, if any, through Unwrap.
type LostError struct {
	Name   string
	Token  fence.Token
	Reason LostReason
	// Cause is the last error seen from the store, or nil.
	Cause error
}

func (e *LostError) Error() string {
	s := fmt.Sprintf("lease: lost: %q (token %d) %s", e.Name, e.Token, e.Reason)
	if e.Cause != nil {
		s += ": " + e.Cause.Error()
	}
	return s
}

// Is makes errors.Is(err, ErrLost) match.
func (e *LostError) Is(target error) bool { return target == ErrLost }

// Unwrap returns the last store error, or nil.
func (e *LostError) Unwrap() error { return e.Cause }

var errShortBatch = errors.New("lease: backend's RenewBatch did not report every grant")
