// Package driver is the contract between the lease Manager (package
// lease) and the stores that hold leases, as database/sql/driver is beside
// database/sql: everything a backend implements (Backend and the optional
// capabilities BatchRenewer, Watcher, Inspector, Checker, Lister, Revoker,
// and a line of waiters declared in Limits.Queues) and everything it
// calls or returns (Request, Grant, Limits, Notifier, the errors). A backend
// imports this package and fence, never package lease; users of the Manager
// rarely need it.
//
// Every backend must pass the conformance suite in package leasetest, which
// checks each rule below against the real store.
//
// # Capabilities
//
// A backend implements Backend. It may also implement, and the Manager
// finds them by type assertion:
//
//   - BatchRenewer: many renewals in one round trip (Redis pipelines).
//   - Watcher: wake waiters on release instead of polling.
//   - Inspector: say who holds a lease (Manager.Holder, Election.Leader).
//   - Checker: check the store's setup before any lease (Manager.Check).
//   - Lister: list the leases of the namespace with their holders and
//     waiters (fencekit lease ls, show, watch).
//   - Revoker: end a grant from outside the holder's process, so that the
//     next grant gets a greater token (fencekit lease revoke).
//
// and may declare, in Limits.Queues, that it keeps blocked acquires in a
// line at the store (lease.Options.FIFO): see "Waiters in line" below.
//
// The Manager validates user input (names, TTLs against Limits) before it
// calls a backend: a backend called by the Manager never needs to check
// them again (ValidateName is here for backends called directly).
//
// # Writing a backend
//
// A backend is one store's way of granting, confirming and ending a lease;
// the Manager owns time (local deadlines from send times, heartbeats,
// give-backs of late grants) and the token rules. To add a store:
//
//  1. Implement Backend. Limits states the TTLs the store can keep (its
//     minimum, maximum and resolution: Redis whole milliseconds, etcd whole
//     seconds); lease.NewManager rejects others before any I/O. Acquire grants
//     Request.Name to Request.Owner in one atomic step that also mints the
//     fencing token (a script, a transaction, the store's own revision), and
//     returns a Grant with the TTL the store actually granted (never less
//     than asked) and, in Grant.State, whatever the backend needs later: a
//     lease ID, a node path, a pinned connection. The same owner acquiring
//     again gets its grant back (a retried request whose reply was lost).
//     Renew and Release compare both owner and token at the store and
//     return ErrNotHeld when they do not match; neither ever creates a
//     grant. Map a refusal to *NotAcquiredError (with RetryAfter when the
//     store knows the holder's remaining time). Remember ended owners for
//     EndedOwnerTTL: Release and Abandon record the owner, a Release of an
//     owner already ended returns nil (a client that resent it), and
//     Acquire refuses an ended owner.
//  2. Keeping grants alive is the Manager's: it calls Renew every
//     lease.Options.RenewInterval (implement BatchRenewer to renew many
//     grants in one round trip, reporting each grant's outcome as soon as
//     its node answers). A store whose client also confirms grants by
//     itself (a session, a keep-alive stream) reports each confirmation
//     with Request.Notify.Confirmed, passing the send time of the request
//     the store answered. A backend that learns of a loss on its own (a
//     session expired or was replaced, a pinned connection broke) calls
//     Request.Notify.Lost at once: the lease ends before its deadline.
//  3. Implement Watcher if the store can signal releases (pub/sub, a
//     watch), so that blocked lease.Manager.Acquire calls wake at once.
//  4. Decide and document what tokens do when the store loses its data
//     (a restart without persistence, a restored backup), and make them keep
//     growing if you can: docs/design.md, invariant 2.
//  5. If the store can keep a line, set Limits.Queues and honour
//     Request.Queue (see "Waiters in line" below): Acquire with Queue set
//     registers the owner in arrival order and refreshes its place,
//     Abandon removes the place, and a free name goes to the oldest live
//     waiter. Otherwise leave it unset: a Manager asking for FIFO then
//     fails at lease.NewManager.
//  6. Run package leasetest against the real store, with a LoseData hook,
//     an EndSession hook where the store has sessions, and every capability
//     the store lacks declared in Config.Lacks with its reason.
//
// # Waiters in line
//
// A backend that sets Limits.Queues keeps, per lease name, a line of
// waiters at the store, so that the lease goes to blocked acquires in the
// order they arrived (lease.Options.FIFO) rather than to whichever retries
// first. The contract is one field and three duties, so that Acquire stays
// the only way to be granted a lease and the token rules do not change:
//
//   - Acquire with Request.Queue set grants, as Acquire does, only when the
//     name is free and no live waiter joined the line before req.Owner (or
//     the store handed the name to req.Owner). Otherwise it refuses, as
//     Acquire does, and puts req.Owner at the end of the line if it has no
//     place, or keeps the place it has; either way the place lives at least
//     req.TTL from then. A grant takes the owner out of the line. An owner
//     ended within EndedOwnerTTL is refused and never put in line.
//     The Manager's blocking Acquire sends it at least every TTL/2 while it
//     waits (Options.PollInterval is at most TTL/2 with FIFO), so that a
//     live waiter keeps its place, and a waiter whose process died leaves
//     the line by itself within its TTL.
//   - Abandon also removes req.Owner's place. The Manager sends it when a
//     blocking Acquire gives up (its context ended), so that the waiter
//     behind it is next at once.
//   - When a grant ends (Release, Abandon, expiry), the oldest live waiter
//     is next: the store either keeps the name free for it (the others
//     are refused until it takes it or its place lapses) or hands the name
//     over at once, minting its token then, atomically, as any grant does
//     (its next Acquire then finds the grant, as a retried request would,
//     without a write where the store allows). Tokens still grow strictly
//     in grant order.
//
// A refusal to a waiter that is not first may carry RetryAfter: the time
// left of the grant, or of the place of the waiter ahead, when the name is
// free but kept for it. Acquire without Queue (TryAcquire, a Manager
// without FIFO) ignores the line: it takes a free name ahead of the
// waiters, as today. Where the store hands the name over at once
// (ZooKeeper always; etcd when the grant that ends was made in line) the
// name is not free then, and an acquire without Queue is refused while
// the line holds live waiters. Use one mode per name.
package driver

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/fencekit/fencekit/fence"
	"github.com/fencekit/fencekit/internal/names"
)

