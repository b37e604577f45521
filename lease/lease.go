package lease

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
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
// name. Do the guarded work under that
// context and present Token to every fenced write: the context stops work
// promptly when the lease is lost, and the token makes the store reject the
// writes of a holder that was paused past its deadline.
type Lease struct {
	e       *engine // does all of this lease's store I/O
	g       driver.Grant
	granted time.Time       // send time of the request that proved the grant (the acquire's, or driver.Grant.Sent)
	parent  context.Context // the acquire call's context, for its values

	mu       sync.Mutex
	st       state
	ctx      *leaseContext           // made on first use
	cancel   context.CancelCauseFunc // cancels ctx
	stop     context.Context         // done when Release begins: cuts in-flight renews
	stopFn   context.CancelFunc
	drained  chan struct{} // closed when the last in-flight renew answers, while a release waits
	reported bool          // the end was reported; ctx, if made now, starts cancelled
	onEnd    func(error)   // called once by report, before ctx is cancelled (see whenEnded)
	// reportDone is set once the first report has cancelled ctx; reportCh,
	// made only by a Release that must wait for a report under way on
	// another goroutine, is closed then.
	reportDone bool
	reportCh   chan struct{}

	// releasing is set while a Release call runs (guarded by mu): Release
	// calls are serialised, and one that finds another under way waits on
	// releaseWait, made only then. A channel, not a mutex held across the
	// store's I/O: a goroutine waiting on it is durably blocked, as
	// testing/synctest needs to advance virtual time.
	releasing   bool
	releaseWait chan struct{}

	dl, hb entry // the deadline and the next heartbeat, in the Manager's scheduler

	// Copies of st.deadline and st.end for Err and Deadline, which read
	// them without the lock: a holder may check its lease before every
	// write, and must not contend with the scheduler ending thousands.
	deadlineNs atomic.Int64          // st.deadline on the Manager's monotonic clock (Manager.since)
	endP       atomic.Pointer[error] // a copy of st.end once it is set (ErrReleased may become a *LostError when the store answers a release)
}

// apply runs the transition function and publishes the result; mu must be
// held.
func (l *Lease) apply(ev event) effect {
	eff := l.st.apply(ev, l.g.Name, l.g.Token)
	l.deadlineNs.Store(int64(l.e.since(l.st.deadline)))
	if end := l.st.end; end != nil {
		if p := l.endP.Load(); p == nil || *p != end {
			l.endP.Store(endPointer(end))
		}
	}
	return eff
}

// errReleasedP is the copy of ErrReleased that endP points at for a
// released lease, so that a release allocates nothing for it.
var errReleasedP = func() *error { e := ErrReleased; return &e }()

// endPointer returns a pointer to a copy of end, which Err reads without
// the lock. (The copy is made only here: a variable whose address is
// taken would be allocated on every call of apply.)
func endPointer(end error) *error {
	if end == ErrReleased {
		return errReleasedP
	}
	p := new(error)
	*p = end
	return p
}

func newLease(e *engine, parent context.Context) *Lease {
	l := &Lease{e: e, parent: parent}
	l.dl = entry{l: l, idx: -1}
	l.hb = entry{l: l, idx: -1}
	return l
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
	return l.e.epoch.Add(time.Duration(l.deadlineNs.Load()))
}

// Context returns a context that is cancelled when the lease is lost or
// released; context.Cause then returns the same error as Err. Its Err method
// reads the clock as Lease.Err does. It carries the lease's token
// (fence.FromContext) and the values of the context passed to Acquire, but
// not that context's cancellation.
func (l *Lease) Context() context.Context {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.context()
}

