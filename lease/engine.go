package lease

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/fencekit/fencekit/fence"
	"github.com/fencekit/fencekit/lease/driver"
)

// engine owns every request a Manager sends to its store (acquire attempts
// and their abandonment, heartbeats, one by one or batched, explicit
// renewals, releases, give-backs of grants that cannot be used, watches and
// reads) and every lease it grants. It is the only code in this package
// that calls the Backend.
//
// Each granted lease has one owner, its holding, and one function changes
// it: holding.post. The holder's calls (Lease.Renew, Release, a late Err),
// the scheduler's deadlines and heartbeats and the backend's Notifier only
// post events; post applies each to the lease's state (state.apply) under
// the lease's lock and then, outside the lock, carries out what the
// transition returned: the requests to send and the wake-ups.
type engine struct {
	b     Backend
	w     driver.Watcher      // nil when b cannot signal releases
	br    driver.BatchRenewer // nil unless b batches and batching is on
	o     *Options            // the Manager's, read-only after NewManager
	sched scheduler[*holding]
	epoch time.Time // origin of the engine's monotonic clock (Lease.deadlineNs)
}

func (e *engine) init(b Backend, o *Options) {
	e.b, e.o, e.epoch = b, o, time.Now()
	e.w, _ = b.(driver.Watcher)
	if br, ok := b.(driver.BatchRenewer); ok && o.RenewBatchWindow > 0 {
		e.br = br
	}
	e.sched = scheduler[*holding]{
		maxLead: o.SafetyMargin / 2,
		window:  o.RenewBatchWindow,
		epoch:   e.epoch,
		expire:  e.expire,
		renew:   e.heartbeats,
	}
	if e.br != nil {
		e.sched.grid = o.RenewBatchWindow
	}
}

// holding is the engine's record of one grant: the Lease it hands out, a
// view, and what only post touches.
type holding struct {
	Lease
	e      *engine
	parent context.Context // the acquire call's context, for its values

	mu     sync.Mutex // guards st, cancel and stop; taken by post alone
	st     state
	cancel context.CancelCauseFunc // cancels the Lease's Context, once made
	stop   context.Context         // done once Release begins: bounds the renew requests; made by the first
	cut    context.CancelFunc      // ends stop
	dl, hb entry[*holding]         // the deadline and the next heartbeat, in the scheduler
}

// todo is an effect with what post needs from the holding to carry it
// out, taken under the lock.
type todo struct {
	effect
	cancelCtx context.CancelCauseFunc // effect.cancel: the Context's
	cut       context.CancelFunc      // effect.cut
	stop      context.Context         // doRenew
}

func (e *engine) newHolding(parent context.Context) *holding {
	h := &holding{e: e, parent: parent}
	h.k, h.epoch = h, &e.epoch
	h.dl, h.hb = newEntry(h), newEntry(h)
	return h
}

// post is the only code that changes a lease. It applies ev to the lease's
// state under the lease's lock, publishes the outcome for the Lease's
// lock-free readers and moves the lease's entries in the scheduler (under
// the lock, so that no entry outlives the lease's end). Then, outside the
// lock, it carries out what the transition returned, in this order: it
// wakes the goroutines whose condition now holds, tells the Observer of a
// release, reports an end (the Observer and the log for a loss, then the
// whenEnded function, then the Context), and sends the next request (a
// renewal, a release, the give-back of a grant the store should not keep)
// or waits, and applies what follows in turn, until nothing is left to do.
//
// ctx is the caller's (Renew, Release, an acquire attempt): it bounds the
// requests sent for the caller and is the Observer's context of a release.
// It is nil for the scheduler, the backend and the Lease's readers.
// noCaller is the context of the events that no caller posts (the
// scheduler's deadlines and heartbeats, the notifier's, a lease's own
// bookkeeping): the requests they start are bounded by the lease's
// deadline and ReleaseTimeout, not by a caller's context.
var noCaller = context.Background()

