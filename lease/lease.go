package lease

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/fencekit/fencekit/fence"
)

type state int

const (
	held      state = iota
	releasing       // Release is at the store: no new renewals, the deadline still counts
	lost
	released
)

// live reports whether the lease has not ended (held, or being released).
func (s state) live() bool { return s == held || s == releasing }

// Lease is one grant of a lease name to this process. Its methods are safe
// for concurrent use.
//
// A Lease is valid until its Context is done. Do the guarded work under that
// context and present Token to every fenced write: the context stops work
// promptly when the lease is lost, and the token makes the store reject the
// writes of a holder that was paused past its deadline.
type Lease struct {
	m       *Manager
	rec     Record
	granted time.Time

	ctx    context.Context
	cancel context.CancelCauseFunc

	mu       sync.Mutex
	state    state
	deadline time.Time   // local deadline, with a monotonic reading
	timer    *time.Timer // fires at deadline
	endErr   error       // nil while held
	lastErr  error       // last renew error, for LostError.Cause

	renewTimer    *time.Timer // the heartbeat; nil without automatic renewal
	releaseMu     sync.Mutex  // serialises Release
	storeReleased bool        // the store confirmed the release (or there is nothing to release)
}

func newLease(m *Manager, parent context.Context, rec Record, sent, deadline time.Time) *Lease {
	ctx, cancel := context.WithCancelCause(fence.NewContext(context.WithoutCancel(parent), rec.Token))
	l := &Lease{
		m: m, rec: rec, granted: sent,
		ctx: ctx, cancel: cancel,
		deadline: deadline,
	}
	l.mu.Lock()
	l.timer = time.AfterFunc(time.Until(deadline), l.onDeadline)
	if !m.o.DisableAutoRenew {
		// Counted from the send time, like the deadline: a slow reply must
		// not push the first renewal towards the deadline.
		l.renewTimer = time.AfterFunc(m.renewDelay(sent.Add(m.o.RenewInterval)), l.heartbeat)
	}
	l.mu.Unlock()
	return l
}

// Name returns the lease name.
func (l *Lease) Name() string { return l.rec.Name }

// Owner returns the owner this grant is stored under: the Manager's
// Identity plus a random suffix, unique to this grant.
func (l *Lease) Owner() string { return l.rec.Owner }

// Token returns the fencing token of this grant: never 0, and greater than
// every token granted before for this name. Present it to every fenced
// write (packages sqlguard and blobguard).
func (l *Lease) Token() fence.Token { return l.rec.Token }

// TTL returns the lease's time to live at the store.
func (l *Lease) TTL() time.Duration { return l.rec.TTL }

// Deadline returns the local deadline: when the last successful acquire or
// renew request was sent, plus the TTL, minus the safety margin. The time
// carries a monotonic clock reading, so time.Until(l.Deadline()) is immune
// to wall-clock steps. Past it the lease is lost.
func (l *Lease) Deadline() time.Time {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.deadline
}

// Context returns a context that is cancelled when the lease is lost or
// released; context.Cause then returns the same error as Err. It carries
// the lease's token (fence.FromContext) and the values of the context
// passed to Acquire, but not that context's cancellation.
func (l *Lease) Context() context.Context { return l.ctx }

// Done returns a channel that is closed when the lease is lost or released.
func (l *Lease) Done() <-chan struct{} { return l.ctx.Done() }

// Err returns nil while the lease is held, ErrReleased after Release, and a
// *LostError (matching ErrLost) after the lease was lost, including when
// Release found that the store had already let it go.
func (l *Lease) Err() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.endErr
}