// context makes the lease's context on first use; mu must be held.
func (l *Lease) context() *leaseContext {
	if l.ctx == nil {
		inner, cancel := context.WithCancelCause(fence.NewContext(context.WithoutCancel(l.parent), l.g.Token))
		l.ctx, l.cancel = &leaseContext{Context: inner, l: l}, cancel
		if l.reported {
			cancel(l.st.end)
		}
	}
	return l.ctx
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
func (l *Lease) Done() <-chan struct{} { return l.Context().Done() }

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
	if p := l.endP.Load(); p != nil {
		return *p
	}
	if l.e.since(time.Now()) < time.Duration(l.deadlineNs.Load()) {
		return nil
	}
	l.checkDeadline()
	if p := l.endP.Load(); p != nil {
		return *p
	}
	return nil
}

// checkDeadline ends the lease if its local deadline has passed, without
// waiting for the scheduler.
func (l *Lease) checkDeadline() {
	l.mu.Lock()
	eff := l.apply(event{kind: evDeadline, at: time.Now()})
	l.mu.Unlock()
	l.finish(eff)
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
	return l.e.renew(ctx, l)
}

// beginRenew lets one renew request through the gate: only while the lease
// is held and before its deadline. It returns the deadline that bounds the
// request and a context that is done when Release begins.
func (l *Lease) beginRenew() (time.Time, context.Context, error) {
	now := time.Now()
	l.mu.Lock()
	eff := l.apply(event{kind: evRenewBegin, at: now})
	deadline := l.st.deadline
	if l.stop == nil && eff.refused == nil {
		l.stop, l.stopFn = context.WithCancel(context.Background())
	}
	stop := l.stop
	l.mu.Unlock()
	l.finish(eff)
	return deadline, stop, eff.refused
}

// endRenew applies the outcome err of a renew request sent at sent and
// returns what Renew returns. giveBack is true when the store renewed a
// grant that had already ended here: the caller should give it back
// (engine.giveBack), after answering everyone else waiting on the
// same reply.
func (l *Lease) endRenew(sent time.Time, latency time.Duration, err error) (_ error, giveBack bool) {
	l.e.o.Observer.Renewed(RenewedEvent{Ctx: l.parent, Name: l.g.Name, Token: l.g.Token, Sent: sent, Latency: latency, Err: err})
	l.mu.Lock()
	eff := l.apply(event{kind: evRenewEnd, at: sent, err: err})
	if err != nil && !eff.ended {
		// A failed renew answered at or past the deadline (a store that
		// hung until the request's own deadline): end the lease here
		// rather than leave it to the scheduler, which may be ending
		// thousands of others at this very instant.
		if e := l.apply(event{kind: evDeadline, at: time.Now()}); e.ended {
			eff.ended, eff.reason = true, e.reason
		}
	}
	if eff.moved {
		l.e.sched.setDeadline(&l.dl, l.st.deadline)
	}
	if eff.drained && l.drained != nil {
		close(l.drained)
		l.drained = nil
	}
	ph, end := l.st.phase, l.st.end
	l.mu.Unlock()
	l.finish(eff)
	switch {
	case ph == releasing:
		return ErrReleased, eff.giveBack
	case end != nil:
		return end, eff.giveBack
	case err != nil:
		return fmt.Errorf("lease: renew %q (token %d): %w", l.g.Name, l.g.Token, err), eff.giveBack
	}
	return nil, eff.giveBack
}

// scheduleHeartbeat queues the next heartbeat after one sent at sent.
func (l *Lease) scheduleHeartbeat(sent time.Time, err error) {
	next := sent.Add(l.e.o.RenewInterval)
	if err != nil {
		next = time.Now().Add(l.e.o.RenewRetryInterval)
		l.e.o.Logger.Debug("lease: renew failed, will retry", "name", l.g.Name, "err", err)
	}
	l.mu.Lock()
	if l.st.phase == held {
		l.e.sched.setHeartbeat(&l.hb, next)
	}
	l.mu.Unlock()
}

// finish carries out the effect of a transition that ended the lease: it
// unschedules it, reports it and cancels its context. It does nothing for
// other effects.
func (l *Lease) finish(eff effect) {
	if !eff.ended {
		return
	}
	l.e.sched.remove(l)
	l.report(eff)
}

