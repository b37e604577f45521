package lease

import (
	"context"
	"errors"
	"fmt"
)

// Run acquires the lease name, waiting while another holder has it (as
// Acquire does), runs fn under it, and releases it. It is the whole life of
// a lease for one job: a scheduled task, a migration, a batch that must run
// on one replica at a time.
//
// fn gets a context that ends when the lease is lost or released, or when
// ctx ends, and the lease itself: present l.Token() to every write fn makes
// through a fenced store (packages sqlguard and blobguard), so that the
// store rejects them if a newer holder has written since. The context also
// carries the token (fence.FromContext).
//
// Run returns fn's error, joined with the lease's *LostError (ErrLost) if
// the lease was lost before fn returned, and with the release's error if the
// release failed. It returns the acquire's error, without calling fn, if the
// lease could not be had before ctx ended (ErrNotAcquired joined with
// ctx.Err()). A nil error means fn succeeded and the lease was held
// throughout and released. ctx bounds the wait and the work; the release
// runs even when ctx has ended (Lease.Release).
func (m *Manager) Run(ctx context.Context, name string, fn func(ctx context.Context, l *Lease) error) error {
	if fn == nil {
		return errNilRunFunc
	}
	l, err := m.Acquire(ctx, name)
	if err != nil {
		return err
	}
	return m.runJob(ctx, l, name, fn)
}

// TryRun is Run with one acquire attempt: when another holder has the
// lease, it returns at once with an error matching ErrNotAcquired and does
// not call fn (see TryAcquire).
func (m *Manager) TryRun(ctx context.Context, name string, fn func(ctx context.Context, l *Lease) error) error {
	if fn == nil {
		return errNilRunFunc
	}
	l, err := m.TryAcquire(ctx, name)
	if err != nil {
		return err
	}
	return m.runJob(ctx, l, name, fn)
}

// errNilRunFunc is Run's and TryRun's answer to a nil function, before
// any request.
var errNilRunFunc = fmt.Errorf("%w: Run: the function is nil", ErrInvalidOptions)

// runJob runs fn, the job name, under the held lease l and releases l,
// reporting the job to the Manager's Observer (observeHeld).
func (m *Manager) runJob(ctx context.Context, l *Lease, name string, fn func(ctx context.Context, l *Lease) error) error {
	wait := observeHeld(ctx, m.o.Observer, l, name, false)
	defer wait() // after a panic too: fn's lease is released by then
	return runHeld(ctx, l, fn)
}

// observeHeld reports the work under l, named name, to obs: for a job,
// JobStarted now and JobEnded when l ends, if obs is a JobObserver; for an
// election's term (term set), Elected before JobStarted and Deposed after
// JobEnded as well, if obs is an ElectionObserver. The end is reported by
// the goroutine that ends l, before l's context is cancelled and before a
// release is sent (Lease.whenEnded; at once if l has ended already). The
// returned function waits until the end has been reported: l has always
// ended by the time runHeld returns (it releases l), but the goroutine that
// ended it may still be reporting.
func observeHeld(ctx context.Context, obs Observer, l *Lease, name string, term bool) (wait func()) {
	jo, _ := obs.(JobObserver)
	var eo ElectionObserver
	if term {
		eo, _ = obs.(ElectionObserver)
	}
	if jo == nil && eo == nil {
		return func() {}
	}
	tok := l.Token()
	if eo != nil {
		eo.Elected(ElectionEvent{Ctx: ctx, Election: name, Token: tok})
	}
	if jo != nil {
		jo.JobStarted(JobEvent{Ctx: ctx, Name: name, Token: tok})
	}
	done := make(chan struct{})
	l.whenEnded(func(end error) {
		if jo != nil {
			jo.JobEnded(JobEvent{Ctx: ctx, Name: name, Token: tok, Err: end})
		}
		if eo != nil {
			eo.Deposed(ElectionEvent{Ctx: ctx, Election: name, Token: tok, Err: end})
		}
		close(done)
	})
	return func() { <-done }
}

// runHeld runs fn under the held lease l and releases it.
func runHeld(ctx context.Context, l *Lease, fn func(ctx context.Context, l *Lease) error) error {
	work, cancel := context.WithCancelCause(l.Context())
	stop := context.AfterFunc(ctx, func() { cancel(context.Cause(ctx)) })
	err := callReleasingOnPanic(work, l, fn)
	stop()
	cancel(nil)
	// The loss, if the lease ended before fn returned: it is what makes
	// fn's work suspect, whatever fn itself reported.
	lostErr := l.Err()
	if !errors.Is(lostErr, ErrLost) {
		lostErr = nil
	}
	relErr := l.Release(ctx)
	if errors.Is(relErr, ErrLost) {
		// Lost while fn ran, or found lost by the release itself.
		lostErr, relErr = relErr, nil
	}
	return errors.Join(err, lostErr, relErr)
}

// callReleasingOnPanic calls fn. A panic in fn propagates, as it would
// from any function, but only after the lease is released, so that others
// need not wait a TTL for it.
func callReleasingOnPanic(ctx context.Context, l *Lease, fn func(ctx context.Context, l *Lease) error) (err error) {
	panicking := true
	defer func() {
		if panicking {
			_ = l.Release(context.WithoutCancel(ctx))
		}
	}()
	err = fn(ctx, l)
	panicking = false
	return err
}