// Renew extends the lease now, in one request, and moves the local deadline
// to the send time of that request plus TTL minus the safety margin. The
// request is bounded by ctx and by the current local deadline. Automatic
// renewal (on by default) calls the same code.
//
// Errors: a *LostError (ErrLost) if the store no longer names this holder,
// in which case the lease ends at once, or if it was already lost;
// ErrReleased after Release; otherwise the store's error, after which the
// lease stays valid until its local deadline.
func (l *Lease) Renew(ctx context.Context) error {
	deadline, err := l.renewable()
	if err != nil {
		return err
	}
	rctx, cancel := context.WithDeadline(ctx, deadline)
	defer cancel()
	sent := time.Now()
	err = l.m.b.Renew(rctx, l.rec)
	err, giveBack := l.renewed(sent, time.Since(sent), err)
	if giveBack {
		l.m.releaseQuietly(ctx, l.rec)
	}
	return err
}

// renewable returns the local deadline of a held lease, or the error that
// ended it.
func (l *Lease) renewable() (time.Time, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	switch l.state {
	case held:
		return l.deadline, nil
	case releasing:
		return time.Time{}, ErrReleased
	}
	return time.Time{}, l.endErr
}

// renewed applies the outcome err of a renew request sent at sent and
// returns Renew's result. giveBack is true when the renewal succeeded at the
// store after the lease was lost: the store still names this holder, and
// the caller should give the grant back (Manager.releaseQuietly) so that
// others need not wait a TTL.
func (l *Lease) renewed(sent time.Time, latency time.Duration, err error) (_ error, giveBack bool) {
	l.m.o.Observer.Renewed(RenewedEvent{Name: l.rec.Name, Token: l.rec.Token, Sent: sent, Latency: latency, Err: err})
	switch {
	case err == nil:
		if l.extend(sent) {
			return nil, false
		}
		end := l.Err()
		return end, errors.Is(end, ErrLost)
	case errors.Is(err, ErrNotHeld):
		l.lose(LostTakenOver, err)
		return l.Err(), false
	default:
		l.mu.Lock()
		l.lastErr = err
		l.mu.Unlock()
		return fmt.Errorf("lease: renew %q (token %d): %w", l.rec.Name, l.rec.Token, err), false
	}
}

// extend moves the deadline after a renew sent at sent succeeded, and
// reports whether the lease is still held.
func (l *Lease) extend(sent time.Time) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if !l.state.live() {
		return false
	}
	l.lastErr = nil
	if d := sent.Add(l.m.o.TTL - l.m.o.SafetyMargin); d.After(l.deadline) {
		l.deadline = d
		l.timer.Reset(time.Until(d))
	}
	return true
}

// stopTimers stops the deadline and renew timers; mu must be held.
func (l *Lease) stopTimers() {
	l.timer.Stop()
	if l.renewTimer != nil {
		l.renewTimer.Stop()
	}
}

// onDeadline runs when the deadline timer fires.
func (l *Lease) onDeadline() {
	l.mu.Lock()
	if !l.state.live() {
		l.mu.Unlock()
		return
	}
	if d := time.Until(l.deadline); d > 0 {
		// A renewal moved the deadline after the timer had fired.
		l.timer.Reset(d)
		l.mu.Unlock()
		return
	}
	l.mu.Unlock()
	l.lose(LostExpired, nil)
}

// lose ends a live lease as lost, once.
func (l *Lease) lose(reason LostReason, cause error) {
	l.mu.Lock()
	if !l.state.live() {
		l.mu.Unlock()
		return
	}
	if cause == nil {
		cause = l.lastErr
	}
	err := &LostError{Name: l.rec.Name, Token: l.rec.Token, Reason: reason, Cause: cause}
	l.state, l.endErr = lost, err
	if reason == LostTakenOver {
		l.storeReleased = true // the store holds nothing of ours
	}
	l.stopTimers()
	l.mu.Unlock()
	// Report before cancelling, so that whoever waits on Done sees the event
	// already counted.
	l.m.o.Observer.Lost(LostEvent{Name: l.rec.Name, Token: l.rec.Token, Reason: reason, Held: time.Since(l.granted), Err: err})
	l.m.o.Logger.Warn("lease: lost", "name", l.rec.Name, "token", uint64(l.rec.Token), "reason", string(reason), "err", cause)
	l.cancel(err)
}

