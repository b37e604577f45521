package lease

import (
	"context"
	"fmt"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/fencekit/fencekit/fence"
)

// Request asks a Backend for one grant of a lease.
type Request struct {
	// Name is the lease name, already validated by the Manager
	// (ValidateName).
	Name string
	// Owner identifies the grant. The Manager makes a new, random owner
	// for every Acquire call (all attempts of one call share it), so an
	// owner is never reused by another grant.
	Owner string
	// TTL is the validity asked for: how long the store should keep the
	// grant after it processes the request. The Manager has checked it
	// against the backend's Limits.
	TTL time.Duration
	// Notify receives what the backend learns about this grant on its own,
	// outside a call (see Notifier). It is never nil when the Manager sends
	// the request; a backend called directly (a test) may get nil and must
	// then not call it.
	Notify Notifier
}

// Grant is one grant of a lease, as the store made it. The Manager passes it
// back, unchanged, to Renew, RenewBatch and Release.
type Grant struct {
	// Name and Owner repeat the Request.
	Name, Owner string
	// Token is the fencing token minted atomically with the grant: never 0,
	// and strictly greater than every token granted before for Name.
	Token fence.Token
	// TTL is the validity the store granted, which may be longer than the
	// one asked for (a store that rounds TTLs up or has a minimum) but
	// never shorter: the Manager gives back a grant shorter than asked.
	// The local deadline counts it from the send time of the request that
	// last confirmed the grant.
	TTL time.Duration
	// State is the backend's own per-grant state (a lease ID, a node path,
	// a pinned connection). The Manager never reads it.
	State any
}

// Limits are the TTLs a backend can honour. NewManager rejects a TTL outside
// them before any I/O.
type Limits struct {
	// MinTTL is the shortest TTL the store can keep alive. 0 means 1
	// millisecond.
	MinTTL time.Duration
	// MaxTTL is the longest TTL the store can keep; 0 means no limit.
	MaxTTL time.Duration
	// Resolution is the unit the store counts TTLs in: a TTL must be a
	// whole multiple of it (Redis: 1 ms; etcd: 1 s). 0 means 1 ms.
	Resolution time.Duration
	// SelfRenewing is set by a backend whose store keeps each grant alive
	// by itself (a session or a keep-alive stream). The Manager then sends
	// no heartbeats: the backend reports each confirmation through
	// Notifier.Confirmed, and a loss through Notifier.Lost. Lease.Renew
	// still calls Backend.Renew, as an explicit check. The grant must still
	// end at the store once it has not been confirmed for its TTL (a
	// session that outlives its holder's lease must not keep the name), or
	// the conformance suite's expiry check fails.
	SelfRenewing bool
}

// Notifier is how a backend reports what it learns about a grant outside a
// call: a session that expired, a pinned connection that broke, a keep-alive
// that the store confirmed. Its methods are safe for concurrent use from any
// goroutine, never block, and do nothing once the lease has ended.
type Notifier interface {
	// Confirmed reports that the store confirmed the grant in answer to a
	// request sent at sent (read from time.Now, so that it carries a
	// monotonic reading, just before the request went out): the store keeps
	// the grant for at least its TTL from then. The Manager moves the
	// local deadline to sent + TTL - safety margin if that is later.
	Confirmed(sent time.Time)
	// Lost reports that the store no longer holds the grant, or that the
	// backend can no longer tell (a session expired or was replaced). The
	// lease ends at once as lost, with cause as its LostError.Cause: as
	// LostExpired if cause matches ErrExpiredAtStore, else as
	// LostTakenOver.
	Lost(cause error)
}

