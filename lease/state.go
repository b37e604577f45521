package lease

import (
	"errors"
	"fmt"
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
	phasePending   phase = iota // the acquire request is in flight
	phaseHeld                   // granted; renewed by heartbeats or by the store
	phaseReleasing              // Release began: ended for the holder; the store has not answered yet
	phaseLost                   // ended without a release: expired locally, or the store let it go
	phaseReleased               // ended by Release, and the store answered (or could not be reached)
)

// live reports whether the lease is valid: granted, and not ended.
func (p phase) live() bool { return p == phaseHeld }

// state is everything about a lease that changes, the facts its waiters
// wait for included. It is changed only by apply, under the lease's lock
// (engine.go).
type state struct {
	phase     phase
	gone      bool // the store holds nothing of ours (released, or taken over)
	releasing bool // a Release call runs; others wait their turn
	ctxMade   bool // the lease's Context exists
	reported  bool // the end was reported: a Context made from now on starts cancelled
	cancelled bool // the first report of the end is done: the Context, if made, is cancelled

	deadline time.Time // local deadline, with a monotonic reading
	validity time.Duration
	inflight int         // renew requests let through the gate and not yet answered, or whose grant is being given back
	lastErr  error       // the last renew error, for LostError.Cause
	end      error       // why the lease ended; nil while live
	early    error       // a loss pushed while the acquire was pending
	onEnd    func(error) // called once by the report, before the Context is cancelled
	sleepers []sleeper   // goroutines waiting for a condition to hold
}

// condition is a fact about a lease that a goroutine can wait for.
type condition uint8

const (
	untilTurn      condition = iota // no Release call runs
	untilCancelled                  // the end was reported and the Context cancelled
	untilDrained                    // no renew request (or give-back of one) is in flight
)

// sleeper is a goroutine waiting for cond: apply hands ch back to be
// closed once cond holds.
type sleeper struct {
	cond condition
	ch   chan struct{}
}

func (s *state) holds(c condition) bool {
	switch c {
	case untilTurn:
		return !s.releasing
	case untilCancelled:
		return s.cancelled
	}
	return s.inflight == 0
}

// sleep registers a goroutine that waits for c, which does not hold.
func (s *state) sleep(c condition) chan struct{} {
	ch := make(chan struct{})
	s.sleepers = append(s.sleepers, sleeper{c, ch})
	return ch
}

// woken removes the sleepers whose condition holds and returns their
// channels.
func (s *state) woken() (wake []chan struct{}) {
	kept := s.sleepers[:0]
	for _, w := range s.sleepers {
		if s.holds(w.cond) {
			wake = append(wake, w.ch)
		} else {
			kept = append(kept, w)
		}
	}
	clear(s.sleepers[len(kept):])
	s.sleepers = kept
	return wake
}

type eventKind uint8

const (
	evGranted      eventKind = iota // sent, validity: the acquire request's send time and the validity granted (TTL - margin)
	evRenewBegin                    // at: now; a renew asks to go out (refused unless held and before the deadline)
	evRenewEnd                      // sent, at: the request's send time and now; err: its outcome
	evConfirmed                     // sent: when the request the store confirmed was sent
	evDeadline                      // at: now
	evPushedLoss                    // err: the backend's cause
	evRelease                       // a Release call begins
	evReleaseReady                  // the Release call goes on once the end is reported
	evReleaseEnd                    // err: the store's answer, or why nothing was sent
	evGiveBackEnd                   // err: the store's answer to the give-back of a grant renewed after the lease ended
	evReport                        // err: the end being reported; the Observer has been told
	evReported                      // the first report cancelled the Context
	evContext                       // the holder asks for the Context
	evWhenEnded                     // onEnd: to be called with the end
)

// poster says who posted an event: it decides what follows a renew, and
// whether the scheduler's entries are still to be removed.
type poster uint8

const (
	byHolder poster = iota // the holder's own call (Renew, Release, Err, Context)
	byClock                // the scheduler: a heartbeat, or a deadline come due (its entry taken off)
	byBatch                // a heartbeat sent with others in one request
	byStore                // the backend's Notifier
)

type event struct {
	kind     eventKind
	by       poster
	at       time.Time
	sent     time.Time
	validity time.Duration
	err      error
	grant    driver.Grant // evGranted: the grant the store made
	onEnd    func(error)
}