// heartbeat runs on the renew timer: it renews the lease and schedules the
// next renewal RenewInterval after this one began, or a retry
// RenewRetryInterval after it when the store failed transiently, until the
// lease ends. No goroutine waits
// between renewals.
func (l *Lease) heartbeat() {
	start := time.Now()
	next := l.m.o.RenewInterval
	var err error
	if b := l.m.batcher; b != nil {
		err = b.renew(l)
	} else {
		err = l.Renew(l.ctx)
	}
	if err != nil {
		next = l.m.o.RenewRetryInterval
		l.m.o.Logger.Debug("lease: renew failed", "name", l.rec.Name, "err", err)
	}
	// The interval runs from the start of this renewal, not its end, so
	// that slow replies do not stretch the heartbeat.
	delay := l.m.renewDelay(start.Add(next))
	l.mu.Lock()
	if l.state == held {
		l.renewTimer.Reset(delay)
	}
	l.mu.Unlock()
}

// Release ends the lease: it stops the heartbeat, deletes the grant at the
// store if the store still names this holder (compare-and-delete), which
// wakes waiters, and cancels the lease's Context with the outcome as its
// cause: ErrReleased, or a *LostError if the store had already let the
// grant go. Until the store answers the lease counts as held, and its local
// deadline still applies.
//
// ctx bounds the request while it is live; if it is already done, Release
// uses a detached context, so a deferred Release works after the work's
// context was cancelled. Either way the request is bounded by
// Options.ReleaseTimeout.
//
// It returns nil when the grant was released, and again when called after
// that. It returns a *LostError (ErrLost) when the lease had been lost, or
// the store no longer named this holder, and again when called after that.
// It returns the store's error when the store could not be reached; the
// lease is ended locally anyway (ErrReleased), the grant expires after its
// TTL, and calling Release again retries the delete.
func (l *Lease) Release(ctx context.Context) error {
	l.releaseMu.Lock()
	defer l.releaseMu.Unlock()

	l.mu.Lock()
	if l.storeReleased {
		end := l.endErr
		l.mu.Unlock()
		if errors.Is(end, ErrLost) {
			return end
		}
		return nil
	}
	if l.state == held {
		l.state = releasing
		if l.renewTimer != nil {
			l.renewTimer.Stop()
		}
	}
	l.mu.Unlock()

	rctx, cancel := l.m.releaseContext(ctx)
	defer cancel()
	err := l.m.b.Release(rctx, l.rec)
	notHeld := errors.Is(err, ErrNotHeld)
	if err != nil && !notHeld {
		err = fmt.Errorf("lease: release %q (token %d): %w", l.rec.Name, l.rec.Token, err)
	}

	l.mu.Lock()
	if err == nil || notHeld {
		l.storeReleased = true
	}
	ended := l.state == releasing // not lost meanwhile
	if ended {
		l.timer.Stop()
		if notHeld {
			// We believed we held it, but the store had let it go.
			l.state, l.endErr = lost, &LostError{Name: l.rec.Name, Token: l.rec.Token, Reason: LostTakenOver, Cause: ErrNotHeld}
		} else {
			l.state, l.endErr = released, ErrReleased
		}
	}
	end := l.endErr
	l.mu.Unlock()

	if ended {
		held := time.Since(l.granted)
		if notHeld {
			l.m.o.Observer.Lost(LostEvent{Name: l.rec.Name, Token: l.rec.Token, Reason: LostTakenOver, Held: held, Err: end})
		} else {
			l.m.o.Observer.Released(ReleasedEvent{Name: l.rec.Name, Token: l.rec.Token, Held: held, Err: err})
		}
		l.cancel(end)
	}
	switch {
	case errors.Is(end, ErrLost) && err != nil && !notHeld:
		return errors.Join(end, err)
	case errors.Is(end, ErrLost):
		return end
	case notHeld:
		// Released locally before, and the store has nothing of ours now.
		return nil
	}
	return err
}