// Backend is a store that can hold leases. Each of Acquire, Renew and Release
// is one atomic step at the store (a single script or transaction, one round
// trip where the store allows). Every backend must pass the suite in package
// leasetest.
//
// The Manager owns time and the token rules: it computes local deadlines,
// schedules heartbeats (unless the backend is SelfRenewing), and gives back
// grants that arrive too late. A backend owns only the store's side.
//
// A Grant made by one Backend may be released (and, where the backend says
// so, renewed) through another Backend of the same store and namespace: the
// conformance suite does so, across connections.
//
// The context bounds the single request, not the lease.
type Backend interface {
	// Limits returns the TTLs the backend can honour. It must not change
	// over the backend's life and does no I/O.
	Limits() Limits

	// Acquire grants req.Name to req.Owner if no one holds it, with a
	// fencing token minted atomically with the grant. If req.Owner already
	// holds it (a retried request whose reply was lost), it extends the
	// grant and returns the token already granted. If another owner holds
	// it, it returns an error matching ErrNotAcquired, ideally a
	// *NotAcquiredError with RetryAfter set. It never returns a Grant
	// together with an error.
	//
	// It refuses, with an error matching ErrNotAcquired, an owner the store
	// has recorded as ended (by Release or Abandon) within
	// EndedOwnerTTL(req.TTL): an acquire request can reach the store after
	// its sender stopped waiting for it, even after the grant a retry of
	// it got was used and released, and the store must not then grant the
	// name to an owner nobody holds.
	Acquire(ctx context.Context, req Request) (Grant, error)

	// Renew confirms that the store still names g.Owner with g.Token as the
	// holder of g.Name and extends the grant to g.TTL from now, or returns
	// an error matching ErrNotHeld if it does not (compare-and-extend). It
	// never grants a lease that is not held.
	Renew(ctx context.Context, g Grant) error

	// Release ends the grant if the store still names g.Owner with g.Token
	// as the holder (compare-and-delete), waking waiters where the backend
	// implements Watcher, and returns an error matching ErrNotHeld
	// otherwise. It frees what the backend keeps for the grant (g.State)
	// whatever the outcome.
	//
	// Ended owners are remembered: whatever its outcome, Release records
	// g.Owner as ended at the store for at least EndedOwnerTTL(g.TTL),
	// and how. A Release resent after the first one was applied (its
	// reply lost: go-redis resends a script on a new connection, a
	// ZooKeeper client resends after a reconnect) gets the first one's
	// answer again: nil when that one released the grant (or Abandon had
	// ended it), never ErrNotHeld, because a release that may have been
	// applied is a release, not a loss; ErrNotHeld when the first found
	// the grant already lost. Acquire refuses an ended owner (see
	// Acquire).
	Release(ctx context.Context, g Grant) error

	// Abandon is sent for an acquire request whose outcome the Manager
	// will never learn (it stopped waiting: the attempt outlived the
	// lease's validity, or the caller's context ended while it was in
	// flight). It ends whatever grant req.Owner holds of req.Name, whatever
	// its token, waking waiters if it ends one, and records req.Owner as
	// ended for at least EndedOwnerTTL(req.TTL), so that the abandoned
	// request, if it reaches the store later, is refused. It returns nil
	// whether or not the owner held anything, and the store's error when
	// it could not be reached.
	Abandon(ctx context.Context, req Request) error
}

// EndedOwnerTTL is how long a store must remember an owner it ended
// (Backend.Release, Backend.Abandon) for leases with the given TTL: twice
// the TTL, and at least 10 seconds. An acquire request delayed longer than
// that (in a proxy, a network partition) can still grant the name to an
// owner nobody holds; that grant then lasts one TTL, as a crashed holder's
// would.
func EndedOwnerTTL(ttl time.Duration) time.Duration {
	return max(2*ttl, 10*time.Second)
}

// BatchRenewer is implemented by backends that can renew many grants in one
// round trip (Redis: a pipeline of renew scripts). The Manager then sends the
// heartbeats that fall due within Options.RenewBatchWindow of each other
// together.
type BatchRenewer interface {
	// RenewBatch renews every grant as Renew would and calls done once per
	// grant, with the grant's index in gs and its outcome (nil,
	// ErrNotHeld, or the store's error), as soon as that outcome is known:
	// a store spread over several nodes (a Redis Cluster) reports each
	// node's grants when that node answers, so that one stalled node does
	// not hold up the leases on the others until their deadlines pass.
	// done may be called from any goroutine, concurrently; RenewBatch
	// returns only after every call of done has returned. ctx bounds the
	// whole batch.
	RenewBatch(ctx context.Context, gs []Grant, done func(i int, err error))
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