var (
	// ErrNotAcquired is returned by a Backend's Acquire when the lease is
	// held by another owner (and by the Manager's TryAcquire and Acquire).
	ErrNotAcquired = errors.New("lease: not acquired")

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
	// ("run fencekit migrate up", the variable to set): return a
	// *SetupError. Acquire, Run and Election.Run return it at once instead
	// of retrying until their context ends; Manager.Check returns it
	// before any lease is asked for. It is fence.ErrSetup itself, the
	// sentinel the guards' setup errors match too: one errors.Is stops a
	// retry loop whichever side is not set up.
	ErrSetup = fence.ErrSetup

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
	// Holder is the current holder as the store reported it (Owner empty
	// when unknown): a backend sets it when its refusal carries it at no
	// extra request; the Manager's blocking Acquire fills it in with one
	// Inspector.Holder read when it gives up.
	Holder Holder
	// Ahead, when not 0, says that no one holds Name but that it is kept
	// for this many live waiters ahead of the owner in line
	// (Request.Queue); RetryAfter is then the time left of the first one's
	// place, when the store knows it.
	Ahead int
}

func (e *NotAcquiredError) Error() string {
	if e.Ahead > 0 {
		return fmt.Sprintf("lease: not acquired: %q is kept for the %d waiter(s) ahead in line", e.Name, e.Ahead)
	}
	who := "another owner"
	if e.Holder.Owner != "" {
		who = e.Holder.Owner
		if e.Holder.Token != fence.None {
			who += fmt.Sprintf(" (token %d)", e.Holder.Token)
		}
	}
	if e.RetryAfter > 0 {
		return fmt.Sprintf("lease: not acquired: %q is held by %s (expires in %v unless renewed)", e.Name, who, e.RetryAfter)
	}
	return fmt.Sprintf("lease: not acquired: %q is held by %s", e.Name, who)
}