func (h *holding) post(ctx context.Context, ev event) effect {
	if ctx == nil { // a holder's Renew or Release called with nil
		ctx = noCaller
	}
	e := h.e
	step := func(ev event) (t todo) {
		h.mu.Lock()
		defer h.mu.Unlock()
		if ev.kind == evGranted {
			h.g, h.granted = ev.grant, ev.sent
		}
		t.effect = h.st.apply(&ev, h.g.Name, h.g.Token)
		h.publish()
		e.schedule(h, ev, t.effect)
		switch {
		case t.makeCtx:
			h.makeContext()
			if t.cancel {
				h.cancel(t.end) // made after the end: no one waits on it yet
			}
		case t.cancel:
			t.cancelCtx = h.cancel
		}
		if t.effect.cut {
			t.cut = h.cut
		}
		if t.do == doRenew {
			if h.stop == nil {
				h.stop, h.cut = context.WithCancel(context.Background())
			}
			t.stop = h.stop
		}
		return t
	}
	wake := func(t *todo) {
		for _, ch := range t.wake {
			close(ch)
		}
		if t.cut != nil {
			t.cut()
		}
		if t.onEnd != nil {
			t.onEnd(t.end)
		}
		if t.cancelCtx != nil {
			t.cancelCtx(t.end)
		}
	}
	var sent time.Time // of the release request
	eff := step(ev)
	for {
		wake(&eff)
		if eff.released {
			e.o.Observer.Released(ReleasedEvent{Ctx: ctx, Name: h.g.Name, Token: h.g.Token, Held: time.Since(h.granted), Sent: sent, Latency: time.Since(sent), Err: ev.err})
		}
		if eff.ended && !eff.reported {
			// Whoever waits on Done sees the loss already counted.
			e.reportLoss(h, &eff.effect)
			r := step(event{kind: evReport, err: eff.end})
			wake(&r)
			if r.do == doNext {
				reported := step(event{kind: r.next})
				wake(&reported)
			}
		}
		if eff.heartbeat && ev.err != nil {
			e.o.Logger.Debug("lease: renew failed, will retry", "name", h.g.Name, "err", ev.err)
		}
		switch eff.do {
		case doNext:
			ev = event{kind: eff.next}
		case doWait:
			<-eff.wait
			ev = event{kind: eff.next}
		case doRenew:
			ev = e.renew(ctx, h, ev.by, eff.until, eff.stop)
		case doRelease:
			sent = time.Now()
			ev = e.release(ctx, h, eff.wait)
		case doGiveBack:
			if ev.by == byBatch {
				return eff.effect // renewBatch gives back once every lease has its answer
			}
			ev = event{kind: evGiveBackEnd, err: e.giveBack(ctx, h.g)}
		default:
			return eff.effect
		}
		eff = step(ev)
	}
}

// publish copies what the Lease's readers read without the lock; mu must
// be held.
func (h *holding) publish() {
	h.deadlineNs.Store(int64(h.st.deadline.Sub(h.e.epoch)))
	if end := h.st.end; end != nil {
		if p := h.end.Load(); p == nil || *p != end {
			h.end.Store(endPointer(end))
		}
	}
}

// errReleasedP is the copy of ErrReleased that Lease.end points at for a
// released lease, so that a release allocates nothing for it.
var errReleasedP = func() *error { e := ErrReleased; return &e }()

// endPointer returns a pointer to a copy of end, which Err reads without
// the lock. (The copy is made only here: a variable whose address is
// taken would be allocated on every call of publish.)
func endPointer(end error) *error {
	if end == ErrReleased {
		return errReleasedP
	}
	p := new(error)
	*p = end
	return p
}

// makeContext makes the Lease's Context; mu must be held.
func (h *holding) makeContext() {
	inner, cancel := context.WithCancelCause(fence.NewContext(context.WithoutCancel(h.parent), h.g.Token))
	h.cancel = cancel
	h.ctx.Store(&leaseContext{Context: inner, l: &h.Lease})
}

// schedule moves h's entries in the scheduler as eff asks; mu must be
// held. A lease that ended is unscheduled, except by the scheduler's own
// deadline, which has taken the deadline entry off already and leaves the
// heartbeat entry to be refused when it comes due (ending thousands at one
// instant, it must not contend for the scheduler's lock).
func (e *engine) schedule(h *holding, ev event, eff effect) {
	if eff.ended {
		if ev.kind != evDeadline || ev.by != byClock {
			e.sched.remove(&h.dl, &h.hb)
		}
		return
	}
	if eff.moved {
		e.sched.setDeadline(&h.dl, h.st.deadline)
	}
	if eff.heartbeat && !e.o.DisableAutoRenew {
		// Counted from the send time, like the deadline: a slow reply
		// must not push the next renewal towards the deadline.
		next := ev.sent.Add(e.o.RenewInterval)
		if ev.err != nil {
			next = ev.at.Add(e.o.RenewRetryInterval)
		}
		e.sched.setHeartbeat(&h.hb, next)
	}
}

