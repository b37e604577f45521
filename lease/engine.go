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

// engine owns every request a Manager sends to its store: acquire attempts
// and their abandonment, heartbeats (one by one or batched), explicit
// renewals, releases, give-backs of grants that cannot be used, watches
// and reads. It is the only code in this package that calls the Backend,
// and it serves the scheduler's deadlines and heartbeats. A Lease is a
// view of one grant's state: its methods read that state, and Renew and
// Release ask the engine to act on it. Every change of a lease's state,
// whoever causes it (a reply, the clock, the backend's Notifier, the
// holder), goes through state.apply.
type engine struct {
	b      Backend
	w      driver.Watcher      // nil when b cannot signal releases
	br     driver.BatchRenewer // nil unless b batches and batching is on
	limits driver.Limits
	o      *Options // the Manager's, read-only after NewManager
	sched  scheduler
	epoch  time.Time // origin of the engine's monotonic clock (since)
}

func (e *engine) init(b Backend, limits driver.Limits, o *Options) {
	e.b, e.limits, e.o, e.epoch = b, limits, o, time.Now()
	e.sched.e = e
	e.w, _ = b.(driver.Watcher)
	if br, ok := b.(driver.BatchRenewer); ok && o.RenewBatchWindow > 0 {
		e.br = br
	}
}

// since returns t on the engine's monotonic clock.
func (e *engine) since(t time.Time) time.Duration { return t.Sub(e.epoch) }

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

