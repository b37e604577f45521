package lease

import (
	"errors"
	"fmt"

	"github.com/fencekit/fencekit/fence"
)

var (
	// ErrLost is matched by the error of a lease that ended without being
	// released: it expired at its local deadline without a successful
	// renewal, or a renew found another owner (or none) at the store. It is
	// returned by Lease.Renew and Lease.Release on such a lease, and is the
	// cause of its Context. The rich form is *LostError.
	ErrLost = errors.New("lease: lost")

	// ErrReleased is the cause of a lease's Context after Release, and is
	// returned by Lease.Renew on a released lease.
	ErrReleased = errors.New("lease: released")

	// ErrInvalidOptions is matched by the error NewManager returns when the
	// options are unusable. The error lists every problem found.
	ErrInvalidOptions = errors.New("lease: invalid options")
)

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