// reportLoss tells the Observer and the log that the lease was lost. It
// does nothing for a release.
func (e *engine) reportLoss(h *holding, eff *effect) {
	if eff.reason == "" {
		return
	}
	e.o.Observer.Lost(LostEvent{Ctx: h.parent, Name: h.g.Name, Token: h.g.Token, Reason: eff.reason, Held: time.Since(h.granted), Err: eff.end})
	if e.o.Logger.Enabled(context.Background(), slog.LevelWarn) {
		var cause error
		if le, ok := eff.end.(*LostError); ok {
			cause = le.Cause
		}
		e.o.Logger.Warn("lease: lost", "name", h.g.Name, "token", uint64(h.g.Token), "reason", string(eff.reason), "err", cause)
	}
}

// check asks the store whether it can grant leases (Checker).
func (e *engine) check(ctx context.Context) error {
	c, ok := e.b.(driver.Checker)
	if !ok {
		return fmt.Errorf("lease: the backend cannot check the store: %w", errors.ErrUnsupported)
	}
	return c.Check(ctx) // its error names the store, what failed and the fix
}

// inspector returns the backend's Inspector, or nil.
func (e *engine) inspector() driver.Inspector {
	in, _ := e.b.(driver.Inspector)
	return in
}

// watch subscribes to releases of name (Watcher); the caller has checked
// that e.w is set.
func (e *engine) watch(ctx context.Context, name string) (<-chan struct{}, func(), error) {
	return e.w.Watch(ctx, name)
}

var (
	// errAttemptAbandoned marks an attempt of a blocking Acquire that was
	// cut short by the lease's validity.
	errAttemptAbandoned = errors.New("attempt abandoned")
	// errGivenBack marks an attempt whose grant the Manager gave back
	// (late, lost before use, or breaking the contract): its owner is
	// ended at the store.
	errGivenBack = errors.New("given back")
)

// attempt sends one acquire request, bounded by ctx, and turns a grant into
// a Lease that keeps parent's values. start is when the Acquire call began
// and n the attempt's number, for the Observer.
func (e *engine) attempt(parent, ctx context.Context, req driver.Request, start time.Time, n int) (*Lease, error) {
	h := e.newHolding(parent)
	req.Notify = (*notifier)(h)
	sent := time.Now()
	g, err := e.b.Acquire(ctx, req)
	if err != nil {
		return nil, err
	}
	if err := checkGrant(req, g); err != nil {
		e.giveBack(ctx, g)
		return nil, fmt.Errorf("%w; %w", err, errGivenBack)
	}
	if !g.Sent.IsZero() && g.Sent.Before(sent) {
		// The store proved the grant from an earlier request's send time
		// (driver.Grant.Sent): count from there.
		sent = g.Sent
	}
	validity := g.TTL - e.o.SafetyMargin
	if now := time.Now(); !now.Before(sent.Add(validity)) {
		// The reply took longer than the lease is valid: the store may
		// already have let it expire. Never hand out such a grant.
		e.giveBack(ctx, g)
		return nil, fmt.Errorf("%w: %q: the grant arrived %v after its request was sent, past its local deadline (TTL %v - safety margin %v); %w",
			ErrNotAcquired, req.Name, now.Sub(sent), g.TTL, e.o.SafetyMargin, errGivenBack)
	}
	if eff := h.post(ctx, event{kind: evGranted, sent: sent, validity: validity, grant: g}); eff.ended {
		// The backend reported the grant lost before its reply arrived.
		e.giveBack(ctx, g)
		return nil, fmt.Errorf("%w: %q: the grant was lost before it could be used (%w): %w", ErrNotAcquired, req.Name, errGivenBack, h.Err())
	}
	e.o.Observer.Acquired(AcquiredEvent{Ctx: parent, Name: g.Name, Token: g.Token, Wait: time.Since(start), Attempts: n})
	if e.o.Logger.Enabled(ctx, slog.LevelDebug) { // spare the hot path the arguments' allocations
		e.o.Logger.Debug("lease: acquired", "name", g.Name, "token", uint64(g.Token), "owner", g.Owner, "attempts", n)
	}
	return &h.Lease, nil
}