// attempt sends one acquire request, bounded by ctx, and turns a grant into
// a Lease that keeps parent's values. start is when the Acquire call began
// and n the attempt's number, for the Observer.
func (e *engine) attempt(parent, ctx context.Context, req driver.Request, start time.Time, n int) (*Lease, error) {
	l := newLease(e, parent)
	req.Notify = (*notifier)(l)
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
	deadline := sent.Add(validity)
	if now := time.Now(); !now.Before(deadline) {
		// The reply took longer than the lease is valid: the store may
		// already have let it expire. Never hand out such a grant.
		e.giveBack(ctx, g)
		return nil, fmt.Errorf("%w: %q: the grant arrived %v after its request was sent, past its local deadline (TTL %v - safety margin %v); %w",
			ErrNotAcquired, req.Name, now.Sub(sent), g.TTL, e.o.SafetyMargin, errGivenBack)
	}
	l.mu.Lock()
	l.g, l.granted, l.st.validity = g, sent, validity
	eff := l.apply(event{kind: evGranted, at: deadline})
	if !eff.ended {
		e.sched.setDeadline(&l.dl, deadline)
		if !e.o.DisableAutoRenew && !e.limits.SelfRenewing {
			// Counted from the send time, like the deadline: a slow reply
			// must not push the first renewal towards the deadline.
			e.sched.setHeartbeat(&l.hb, sent.Add(e.o.RenewInterval))
		}
	}
	l.mu.Unlock()
	if eff.ended {
		// The backend reported the grant lost before its reply arrived.
		l.finish(eff)
		e.giveBack(ctx, g)
		return nil, fmt.Errorf("%w: %q: the grant was lost before it could be used (%w): %w", ErrNotAcquired, req.Name, errGivenBack, l.Err())
	}
	e.o.Observer.Acquired(AcquiredEvent{Ctx: parent, Name: g.Name, Token: g.Token, Wait: time.Since(start), Attempts: n})
	if e.o.Logger.Enabled(ctx, slog.LevelDebug) { // spare the hot path the arguments' allocations
		e.o.Logger.Debug("lease: acquired", "name", g.Name, "token", uint64(g.Token), "owner", g.Owner, "attempts", n)
	}
	return l, nil
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
// best effort, within ReleaseTimeout.
func (e *engine) giveBack(ctx context.Context, g driver.Grant) {
	rctx, cancel := e.releaseContext(ctx)
	defer cancel()
	if err := e.b.Release(rctx, g); err != nil && !errors.Is(err, ErrNotHeld) {
		e.o.Logger.Warn("lease: could not give back a grant; it expires after its TTL", "name", g.Name, "token", uint64(g.Token), "err", err)
	}
}

// renew sends one explicit renewal of l (Lease.Renew), bounded by ctx and
// by l's local deadline, and cut short when Release begins.
func (e *engine) renew(ctx context.Context, l *Lease) error {
	deadline, stop, err := l.beginRenew()
	if err != nil {
		return err
	}
	rctx, cancel := context.WithDeadline(ctx, deadline)
	defer cancel()
	defer context.AfterFunc(stop, cancel)()
	sent := time.Now()
	err = e.b.Renew(rctx, l.g)
	err, giveBack := l.endRenew(sent, time.Since(sent), err)
	if giveBack {
		e.giveBack(ctx, l.g)
	}
	return err
}

// heartbeat is one automatic renewal of l: it renews the lease and
// schedules the next one RenewInterval after this one was sent, or a retry
// RenewRetryInterval after it when the store failed transiently.
func (e *engine) heartbeat(l *Lease) {
	deadline, stop, err := l.beginRenew()
	if err != nil {
		return
	}
	rctx, cancel := context.WithDeadline(stop, deadline)
	sent := time.Now()
	err = e.b.Renew(rctx, l.g)
	cancel()
	err, giveBack := l.endRenew(sent, time.Since(sent), err)
	l.scheduleHeartbeat(sent, err)
	if giveBack {
		e.giveBack(context.Background(), l.g)
	}
}

// renewBatch sends the heartbeats of ls in one BatchRenewer call and
// schedules each lease's next heartbeat. Leases that ended, or are being
// released, are left out (the gate in beginRenew).
func (e *engine) renewBatch(ls []*Lease) {
	live := ls[:0]
	gs := make([]driver.Grant, 0, len(ls))
	var latest time.Time
	for _, l := range ls {
		deadline, _, err := l.beginRenew()
		if err != nil {
			continue
		}
		live = append(live, l)
		gs = append(gs, l.g)
		if deadline.After(latest) {
			latest = deadline
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
		giveBack []*Lease
	)
	end := func(i int, err error) {
		mu.Lock()
		if i < 0 || i >= len(live) || answered[i] {
			mu.Unlock()
			return // a backend that broke the contract; the rest is errShortBatch
		}
		answered[i] = true
		mu.Unlock()
		l := live[i]
		err, gb := l.endRenew(sent, time.Since(sent), err)
		l.scheduleHeartbeat(sent, err)
		if gb {
			mu.Lock()
			giveBack = append(giveBack, l)
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
	for _, l := range giveBack {
		e.giveBack(context.Background(), l.g)
	}
}

// release ends l for its holder and then frees its name at the store
// (Lease.Release documents the order and the results).
// The caller (Lease.Release) has serialised it with other Release calls on
// l.
func (e *engine) release(ctx context.Context, l *Lease) error {
	l.mu.Lock()
	eff := l.apply(event{kind: evReleaseBegin})
	var drained chan struct{}
	if eff.wait {
		if l.drained == nil {
			l.drained = make(chan struct{})
		}
		drained = l.drained
	}
	if l.stopFn != nil {
		l.stopFn()
	}
	end := l.st.end
	l.mu.Unlock()
	// Unschedule the lease and cancel its Context before anything is
	// sent: the lease is already invalid (Err says ErrReleased).
	l.finish(eff)
	// The lease has ended: by this call, or before by another goroutine
	// (the scheduler at the deadline) that may still be reporting it.
	// Go on once its Context is cancelled, as the contract says.
	l.waitReported()
	if !eff.send {
		return releaseResult(end, nil)
	}

	rctx, cancel := e.releaseContext(ctx)
	defer cancel()
	sent := time.Now()
	var err error
	if drained != nil {
		select {
		case <-drained:
		case <-rctx.Done():
			err = fmt.Errorf("lease: release %q (token %d) not sent: a renew request is still unanswered: %w", l.g.Name, l.g.Token, rctx.Err())
		}
	}
	if err == nil {
		err = e.b.Release(rctx, l.g)
		if err != nil && !errors.Is(err, ErrNotHeld) {
			err = fmt.Errorf("lease: release %q (token %d): %w", l.g.Name, l.g.Token, err)
		}
	}

	l.mu.Lock()
	eff = l.apply(event{kind: evReleaseEnd, err: err})
	end = l.st.end
	l.mu.Unlock()
	if eff.released {
		e.o.Observer.Released(ReleasedEvent{Ctx: ctx, Name: l.g.Name, Token: l.g.Token, Held: time.Since(l.granted), Sent: sent, Latency: time.Since(sent), Err: err})
	}
	l.finish(eff)
	return releaseResult(end, err)
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

// notifier is the Notifier a backend gets with each request
// (Request.Notify): a lease seen from the store's side. Its reports change
// the lease's state through state.apply, as every other event does.
type notifier Lease

var _ driver.Notifier = (*notifier)(nil)

// Confirmed implements Notifier, for backends that keep grants alive
// themselves.
func (n *notifier) Confirmed(sent time.Time) {
	l := (*Lease)(n)
	l.mu.Lock()
	eff := l.apply(event{kind: evConfirmed, at: sent})
	if eff.moved {
		l.e.sched.setDeadline(&l.dl, l.st.deadline)
	}
	l.mu.Unlock()
}

// Lost implements Notifier.
func (n *notifier) Lost(cause error) {
	l := (*Lease)(n)
	if cause == nil {
		cause = ErrNotHeld
	}
	l.mu.Lock()
	eff := l.apply(event{kind: evPushedLoss, err: cause})
	l.mu.Unlock()
	l.finish(eff)
}
