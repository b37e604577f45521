package lease

import (
	"errors"
	"time"

	"github.com/fencekit/fencekit/fence"
	"github.com/fencekit/fencekit/lease/driver"
)

// phase is where a lease is in its life.
//
//	pending ──granted──▶ held ──Release──▶ releasing ──store answered──▶ released
//	                      │                                   └─(not held)─▶ lost
//	                      └─deadline, taken over, pushed loss─────────────▶ lost
//
// A lease is valid only while held. Release ends its validity before the
// request that frees it is sent (docs/design.md, invariant 1): from releasing on,
// Err is ErrReleased and the Context is cancelled, so no work of this
// holder runs on while a waiter the release wakes is granted the name. The
// store's answer then only says how the lease ended: released, or lost if
// the store had already let it go.
type phase uint8

const (
	pending   phase = iota // the acquire request is in flight
	held                   // granted; renewed by heartbeats or by the store
	releasing              // Release began: ended for the holder; the store has not answered yet
	lost                   // ended without a release: expired locally, or the store let it go
	released               // ended by Release, and the store answered (or could not be reached)
)

// live reports whether the lease is valid: granted, and not ended.
func (p phase) live() bool { return p == held }

// state is everything about a lease that changes. It is guarded by
// Lease.mu and changed only by apply.
type state struct {
	phase    phase
	deadline time.Time // local deadline, with a monotonic reading
	validity time.Duration
	inflight int   // renew requests let through the gate and not yet answered
	gone     bool  // the store holds nothing of ours (released, or taken over)
	lastErr  error // the last renew error, for LostError.Cause
	end      error // why the lease ended; nil while live
	early    error // a loss pushed while the acquire was pending
}

type eventKind uint8

const (
	evGranted      eventKind = iota // at: the local deadline of the grant
	evRenewBegin                    // at: now; refused unless held and before the deadline
	evRenewEnd                      // at: when the request was sent; err: its outcome
	evConfirmed                     // at: when the confirmed request was sent
	evDeadline                      // at: now
	evPushedLoss                    // err: the backend's cause
	evReleaseBegin                  // (no fields)
	evReleaseEnd                    // err: the store's answer, or why nothing was sent
)

type event struct {
	kind eventKind
	at   time.Time
	err  error
}

// effect tells the caller of apply what to do outside the lock.
type effect struct {
	ended    bool       // the lease just ended (or its end changed to lost): report it, cancel its context, unschedule it
	reason   LostReason // when it ended as lost
	moved    bool       // the deadline moved later: reschedule it
	refused  error      // evRenewBegin: the renew must not be sent, and this is why
	giveBack bool       // a renew succeeded for a lease that already ended: the store still names us
	send     bool       // evReleaseBegin: send the release
	wait     bool       // evReleaseBegin: renews are in flight; wait for them before sending
	drained  bool       // no renew is in flight any more (a waiting Release may send)
	released bool       // evReleaseEnd: the store released the grant (or could not be reached)
}

// apply is the lease's one transition function. name and token label the
// errors it makes.
func (s *state) apply(ev event, name string, token fence.Token) (eff effect) {
	lose := func(reason LostReason, cause error) {
		if cause == nil {
			cause = s.lastErr
		}
		s.phase = lost
		s.end = &LostError{Name: name, Token: token, Reason: reason, Cause: cause}
		eff.ended, eff.reason = true, reason
	}
	extend := func(sent time.Time) {
		if d := sent.Add(s.validity); d.After(s.deadline) {
			s.deadline = d
			eff.moved = true
		}
	}
	switch ev.kind {
	case evGranted:
		s.phase, s.deadline = held, ev.at
		if s.early != nil {
			s.gone = true
			lose(LostTakenOver, s.early)
		}

	case evRenewBegin:
		switch {
		case s.phase == held && !ev.at.Before(s.deadline):
			lose(LostExpired, nil)
			eff.refused = s.end
		case s.phase == held:
			s.inflight++
		case s.phase == releasing:
			eff.refused = ErrReleased
		default:
			eff.refused = s.end
		}

	case evRenewEnd:
		s.inflight--
		eff.drained = s.inflight == 0
		switch {
		case ev.err == nil && s.phase.live():
			s.lastErr = nil
			extend(ev.at)
		case ev.err == nil:
			// The store renewed a grant this process no longer counts
			// as held: it still names us, so others would wait a TTL.
			// (While releasing, the release that follows frees it.)
			eff.giveBack = !s.gone && s.phase != releasing
		case s.phase == held && errors.Is(ev.err, ErrNotHeld):
			s.gone = true
			lose(LostTakenOver, ev.err)
		case s.phase == held:
			s.lastErr = ev.err
		}
		// While releasing, a renew decides nothing: the release that
		// follows it asks the store the same question.

	case evConfirmed:
		if s.phase.live() {
			s.lastErr = nil
			extend(ev.at)
		}

	case evDeadline:
		if s.phase.live() && !ev.at.Before(s.deadline) {
			lose(LostExpired, nil)
		}

	case evPushedLoss:
		switch {
		case s.phase == pending:
			if s.early == nil {
				s.early = ev.err
			}
		case s.phase.live():
			s.gone = true
			reason := LostTakenOver
			if errors.Is(ev.err, driver.ErrExpiredAtStore) {
				reason = LostExpired
			}
			lose(reason, ev.err)
		}

	case evReleaseBegin:
		if s.gone {
			return eff
		}
		if s.phase == held {
			// Invalid from here on, before the request that frees the
			// name is sent: a waiter it wakes may be granted at once.
			s.phase, s.end = releasing, ErrReleased
			eff.ended = true
		}
		eff.send, eff.wait = true, s.inflight > 0

	case evReleaseEnd:
		notHeld := errors.Is(ev.err, ErrNotHeld)
		if ev.err == nil || notHeld {
			s.gone = true
		}
		if s.phase == releasing {
			if notHeld {
				// We believed we held it, but the store had let it go.
				lose(LostTakenOver, ErrNotHeld)
			} else {
				// Released, or ended locally when the store could not be
				// reached (the grant then expires after its TTL).
				s.phase = released
				eff.released = true
			}
		}
	}
	return eff
}