// action is what the goroutine that posted an event does next.
type action uint8

const (
	doNothing  action = iota // done: return effect.result
	doNext                   // post effect.next
	doWait                   // wait until effect.wait is closed, then post effect.next
	doRenew                  // send the renew request, bounded by effect.until, then post evRenewEnd
	doRelease                // wait for effect.wait (if set) within the release's time, send the release, then post evReleaseEnd
	doGiveBack               // give the grant back to the store, then post evGiveBackEnd (a batch does so once every lease has its answer)
)

// effect tells the caller of apply what to do outside the lock: the
// requests to send and the wake-ups to carry out.
type effect struct {
	do     action
	next   eventKind     // doNext, doWait
	wait   chan struct{} // doWait, doRelease: closed when the awaited condition holds
	until  time.Time     // evRenewBegin: the deadline that bounds the renew request
	result error         // what Renew or Release returns (evRenewBegin, evRenewEnd, evReleaseReady, evReleaseEnd)

	wake      []chan struct{} // close these: their conditions hold
	ended     bool            // the lease just ended (or its end changed to lost): report it, unless reported is set
	reported  bool            // ended, but there was nothing to report: apply has recorded the report
	reason    LostReason      // when it ended as lost
	end       error           // ended, onEnd, cancel: the end to report
	moved     bool            // the deadline moved later: reschedule it
	heartbeat bool            // schedule the next heartbeat
	released  bool            // evReleaseEnd: the store released the grant (or could not be reached)
	onEnd     func(error)     // call it with end
	cancel    bool            // cancel the Context with end
	cut       bool            // evRelease: cut the renew requests in flight short
	makeCtx   bool            // evContext: make the Context (cancelled at once if cancel is set)
}

