package lease

import (
	"context"
	"sync/atomic"
	"time"

	"github.com/fencekit/fencekit/fence"
	"github.com/fencekit/fencekit/lease/driver"
)

// Lease is one grant of a lease name to this process. Its methods are safe
// for concurrent use.
//
// A Lease is valid while Err returns nil, and its Context is done from the
// moment it is not (up to a late timer at the local deadline: see Err).
// Release ends the validity before it sends the request that frees the
// name. Do the guarded work under that context and present Token to every
// fenced write: the context stops work promptly when the lease is lost, and
// the token makes the store reject the writes of a holder that was paused
// past its deadline.
//
// A Lease is a view: its Manager alone changes it, and Renew, Release and
// the other methods only ask the Manager to.
type Lease struct {
	k       keeper
	g       driver.Grant
	granted time.Time  // send time of the request that proved the grant (the acquire's, or driver.Grant.Sent)
	epoch   *time.Time // the Manager's monotonic origin, which deadlineNs counts from

	// Published by the keeper at every change, for the methods below,
	// which read them without a lock: a holder may check its lease before
	// every write, and must not contend with the scheduler ending thousands.
	deadlineNs atomic.Int64                 // the local deadline
	end        atomic.Pointer[error]        // why it ended, once it has (ErrReleased may become a *LostError when the store answers a release)
	ctx        atomic.Pointer[leaseContext] // the Context, once made
}

// keeper is the Manager's side of a Lease (engine.go): the only code that
// changes it. A Lease posts events to it and reads what it publishes.
type keeper interface {
	post(ctx context.Context, ev event) effect
}

// Name returns the lease name; for a semaphore's permit, the name of its
// slot (SlotName), which is what the permit's token fences.
func (l *Lease) Name() string { return l.g.Name }

// Owner returns the owner this grant is stored under: the Manager's
// Identity plus a random suffix, unique to this grant.
func (l *Lease) Owner() string { return l.g.Owner }

// Token returns the fencing token of this grant: never 0, and greater than
// every token granted before for this name. Present it to every fenced
// write (packages sqlguard and blobguard).
func (l *Lease) Token() fence.Token { return l.g.Token }

// TTL returns the validity the store granted: the TTL asked for, or more
// where the store rounds TTLs up (see the backend's Limits).
func (l *Lease) TTL() time.Duration { return l.g.TTL }

// Deadline returns the local deadline: when the last request the store
// confirmed (acquire or renew) was sent, plus the granted TTL, minus the
// safety margin. The time carries a monotonic clock reading, so
// time.Until(l.Deadline()) is immune to wall-clock steps. From that instant
// on, the lease is lost.
func (l *Lease) Deadline() time.Time {
	return l.epoch.Add(time.Duration(l.deadlineNs.Load()))
}

// Context returns a context that is cancelled when the lease is lost or
// released; context.Cause then returns the same error as Err. Its Err method
// reads the clock as Lease.Err does. It carries the lease's token
// (fence.FromContext) and the values of the context passed to Acquire, but
// not that context's cancellation.
func (l *Lease) Context() context.Context { return l.context() }

// context returns the lease's context, asking the keeper to make it on
// first use.
func (l *Lease) context() *leaseContext {
	if c := l.ctx.Load(); c != nil {
		return c
	}
	l.k.post(noCaller, event{kind: evContext})
	return l.ctx.Load()
}

// leaseContext is the lease's context: a cancel-cause context whose Err also
// checks the local deadline. Children attach to the inner context directly
// (it answers Value for the context package's own key), so they cost no
// goroutine.
type leaseContext struct {
	context.Context
	l *Lease
}

func (c *leaseContext) Err() error {
	_ = c.l.Err() // ends the lease at its deadline, if the scheduler has not yet
	return c.Context.Err()
}

// Done returns a channel that is closed when the lease is lost or released.
func (l *Lease) Done() <-chan struct{} { return l.context().Done() }

// Err returns nil while the lease is held, ErrReleased from the moment
// Release begins (before its request is sent), and a *LostError (matching
// ErrLost) after the lease was lost, including when Release found that the
// store had already let it go (Err then changes from ErrReleased to that
// *LostError when the store answers; the Context's cause stays
// ErrReleased).
//
// It reads the monotonic clock and never returns nil when called at or past
// the local deadline, even if the Manager has not yet ended the lease: it
// then ends the lease itself. It takes no lock while the lease is valid.
func (l *Lease) Err() error {
	if p := l.end.Load(); p != nil {
		return *p
	}
	now := time.Now()
	if now.Sub(*l.epoch) < time.Duration(l.deadlineNs.Load()) {
		return nil
	}
	l.k.post(noCaller, event{kind: evDeadline, at: now})
	if p := l.end.Load(); p != nil {
		return *p
	}
	return nil
}

// Renew extends the lease now, in one request, and moves the local deadline
// to the send time of that request plus the TTL minus the safety margin. The
// request is bounded by ctx and by the current local deadline. Automatic
// renewal (on by default) sends the same request.
//
// Errors: a *LostError (ErrLost) if the store no longer names this holder,
// in which case the lease ends at once, or if it was already lost;
// ErrReleased once Release has begun; otherwise the store's error, after
// which the lease stays valid until its local deadline.
func (l *Lease) Renew(ctx context.Context) error {
	return l.k.post(ctx, event{kind: evRenewBegin, at: time.Now()}).result
}

// Release ends the lease and frees its name at the store. In this order:
// it ends the lease for its holder (Err returns ErrReleased, the Context is
// cancelled with ErrReleased as its cause, renewals stop, and work derived
// from the Context is told to stop), then it deletes the grant at the store
// if the store still names this holder (compare-and-delete), which wakes
// waiters. The lease is never valid while the request that frees it is in
// flight: a waiter granted the name the moment the store frees it never
// overlaps this holder's validity (docs/design.md, invariant 1). Release does not
// wait for work running under the Context to return: work that ignores its
// Context is no longer exclusive, and only fenced writes stay safe.
//
// A renew request already in flight when Release begins is cut short and
// answered before the release is sent, and its answer does not decide the
// outcome; so is the give-back of a grant that a late renewal renewed
// after the lease was lost: unless ReleaseTimeout runs out first, nothing
// more is sent for the lease once Release returns. Release calls on one
// lease run one at a time.
//
// ctx bounds the request while it is live; if it is already done, Release
// uses a detached context, so a deferred Release works after the work's
// context was cancelled. Either way the request is bounded by
// Options.ReleaseTimeout.
//
// It returns nil when the grant was released (also when the store had
// already released it for an earlier request of this Release whose reply
// was lost), and again when called after that. It returns a *LostError
// (ErrLost) when the lease had been lost, or the store no longer named this
// holder, and again when called after that. It returns the store's error
// when the store could not be reached; the lease has ended locally anyway
// (ErrReleased), the grant expires after its TTL, and calling Release again
// retries the delete.
func (l *Lease) Release(ctx context.Context) error {
	return l.k.post(ctx, event{kind: evRelease}).result
}

// whenEnded arranges for f to be called once with the lease's end, by the
// goroutine that ends it, before its Context is cancelled and before a
// release is sent to the store; at once, on this goroutine, if the lease
// has ended already. One f per lease (a later call replaces it).
func (l *Lease) whenEnded(f func(end error)) {
	l.k.post(noCaller, event{kind: evWhenEnded, onEnd: f})
}
