package lease

import (
	"context"
	"fmt"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/fencekit/fencekit/fence"
)

// Record names one grant of a lease: what a Backend stores and compares.
type Record struct {
	// Name is the lease name, already validated by the Manager.
	Name string
	// Owner identifies this grant. The Manager makes a new, random owner
	// for every Acquire call, so an owner is never reused by another grant.
	Owner string
	// Token is the fencing token of the grant: 0 in Acquire (the backend
	// mints it), the granted token in Renew and Release.
	Token fence.Token
	// TTL is how long the store keeps the grant after it processes an
	// Acquire or Renew, a positive whole number of milliseconds.
	TTL time.Duration
}

// Backend is a store that can hold leases. Each method is one atomic step at
// the store (a single script or transaction, one round trip where the store
// allows). Every backend must pass the suite in package leasetest.
//
// The context bounds the single request, not the lease.
type Backend interface {
	// Acquire grants rec.Name to rec.Owner for rec.TTL if no one holds it,
	// and returns a fencing token minted atomically with the grant:
	// strictly greater than every token granted before for rec.Name, and
	// never 0. If rec.Owner already holds it (a retried request), Acquire
	// extends it to rec.TTL and returns the token already granted. If
	// another owner holds it, Acquire returns an error matching
	// ErrNotAcquired, ideally a *NotAcquiredError with RetryAfter set.
	Acquire(ctx context.Context, rec Record) (fence.Token, error)

	// Renew extends the grant to rec.TTL if the store still names
	// rec.Owner with rec.Token as the holder, and returns ErrNotHeld
	// otherwise. It never grants a lease that is not held.
	Renew(ctx context.Context, rec Record) error

	// Release ends the grant if the store still names rec.Owner with
	// rec.Token as the holder (compare-and-delete), waking waiters where
	// the backend implements Watcher, and returns ErrNotHeld otherwise.
	Release(ctx context.Context, rec Record) error
}

// Watcher is implemented by backends that can tell waiters when a lease is
// released, so that a blocked Acquire wakes at once instead of after a
// polling interval.
type Watcher interface {
	// Watch subscribes to releases of name. It returns once the
	// subscription is active at the store, so a release that happens after
	// Watch returns is signalled on the channel (a buffered channel of
	// size 1: several releases may collapse into one signal). Signals are
	// best effort: a lost connection can drop them, so callers must also
	// poll. stop ends the subscription and must be called exactly once.
	// ctx bounds the subscribe request only.
	Watch(ctx context.Context, name string) (signals <-chan struct{}, stop func(), err error)
}

// MaxNameLen is the longest lease name, in bytes.
const MaxNameLen = 512

// ValidateName returns an error matching ErrInvalidName when name cannot be
// a lease name: empty, longer than MaxNameLen bytes, not valid UTF-8, or
// containing control characters. The Manager calls it before any I/O.
func ValidateName(name string) error {
	switch {
	case name == "":
		return fmt.Errorf("%w: name is empty", ErrInvalidName)
	case len(name) > MaxNameLen:
		return fmt.Errorf("%w: name is %d bytes, the limit is %d", ErrInvalidName, len(name), MaxNameLen)
	case !utf8.ValidString(name):
		return fmt.Errorf("%w: name %q is not valid UTF-8", ErrInvalidName, name)
	}
	for _, r := range name {
		if unicode.IsControl(r) {
			return fmt.Errorf("%w: name %q contains the control character %U", ErrInvalidName, name, r)
		}
	}
	return nil
}