// apply is the lease's one transition function. name and token label the
// errors it makes.
func (s *state) apply(ev *event, name string, token fence.Token) (eff effect) {
	lose := func(reason LostReason, cause error) {
		if cause == nil {
			cause = s.lastErr
		}
		s.phase = phaseLost
		s.end = &LostError{Name: name, Token: token, Reason: reason, Cause: cause}
		eff.ended, eff.reason, eff.end = true, reason, s.end
	}
	extend := func(sent time.Time) {
		if d := sent.Add(s.validity); d.After(s.deadline) {
			s.deadline = d
			eff.moved = true
		}
	}
	switch ev.kind {
	case evGranted:
		s.phase, s.validity, s.deadline = phaseHeld, ev.validity, ev.sent.Add(ev.validity)
		if s.early != nil {
			// The backend reported the grant lost before its reply came.
			s.gone = true
			lose(LostTakenOver, s.early)
			break
		}
		eff.moved, eff.heartbeat = true, true

	case evRenewBegin:
		switch {
		case s.phase == phaseHeld && !ev.at.Before(s.deadline):
			lose(LostExpired, nil)
			eff.result = s.end
		case s.phase == phaseHeld:
			s.inflight++
			eff.until = s.deadline
			if ev.by != byBatch {
				eff.do = doRenew
			}
		case s.phase == phaseReleasing:
			eff.result = ErrReleased
		default:
			eff.result = s.end
		}

	case evRenewEnd:
		s.inflight--
		switch {
		case ev.err == nil && s.phase.live():
			s.lastErr = nil
			extend(ev.sent)
		case ev.err == nil && !s.gone && s.phase != phaseReleasing:
			// The store renewed a grant this process no longer counts
			// as held: it still names us, so others would wait a TTL.
			// Give it back. Until the store answers, the request counts
			// as in flight: a Release waits for it, and returns only
			// once nothing is sent for the lease any more.
			s.inflight++
			eff.do = doGiveBack
		case ev.err == nil:
			// While releasing, the release that follows frees it.
		case s.phase == phaseHeld && errors.Is(ev.err, ErrNotHeld):
			s.gone = true
			lose(LostTakenOver, ev.err)
		case s.phase == phaseHeld:
			s.lastErr = ev.err
			if !ev.at.Before(s.deadline) {
				// Answered at or past the deadline (a store that hung
				// until the request's own deadline): end the lease here
				// rather than leave it to the scheduler, which may be
				// ending thousands of others at this very instant.
				lose(LostExpired, nil)
			}
		}
		// While releasing, a renew decides nothing: the release that
		// follows it asks the store the same question.
		eff.heartbeat = ev.by != byHolder && s.phase == phaseHeld
		switch {
		case s.phase == phaseReleasing:
			eff.result = ErrReleased
		case s.end != nil:
			eff.result = s.end
		case ev.err != nil:
			eff.result = fmt.Errorf("lease: renew %q (token %d): %w", name, token, ev.err)
		}

	case evConfirmed:
		if s.phase.live() {
			s.lastErr = nil
			extend(ev.sent)
		}

	case evDeadline:
		if s.phase.live() {
			if !ev.at.Before(s.deadline) {
				lose(LostExpired, nil)
			} else {
				eff.moved = true // a renewal moved it after the clock took its entry
			}
		}

	case evPushedLoss:
		switch {
		case s.phase == phasePending:
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

	case evRelease:
		if s.releasing {
			eff.do, eff.next, eff.wait = doWait, evRelease, s.sleep(untilTurn)
			break
		}
		s.releasing = true
		eff.cut = true
		if !s.gone && s.phase == phaseHeld {
			// Invalid from here on, before the request that frees the
			// name is sent: a waiter it wakes may be granted at once.
			s.phase, s.end = phaseReleasing, ErrReleased
			eff.ended, eff.end = true, s.end
			if s.ctxMade || s.onEnd != nil {
				eff.do, eff.next = doNext, evReleaseReady // once post has reported the end
				break
			}
			// Nothing to call before the request goes out (no Context,
			// no whenEnded function, and a release is no loss to tell
			// the Observer): the end is reported here and now.
			s.reported, s.cancelled, eff.reported = true, true, true
		}
		fallthrough

	case evReleaseReady:
		// The lease has ended: by this call, or before by another
		// goroutine (the scheduler at the deadline) that may still be
		// reporting it. Go on once its Context is cancelled.
		switch {
		case !s.cancelled:
			eff.do, eff.next, eff.wait = doWait, evReleaseReady, s.sleep(untilCancelled)
		case s.gone:
			s.releasing = false
			eff.result = releaseResult(s.end, nil)
		default:
			eff.do = doRelease
			if s.inflight > 0 {
				eff.wait = s.sleep(untilDrained)
			}
		}

	case evReleaseEnd:
		s.releasing = false
		notHeld := errors.Is(ev.err, ErrNotHeld)
		if ev.err == nil || notHeld {
			s.gone = true
		}
		if s.phase == phaseReleasing {
			if notHeld {
				// We believed we held it, but the store had let it go.
				lose(LostTakenOver, ErrNotHeld)
			} else {
				// Released, or ended locally when the store could not be
				// reached (the grant then expires after its TTL).
				s.phase = phaseReleased
				eff.released = true
			}
		}
		eff.result = releaseResult(s.end, ev.err)

	case evGiveBackEnd:
		s.inflight--
		if ev.err == nil || errors.Is(ev.err, ErrNotHeld) {
			s.gone = true
		}
		eff.result = s.end // the Renew whose grant it was found the lease ended

	case evReport:
		// A released lease is reported again if the store says it was
		// lost; only the first report waits on the Context.
		first := !s.reported
		s.reported = true
		eff.end, eff.onEnd, s.onEnd = ev.err, s.onEnd, nil
		eff.cancel = s.ctxMade
		if first && !eff.cancel && eff.onEnd == nil {
			s.cancelled = true // nothing to call: reported at once
		} else if first {
			eff.do, eff.next = doNext, evReported
		}

	case evReported:
		s.cancelled = true

	case evContext:
		if !s.ctxMade {
			s.ctxMade = true
			eff.makeCtx, eff.cancel, eff.end = true, s.reported, s.end
		}

	case evWhenEnded:
		if !s.reported {
			s.onEnd = ev.onEnd
		} else {
			eff.onEnd, eff.end = ev.onEnd, s.end
		}
	}
	if len(s.sleepers) > 0 {
		eff.wake = s.woken()
	}
	return eff
}

// releaseResult is what Release returns given how the lease ended and what
// the store answered this time.
func releaseResult(end, err error) error {
	notHeld := errors.Is(err, ErrNotHeld)
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