// checkGrant refuses a grant that breaks the Backend contract.
func checkGrant(req driver.Request, g driver.Grant) error {
	switch {
	case g.Token == fence.None:
		return fmt.Errorf("lease: acquire %q: the backend granted token 0, which is never valid", req.Name)
	case g.Name != req.Name || g.Owner != req.Owner:
		return fmt.Errorf("lease: acquire %q: the backend granted %q to %q instead", req.Name, g.Name, g.Owner)
	case g.TTL < req.TTL:
		return fmt.Errorf("lease: acquire %q: the store granted a TTL of %v, shorter than the %v asked for", req.Name, g.TTL, req.TTL)
	}
	return nil
}

// abandon tells the store that the acquire request req will never be
// waited for: the store ends any grant it made to req.Owner and refuses
// the request if it arrives later (Backend.Abandon). It is bounded by
// budget and by ReleaseTimeout, and runs even when ctx is done; it returns
// the store's error (a grant the request made then expires after its TTL).
func (e *engine) abandon(ctx context.Context, req driver.Request, budget time.Duration) error {
	if ctx.Err() != nil {
		ctx = context.WithoutCancel(ctx)
	}
	rctx, cancel := context.WithTimeout(ctx, max(min(budget, e.o.ReleaseTimeout), minAbandonBudget))
	defer cancel()
	req.Notify = nil
	return e.b.Abandon(rctx, req)
}

// minAbandonBudget is the least time an Abandon is given, however short the
// attempt it follows: a round trip on a loaded machine.
const minAbandonBudget = 50 * time.Millisecond

// releaseContext bounds a release: the caller's context while it is live,
// else a detached one; never longer than ReleaseTimeout.
func (e *engine) releaseContext(ctx context.Context) (context.Context, context.CancelFunc) {
	if ctx.Err() != nil {
		ctx = context.WithoutCancel(ctx)
	}
	return context.WithTimeout(ctx, e.o.ReleaseTimeout)
}

// giveBack releases a grant that is not handed out (late, lost before use,
// breaking the contract) or that the store renewed after it ended here,
// best effort, within ReleaseTimeout. It returns the store's answer, and
// logs a failure.
func (e *engine) giveBack(ctx context.Context, g driver.Grant) error {
	rctx, cancel := e.releaseContext(ctx)
	defer cancel()
	err := e.b.Release(rctx, g)
	if err != nil && !errors.Is(err, ErrNotHeld) {
		e.o.Logger.Warn("lease: could not give back a grant; it expires after its TTL", "name", g.Name, "token", uint64(g.Token), "err", err)
	}
	return err
}

// renew sends one renew request for h (post's doRenew) and returns its
// answer as the event that follows. The request is bounded by until (the
// local deadline when it was let through), by ctx for the holder's Renew,
// and by stop, which is done once Release begins.
func (e *engine) renew(ctx context.Context, h *holding, by poster, until time.Time, stop context.Context) event {
	var (
		rctx   context.Context
		cancel context.CancelFunc
	)
	if by == byHolder {
		rctx, cancel = context.WithDeadline(ctx, until)
		defer context.AfterFunc(stop, cancel)()
	} else {
		rctx, cancel = context.WithDeadline(stop, until)
	}
	defer cancel()
	sent := time.Now()
	err := e.b.Renew(rctx, h.g)
	e.renewed(h, sent, err)
	return event{kind: evRenewEnd, by: by, sent: sent, at: time.Now(), err: err}
}

// renewed tells the Observer of a renew request sent at sent.
func (e *engine) renewed(h *holding, sent time.Time, err error) {
	e.o.Observer.Renewed(RenewedEvent{Ctx: h.parent, Name: h.g.Name, Token: h.g.Token, Sent: sent, Latency: time.Since(sent), Err: err})
}

// heartbeats sends the heartbeats that came due (the scheduler's renew),
// each on a goroutine of its own, or all in one batch where the backend
// can batch.
func (e *engine) heartbeats(due []*holding) {
	if e.br != nil {
		go e.renewBatch(due)
		return
	}
	for _, h := range due {
		go h.post(noCaller, event{kind: evRenewBegin, by: byClock, at: time.Now()})
	}
}