// Is makes errors.Is(err, ErrNotAcquired) match.
func (e *NotAcquiredError) Is(target error) bool { return target == ErrNotAcquired }

// SetupError is the rich form of ErrSetup that backends return: a store
// error that retrying cannot fix, and what to do about it. It is
// fence.SetupError, which the guards return too: errors.Is(err, ErrSetup)
// is true for it, and errors.Is/As see the store's error through Unwrap.
// Its text is one line: the store's error followed by the fix in
// parentheses (the fix alone when Err is nil, for a refusal a Check found
// by itself).
type SetupError = fence.SetupError

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
	// Queue asks the backend to keep Owner's place in the line of waiters
	// of Name (see "Waiters in line" in the package doc). The Manager sets
	// it only for the blocking Acquire of a Manager with FIFO, and only
	// when Limits.Queues is set.
	Queue bool
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
	// Sent, when not zero, is the send time (read from time.Now, with its
	// monotonic reading) of an earlier request that the store answered and
	// that proves it keeps the grant for TTL from then: a keep-alive of the
	// store-side lease the grant was made on, sent by an earlier attempt of
	// the same owner, when Acquire proves the grant with a read and extends
	// nothing (etcd's hand-over to a waiter in line). The Manager then
	// counts the local deadline and the first renewal from Sent instead of
	// from the Acquire call; a Sent after the call began is ignored (a
	// deadline is never moved later this way).
	Sent time.Time
}

// Limits are the TTLs a backend can honour, and whether it keeps waiters
// in line (Queues). NewManager rejects a TTL outside them before any I/O.
type Limits struct {
	// MinTTL is the shortest TTL the store can keep alive. 0 means 1
	// millisecond.
	MinTTL time.Duration
	// MaxTTL is the longest TTL the store can keep; 0 means no limit.
	MaxTTL time.Duration
	// Resolution is the unit the store counts TTLs in: a TTL must be a
	// whole multiple of it (Redis: 1 ms; etcd: 1 s). 0 means 1 ms.
	Resolution time.Duration
	// Queues is set by a backend that keeps blocked acquires in line at the
	// store and honours Request.Queue (see "Waiters in line" in the
	// package doc). lease.NewManager refuses Options.FIFO without it.
	Queues bool
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
// schedules heartbeats, and gives back grants that arrive too late. A backend owns only the store's side.
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
	// flight), and, with Limits.Queues, for a waiter that gave up. It
	// removes req.Owner's place in the line of req.Name where the backend
	// keeps one, and ends whatever grant req.Owner holds of req.Name, whatever
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
	return names.Check(ErrInvalidName, "name", name, names.Rules{Max: MaxNameLen, NoControl: true, C1: true})
}

// Inspector is implemented by backends that can say who holds a lease now
// (Redis, PostgreSQL). Manager.Holder and Election.Leader use it.
type Inspector interface {
	// Holder returns the current grant of name as the store sees it, or an
	// error matching ErrNotHeld when no one holds it. ctx bounds the one
	// request.
	Holder(ctx context.Context, name string) (Holder, error)
}

// Holder is the current grant of a lease, as the store sees it.
type Holder struct {
	// Name is the lease name.
	Name string
	// Owner is the grant's owner: the holder Manager's Options.Identity, a
	// slash, and a random suffix.
	Owner string
	// Token is the grant's fencing token.
	Token fence.Token
	// Remaining is how long the store keeps the grant unless it is renewed
	// (0 when the store cannot tell).
	Remaining time.Duration
}

// Identity returns the holder Manager's Options.Identity: Owner without its
// random suffix.
func (h Holder) Identity() string {
	if i := strings.LastIndexByte(h.Owner, '/'); i >= 0 {
		return h.Owner[:i]
	}
	return h.Owner
}

// Checker is implemented by backends that can check, before any lease is
// asked for, that the store is reachable and set up for leases (tables,
// permissions, scripts). Manager.Check uses it.
type Checker interface {
	// Check returns nil when the store can grant leases, an error matching
	// ErrSetup when it answers but is not set up for them (naming the
	// fix), and the store's error when it cannot be reached. ctx bounds
	// the check. It grants, changes and leaves nothing.
	Check(ctx context.Context) error
}
