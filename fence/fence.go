// Package fence is the shared vocabulary of fencekit: the fencing token, the
// error a store returns when it rejects a stale token, and a way to carry a
// token through a context.Context.
//
// # Safety model
//
// A lease (package lease, or any other lock service) gives liveness, never
// safety: a holder that is paused (a stop-the-world GC, a suspended VM, CPU
// throttling, a delayed network reply) can wake up believing it still holds a
// lease that has expired and been granted to someone else. Safety comes only
// from the storage. Every grant of a lease carries a fencing token that is
// strictly greater than every token granted before for the same lease name;
// every write presents its token; and the store rejects a write whose token is
// older than the newest token it has already accepted for that resource
// (Kleppmann, "How to do distributed locking", 2016; Chubby's sequencers,
// Burrows 2006). A write with a token equal to the newest accepted one is the
// same holder writing again and is allowed.
//
// This package does no I/O and imports only the standard library, so that a
// token may come from any source: a fencekit lease, an etcd revision, a
// Kubernetes Lease's resource version, or a sequence in your own database.
// The guards (sqlguard, dbguard, blobguard, dynamoguard, and the checkers
// behind fencehttp and fencegrpc) enforce the rule at the store.
//
// # One vocabulary for every guard
//
// Every guard answers a write in the same words, defined here: nil
// (applied), a *StaleError (ErrStaleToken), ErrOutcomeUnknown, a
// *RetryableError (ErrRetryable), a *SetupError that names its fix
// (ErrSetup: also lease.ErrSetup, the same value), ErrInvalidArgument
// before any I/O, or what the store found (a *NotFoundError, ErrExists,
// ErrAmbiguousKey, ErrNotFenced). Guards take the key before the token
// (Update(ctx, db, key, token, ...), Put(ctx, key, token, body)), as
// checkers and ledgers do.
package fence

import (
	"context"
	"errors"
	"fmt"
	"strconv"
)

// Token is a fencing token: a number that only grows for one lease name. The
// zero value means "no token" and is never granted; guards reject it.
type Token uint64

// None is the zero Token. It is never granted and never accepted by a guard.
const None Token = 0

// IsZero reports whether t is the zero ("no token") value.
func (t Token) IsZero() bool { return t == None }

// String returns the token in decimal.
func (t Token) String() string { return strconv.FormatUint(uint64(t), 10) }

// Validate returns an error wrapping ErrInvalidToken when t is zero, and nil
// otherwise. Guards call it at their boundary, before any I/O.
func (t Token) Validate() error {
	if t == None {
		return fmt.Errorf("%w: token is 0 (no token)", ErrInvalidToken)
	}
	return nil
}

// ErrStaleToken is returned (usually inside a *StaleError) when a store
// rejects a write because it has already accepted a newer token for the same
// resource. The write changed nothing. Match it with errors.Is.
var ErrStaleToken = errors.New("fence: stale token")

// ErrOutcomeUnknown is matched by the error a guard returns when a write was
// sent to the store but its outcome could not be learned: the context ended
// or the connection broke while the request was in flight, or the store's
// answer could not settle it. The write may or may not have been applied,
// now or later (a statement blocked on a lock can still commit after its
// client gave up); it is never reported as success, and never as a clean
// rejection. Read the resource again to learn what happened. Both guards
// (sqlguard, blobguard) use this one sentinel, so that callers handle "maybe"
// the same way whatever the store (docs/design.md, invariant 6: an
// ambiguous outcome is reported as such).
var ErrOutcomeUnknown = errors.New("fence: write outcome unknown")

// StaleError is the rich form of ErrStaleToken. It says which resource
// rejected the write, the token the writer presented and the newest token the
// resource had accepted when it rejected the write. errors.Is(err,
// ErrStaleToken) is true for every *StaleError.
type StaleError struct {
	// Resource names what was written: a table row, an object key, a
	// resource name. Its format is the guard's; it is for humans and logs.
	Resource string
	// Presented is the token the rejected write carried.
	Presented Token
	// Current is the newest token the resource had accepted, as observed
	// by the guard when the write was rejected (> Presented), or None when
	// the guard could not learn it (each guard documents when); the
	// rejection stands either way.
	Current Token
}

// Error describes the rejection with both tokens.
func (e *StaleError) Error() string {
	if e.Current == None {
		return fmt.Sprintf("fence: stale token for %s: presented %d, current unknown", e.Resource, e.Presented)
	}
	return fmt.Sprintf("fence: stale token for %s: presented %d, current %d", e.Resource, e.Presented, e.Current)
}

// Is reports whether target is ErrStaleToken, so that errors.Is(err,
// ErrStaleToken) matches a *StaleError anywhere in a wrapped chain.
func (e *StaleError) Is(target error) bool { return target == ErrStaleToken }

// Stale returns a *StaleError for resource with the presented and current
// tokens.
func Stale(resource string, presented, current Token) *StaleError {
	return &StaleError{Resource: resource, Presented: presented, Current: current}
}

// AsStale returns the *StaleError in err's chain, if there is one.
func AsStale(err error) (*StaleError, bool) {
	var se *StaleError
	if errors.As(err, &se) {
		return se, true
	}
	return nil, false
}

type ctxKey struct{}

// NewContext returns a copy of ctx that carries token t. Guards do not read
// the context on their own; it is a convenience for passing a token through
// layers of your code that already pass a context.
func NewContext(ctx context.Context, t Token) context.Context {
	return context.WithValue(ctx, ctxKey{}, t)
}

// FromContext returns the token stored in ctx by NewContext, and whether one
// was there. A stored zero token is reported as absent.
func FromContext(ctx context.Context) (Token, bool) {
	t, ok := ctx.Value(ctxKey{}).(Token)
	if !ok || t == None {
		return None, false
	}
	return t, true
}