// report tells the Observer and the log that the lease ended, then cancels
// its context: whoever waits on Done sees the event already counted. It does
// nothing unless eff ended the lease.
func (l *Lease) report(eff effect) {
	if !eff.ended {
		return
	}
	end := *l.endP.Load() // set by the transition that ended the lease
	if eff.reason != "" {
		l.e.o.Observer.Lost(LostEvent{Ctx: l.parent, Name: l.g.Name, Token: l.g.Token, Reason: eff.reason, Held: time.Since(l.granted), Err: end})
		if l.e.o.Logger.Enabled(context.Background(), slog.LevelWarn) {
			var cause error
			if le, ok := end.(*LostError); ok {
				cause = le.Cause
			}
			l.e.o.Logger.Warn("lease: lost", "name", l.g.Name, "token", uint64(l.g.Token), "reason", string(eff.reason), "err", cause)
		}
	}
	l.mu.Lock()
	first := !l.reported // a released lease is reported again if the store says it was lost
	l.reported = true
	cancel := l.cancel // a context made from now on starts cancelled
	onEnd := l.onEnd
	l.onEnd = nil
	l.mu.Unlock()
	if onEnd != nil {
		onEnd(end)
	}
	if cancel != nil {
		cancel(end)
	}
	if first {
		l.mu.Lock()
		l.reportDone = true
		ch := l.reportCh
		l.mu.Unlock()
		if ch != nil {
			close(ch)
		}
	}
}

// waitReported returns once the lease's end has been reported and its
// Context cancelled, by this goroutine or another. It allocates only when
// it has to wait.
func (l *Lease) waitReported() {
	l.mu.Lock()
	if l.reportDone {
		l.mu.Unlock()
		return
	}
	if l.reportCh == nil {
		l.reportCh = make(chan struct{})
	}
	ch := l.reportCh
	l.mu.Unlock()
	<-ch
}

// whenEnded arranges for f to be called once with the lease's end, by the
// goroutine that ends it, before its Context is cancelled and before a
// release is sent to the store; at once, on this goroutine, if the lease
// has ended already. One f per lease (a later call replaces it).
func (l *Lease) whenEnded(f func(end error)) {
	l.mu.Lock()
	if !l.reported {
		l.onEnd = f
		l.mu.Unlock()
		return
	}
	l.mu.Unlock()
	f(*l.endP.Load())
}

// Release ends the lease and frees its name at the store. In this order:
// it ends the lease for its holder (Err returns ErrReleased, the Context is
// cancelled with ErrReleased as its cause, renewals stop, and work derived
// from the Context is told to stop), then it deletes the grant at the store
// if the store still names this holder (compare-and-delete), which wakes
// waiters. The lease is never valid while the request that frees it is in
// flight: a waiter granted the name the moment the store frees it never
// overlaps this holder's validity (DESIGN.md invariant 1). Release does not
// wait for work running under the Context to return: work that ignores its
// Context is no longer exclusive, and only fenced writes stay safe.
//
// A renew request already in flight when Release begins is cut short and
// answered before the release is sent, and its answer does not decide the
// outcome.
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
	l.beginReleaseCall()
	defer l.endReleaseCall()
	return l.e.release(ctx, l)
}

// beginReleaseCall waits until no other Release call runs on l, and marks
// this one as running.
func (l *Lease) beginReleaseCall() {
	l.mu.Lock()
	for l.releasing {
		if l.releaseWait == nil {
			l.releaseWait = make(chan struct{})
		}
		ch := l.releaseWait
		l.mu.Unlock()
		<-ch
		l.mu.Lock()
	}
	l.releasing = true
	l.mu.Unlock()
}

// endReleaseCall ends the running Release call and wakes those waiting.
func (l *Lease) endReleaseCall() {
	l.mu.Lock()
	l.releasing = false
	ch := l.releaseWait
	l.releaseWait = nil
	l.mu.Unlock()
	if ch != nil {
		close(ch)
	}
}