// expire ends h if its deadline has passed at now (the scheduler's
// expire).
func (e *engine) expire(h *holding, now time.Time) {
	h.post(noCaller, event{kind: evDeadline, by: byClock, at: now})
}

// renewBatch sends the heartbeats of hs in one BatchRenewer call; post
// lets each through the gate (leases that ended, or are being released,
// are left out), settles each answer and schedules the next heartbeat.
func (e *engine) renewBatch(hs []*holding) {
	live := hs[:0]
	gs := make([]driver.Grant, 0, len(hs))
	var latest time.Time
	for _, h := range hs {
		eff := h.post(noCaller, event{kind: evRenewBegin, by: byBatch, at: time.Now()})
		if eff.until.IsZero() {
			continue
		}
		live = append(live, h)
		gs = append(gs, h.g)
		if eff.until.After(latest) {
			latest = eff.until
		}
	}
	if len(live) == 0 {
		return
	}
	// Bounded by the latest local deadline in the batch: a lease whose own
	// deadline passes first is lost by the scheduler meanwhile, whatever
	// the reply says.
	ctx, cancel := context.WithDeadline(context.Background(), latest)
	defer cancel()
	sent := time.Now()
	var (
		mu       sync.Mutex
		answered = make([]bool, len(live))
		giveBack []*holding
	)
	end := func(i int, err error) {
		mu.Lock()
		if i < 0 || i >= len(live) || answered[i] {
			mu.Unlock()
			return // a backend that broke the contract; the rest is errShortBatch
		}
		answered[i] = true
		mu.Unlock()
		h := live[i]
		e.renewed(h, sent, err)
		if eff := h.post(noCaller, event{kind: evRenewEnd, by: byBatch, sent: sent, at: time.Now(), err: err}); eff.do == doGiveBack {
			mu.Lock()
			giveBack = append(giveBack, h)
			mu.Unlock()
		}
	}
	e.br.RenewBatch(ctx, gs, end)
	for i := range live {
		mu.Lock()
		missing := !answered[i]
		mu.Unlock()
		if missing {
			end(i, errShortBatch)
		}
	}
	// Only after every lease of the batch has its result: a give-back can
	// take up to ReleaseTimeout.
	for _, h := range giveBack {
		h.post(noCaller, event{kind: evGiveBackEnd, by: byBatch, err: e.giveBack(context.Background(), h.g)})
	}
}

// release sends the release of h (post's doRelease) once the renew
// requests in flight, and the give-backs of grants they renewed, have
// been answered (drained is closed then; nil when none is in flight), and
// returns the answer as the event that follows. It is
// bounded by ctx while ctx is live, and by ReleaseTimeout.
func (e *engine) release(ctx context.Context, h *holding, drained <-chan struct{}) event {
	rctx, cancel := e.releaseContext(ctx)
	defer cancel()
	if drained != nil {
		select {
		case <-drained:
		case <-rctx.Done():
			return event{kind: evReleaseEnd, err: fmt.Errorf("lease: release %q (token %d) not sent: a renew request (or the give-back of the grant it renewed) is still unanswered: %w", h.g.Name, h.g.Token, rctx.Err())}
		}
	}
	err := e.b.Release(rctx, h.g)
	if err != nil && !errors.Is(err, ErrNotHeld) {
		err = fmt.Errorf("lease: release %q (token %d): %w", h.g.Name, h.g.Token, err)
	}
	return event{kind: evReleaseEnd, err: err}
}

// notifier is the Notifier a backend gets with each request
// (Request.Notify): a lease seen from the store's side. It posts what it
// learns, as every other source of events does.
type notifier holding

var _ driver.Notifier = (*notifier)(nil)

// Confirmed implements Notifier, for backends that keep grants alive
// themselves.
func (n *notifier) Confirmed(sent time.Time) {
	(*holding)(n).post(noCaller, event{kind: evConfirmed, by: byStore, sent: sent})
}

// Lost implements Notifier.
func (n *notifier) Lost(cause error) {
	if cause == nil {
		cause = ErrNotHeld
	}
	(*holding)(n).post(noCaller, event{kind: evPushedLoss, by: byStore, err: cause})
}
