package lease_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/fencekit/fencekit/fence"
	"github.com/fencekit/fencekit/lease"
	"github.com/fencekit/fencekit/lease/driver"
	"github.com/fencekit/fencekit/lease/memlease"
)

// releaseProbe is a memory store whose Release records what the lease it
// frees looked like from its holder's side when the request reached the
// store: a waiter woken by that request may be granted the name at once.
type releaseProbe struct {
	*memlease.Backend
	mu      sync.Mutex
	watch   map[string]func() (valid bool, detail string) // per owner
	seen    []string                                      // one line per release that found its lease still valid
	release atomic.Int32
}

func (p *releaseProbe) observe(l *lease.Lease, work context.Context) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.watch == nil {
		p.watch = map[string]func() (bool, string){}
	}
	p.watch[l.Owner()] = func() (bool, string) {
		var valid []string
		if err := l.Err(); err == nil {
			valid = append(valid, "Err() == nil")
		}
		select {
		case <-l.Done():
		default:
			valid = append(valid, "Done() open")
		}
		if work != nil && work.Err() == nil {
			valid = append(valid, "the work's context live")
		}
		return len(valid) > 0, fmt.Sprint(valid)
	}
}

func (p *releaseProbe) Release(ctx context.Context, g driver.Grant) error {
	p.release.Add(1)
	p.mu.Lock()
	check := p.watch[g.Owner]
	p.mu.Unlock()
	if check != nil {
		if valid, detail := check(); valid {
			p.mu.Lock()
			p.seen = append(p.seen, fmt.Sprintf("token %d: %s when its release reached the store", g.Token, detail))
			p.mu.Unlock()
		}
	}
	return p.Backend.Release(ctx, g)
}

func (p *releaseProbe) validAtRelease() []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]string(nil), p.seen...)
}

// A lease stops being valid, from its holder's own view, before the
// request that frees it is sent (docs/design.md, invariant 1): Err, Done and
// every context derived from the lease's Context say so when the store
// processes the release. (Before: Err was nil and the Context live until
// the store's answer came back, and a waiter woken by the release was
// granted meanwhile.)
func TestReleaseEndsValidityBeforeItIsSent(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		p := &releaseProbe{Backend: memlease.New()}
		m, err := lease.NewManager(p, time.Second)
		if err != nil {
			t.Fatal(err)
		}
		ctx := context.Background()

		l, err := m.TryAcquire(ctx, "release")
		if err != nil {
			t.Fatal(err)
		}
		work, cancel := context.WithCancel(l.Context())
		defer cancel()
		p.observe(l, work)
		if err := l.Release(ctx); err != nil {
			t.Fatalf("Release: %v", err)
		}
		if p.release.Load() != 1 {
			t.Fatalf("%d release requests, want 1", p.release.Load())
		}
		if seen := p.validAtRelease(); len(seen) > 0 {
			t.Fatalf("the lease was still valid for its holder while the store freed it: %q", seen)
		}
		if !errors.Is(context.Cause(work), lease.ErrReleased) || !errors.Is(l.Err(), lease.ErrReleased) {
			t.Fatalf("after Release: work cause %v, Err %v; want ErrReleased", context.Cause(work), l.Err())
		}

		// The same through Run: fn's context is done before the release is
		// sent.
		err = m.Run(ctx, "run", func(ctx context.Context, l *lease.Lease) error {
			p.observe(l, ctx)
			return nil
		})
		if err != nil {
			t.Fatalf("Run: %v", err)
		}
		if seen := p.validAtRelease(); len(seen) > 0 {
			t.Fatalf("Run's lease was still valid while the store freed it: %q", seen)
		}
	})
}

// A Release that finds the store had let the grant go reports the loss,
// and Err changes from ErrReleased to that *LostError; the lease was never
// valid during the request.
func TestReleaseOfAGrantTheStoreLostReportsTheLoss(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := memlease.New()
		p := &releaseProbe{Backend: b}
		var lost atomic.Int32
		m, err := lease.NewManager(p, time.Second, lease.WithObserver(lostCounter{&lost}))
		if err != nil {
			t.Fatal(err)
		}
		l, err := m.TryAcquire(context.Background(), "gone")
		if err != nil {
			t.Fatal(err)
		}
		p.observe(l, nil)
		b.Forget() // the store lost the grant; the holder does not know yet
		err = l.Release(context.Background())
		var le *lease.LostError
		if !errors.As(err, &le) || le.Reason != lease.LostTakenOver {
			t.Fatalf("Release of a grant the store lost = %v, want a *LostError (taken over)", err)
		}
		if !errors.Is(l.Err(), lease.ErrLost) {
			t.Fatalf("Err after Release found the grant gone = %v, want ErrLost", l.Err())
		}
		if seen := p.validAtRelease(); len(seen) > 0 {
			t.Fatalf("valid while the store was asked: %q", seen)
		}
		if lost.Load() != 1 {
			t.Fatalf("Observer.Lost called %d times, want 1", lost.Load())
		}
	})
}

type lostCounter struct{ n *atomic.Int32 }

func (c lostCounter) Acquired(lease.AcquiredEvent) {}
func (c lostCounter) Renewed(lease.RenewedEvent)   {}
func (c lostCounter) Lost(lease.LostEvent)         { c.n.Add(1) }
func (c lostCounter) Released(lease.ReleasedEvent) {}

// Election.Resign tells the leader's work to stop (its context is
// cancelled) before the request that lets the next leader in is sent.
func TestResignStopsTheLeaderBeforeLeadershipPasses(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		p := &releaseProbe{Backend: memlease.New()}
		m, err := lease.NewManager(p, time.Second)
		if err != nil {
			t.Fatal(err)
		}
		e, err := lease.NewElection(m, "leader", lease.WithBackoff(time.Minute, time.Minute))
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		leading := make(chan struct{})
		workDone := make(chan error, 1)
		runDone := make(chan error, 1)
		go func() {
			runDone <- e.Run(ctx, func(ctx context.Context, l *lease.Lease) error {
				p.observe(l, ctx)
				close(leading)
				<-ctx.Done()
				workDone <- context.Cause(ctx)
				return nil
			})
		}()
		<-leading
		if err := e.Resign(context.Background()); err != nil {
			t.Fatalf("Resign: %v", err)
		}
		if seen := p.validAtRelease(); len(seen) > 0 {
			t.Fatalf("the leader's work could still run when its leadership was released: %q", seen)
		}
		if cause := <-workDone; !errors.Is(cause, lease.ErrReleased) {
			t.Fatalf("the leader's work ended with cause %v, want ErrReleased", cause)
		}
		cancel()
		if err := <-runDone; !errors.Is(err, context.Canceled) {
			t.Fatalf("Run = %v", err)
		}
	})
}

// hangingWatch is a store whose Watch never confirms the subscription: it
// waits for its context (as etcd's watch waits for the server's created
// event).
type hangingWatch struct {
	*memlease.Backend
	mu       sync.Mutex
	calls    []time.Duration // how long each Watch's context allowed
	attempts []time.Time     // when each acquire request was sent
}

func (h *hangingWatch) Acquire(ctx context.Context, r driver.Request) (driver.Grant, error) {
	h.mu.Lock()
	h.attempts = append(h.attempts, time.Now())
	h.mu.Unlock()
	return h.Backend.Acquire(ctx, r)
}

func (h *hangingWatch) Watch(ctx context.Context, name string) (<-chan struct{}, func(), error) {
	start := time.Now()
	<-ctx.Done()
	h.mu.Lock()
	h.calls = append(h.calls, time.Since(start))
	h.mu.Unlock()
	return nil, nil, ctx.Err()
}

// PollInterval is the longest wait between attempts, whatever a backend's
// Watch does: a subscription the store never confirms is given up after
// PollInterval and the waiter polls. (Before: the whole Acquire context
// went to Watch, and a waiter made no attempt until it ended.)
func TestWatchThatNeverConfirmsDoesNotStopPolling(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h := &hangingWatch{Backend: memlease.New()}
		const poll = 50 * time.Millisecond
		holder, err := lease.NewManager(h.Backend, time.Second)
		if err != nil {
			t.Fatal(err)
		}
		waiter, err := lease.NewManager(h, time.Second, lease.WithPollInterval(poll))
		if err != nil {
			t.Fatal(err)
		}
		held, err := holder.TryAcquire(context.Background(), "w")
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		got := make(chan error, 1)
		go func() {
			l, err := waiter.Acquire(ctx, "w")
			if err == nil {
				err = l.Release(context.Background())
			}
			got <- err
		}()
		// Let the waiter try, fail, and get stuck in Watch twice (after
		// one, its next attempt and the release below come at the same
		// instant, in either order).
		for {
			h.mu.Lock()
			n := len(h.calls)
			h.mu.Unlock()
			if n > 1 {
				break
			}
			time.Sleep(time.Millisecond)
		}
		if err := held.Release(context.Background()); err != nil {
			t.Fatal(err)
		}
		if err := <-got; err != nil {
			t.Fatalf("the waiter did not get the lease before its context ended: %v", err)
		}
		h.mu.Lock()
		defer h.mu.Unlock()
		for _, d := range h.calls {
			// The Watch's context ended by its own PollInterval timeout,
			// not by the caller's minute (virtual time: exact).
			if d > poll {
				t.Fatalf("a Watch was allowed %v, want PollInterval %v", d, poll)
			}
		}
		// PollInterval is the longest wait between attempts, the time
		// spent in the Watch included.
		for i := 1; i < len(h.attempts); i++ {
			if gap := h.attempts[i].Sub(h.attempts[i-1]); gap > poll {
				t.Fatalf("attempts %d and %d were %v apart, more than PollInterval %v", i-1, i, gap, poll)
			}
		}
		if len(h.attempts) < 3 {
			t.Fatalf("%d attempts, want several", len(h.attempts))
		}
	})
}

// splitBatch is a store spread over two nodes: a batch's grants whose name
// starts with "slow" are on a node that has stalled (its client gives up
// only some time after the batch's context ended, as a read timeout
// would), the others are answered at once.
type splitBatch struct {
	*memlease.Backend
}

func (s *splitBatch) RenewBatch(ctx context.Context, gs []driver.Grant, done func(int, error)) {
	var slow []int
	for i, g := range gs {
		if len(g.Name) >= 4 && g.Name[:4] == "slow" {
			slow = append(slow, i)
			continue
		}
		done(i, s.Backend.Renew(ctx, g))
	}
	if len(slow) > 0 {
		<-ctx.Done()
		time.Sleep(100 * time.Millisecond)
		for _, i := range slow {
			done(i, ctx.Err())
		}
	}
}

// One stalled node loses only its own leases: a batch applies each grant's
// outcome when it is known, so the leases the healthy node renewed keep
// their deadlines moving while the stalled node's reply never comes.
// (Before: RenewBatch returned every outcome at once, after the stalled
// node, and the healthy node's leases were lost at their deadlines too.)
func TestStalledNodeLosesOnlyItsOwnLeases(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		sb := &splitBatch{Backend: memlease.New()}
		const ttl = 400 * time.Millisecond
		m, err := lease.NewManager(sb, ttl, lease.WithRenewInterval(ttl/4), lease.WithRenewBatchWindow(ttl/20))
		if err != nil {
			t.Fatal(err)
		}
		var fast, slow []*lease.Lease
		for i := range 4 {
			for _, prefix := range []string{"fast", "slow"} {
				l, err := m.TryAcquire(context.Background(), fmt.Sprintf("%s-%d", prefix, i))
				if err != nil {
					t.Fatal(err)
				}
				if prefix == "fast" {
					fast = append(fast, l)
				} else {
					slow = append(slow, l)
				}
			}
		}
		for _, l := range slow {
			<-l.Done()
			if !errors.Is(l.Err(), lease.ErrLost) {
				t.Fatalf("%s on the stalled node: %v, want lost", l.Name(), l.Err())
			}
		}
		// Two more TTLs: the healthy node's leases live on.
		time.Sleep(2 * ttl)
		for _, l := range fast {
			if err := l.Err(); err != nil {
				t.Fatalf("%s on the healthy node was lost with the stalled node's: %v", l.Name(), err)
			}
			if err := l.Release(context.Background()); err != nil {
				t.Fatal(err)
			}
		}
	})
}

// shortOnce is a memory store whose first grant reports a TTL shorter than
// asked (a store breaking the contract), which the Manager gives back.
type shortOnce struct {
	*memlease.Backend
	calls atomic.Int32
}

func (b *shortOnce) Acquire(ctx context.Context, r driver.Request) (driver.Grant, error) {
	g, err := b.Backend.Acquire(ctx, r)
	if err == nil && b.calls.Add(1) == 1 {
		g.TTL = r.TTL / 2
	}
	return g, err
}

// A grant the Manager gives back ends its owner at the store (Release),
// which refuses that owner from then on: a blocking Acquire goes on as a
// new owner and is granted at its next attempt, not after EndedOwnerTTL.
// In virtual time.
func TestAcquireAfterAGivenBackGrantUsesANewOwner(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const ttl, poll = time.Second, 100 * time.Millisecond
		b := &shortOnce{Backend: memlease.New()}
		m, err := lease.NewManager(b, ttl, lease.WithPollInterval(poll))
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		start := time.Now()
		l, err := m.Acquire(ctx, "short")
		if err != nil {
			t.Fatalf("Acquire after a given-back grant: %v", err)
		}
		if waited := time.Since(start); waited > poll {
			t.Fatalf("granted %v after the given-back grant, want at the next attempt (within PollInterval %v)", waited, poll)
		}
		if n := b.calls.Load(); n != 2 {
			t.Fatalf("%d grants, want the given-back one and one more", n)
		}
		if err := l.Release(ctx); err != nil {
			t.Fatal(err)
		}
	})
}

// blackholed is a store that answers nothing: every request waits for its
// context.
type blackholed struct {
	*memlease.Backend
	abandons atomic.Int32
}

func (b *blackholed) Acquire(ctx context.Context, _ driver.Request) (driver.Grant, error) {
	<-ctx.Done()
	return driver.Grant{}, ctx.Err()
}

func (b *blackholed) Abandon(ctx context.Context, _ driver.Request) error {
	b.abandons.Add(1)
	<-ctx.Done()
	return ctx.Err()
}

// When the caller's context cuts an acquire request short, the Manager
// abandons it at the store, but gives the Abandon no more time than the
// request had (at least 50 ms), not ReleaseTimeout: a caller polling with
// a short context during an outage is not held for seconds. The error says
// the Abandon failed. A FIFO Acquire then tries once more to give up its
// place in line, for at most PollInterval. In virtual time.
func TestAbandonAfterAShortContextIsBoundedByIt(t *testing.T) {
	for _, c := range []struct {
		name      string
		try, fifo bool
	}{{"TryAcquire", true, false}, {"Acquire", false, false}, {"Acquire with FIFO", false, true}} {
		synctest.Test(t, func(t *testing.T) {
			b := &blackholed{Backend: memlease.New()}
			var opts []lease.Option
			if c.fifo {
				opts = append(opts, lease.WithFIFO())
			}
			m, err := lease.NewManager(b, 10*time.Second, opts...) // PollInterval 1 s, ReleaseTimeout 5 s
			if err != nil {
				t.Fatal(err)
			}
			const budget = 100 * time.Millisecond
			ctx, cancel := context.WithTimeout(context.Background(), budget)
			defer cancel()
			start := time.Now()
			if c.try {
				_, err = m.TryAcquire(ctx, "dark")
			} else {
				_, err = m.Acquire(ctx, "dark")
			}
			took := time.Since(start)
			if !errors.Is(err, context.DeadlineExceeded) || !strings.Contains(err.Error(), "abandon") {
				t.Fatalf("%s: error %v; want the deadline, saying the abandon failed", c.name, err)
			}
			want, limit := int32(1), 2*budget
			if c.fifo {
				want, limit = 2, limit+m.Options().PollInterval // the request's Abandon, then the place's
			}
			if n := b.abandons.Load(); n != want {
				t.Fatalf("%s: %d Abandon requests, want %d", c.name, n, want)
			}
			if took > limit {
				t.Fatalf("%s returned %v after a %v context, want at most %v (ReleaseTimeout %v): the Abandon was not bounded by the request's own time",
					c.name, took, budget, limit, m.Options().ReleaseTimeout)
			}
		})
	}
}

// misconfigured is a store that answers every acquire with an error that
// retrying cannot fix.
type misconfigured struct {
	*memlease.Backend
	calls atomic.Int32
}

var errNoTables = &lease.SetupError{Err: errors.New("relation \"leases\" does not exist"), Fix: "run fencekit migrate up"}

func (b *misconfigured) Acquire(context.Context, driver.Request) (driver.Grant, error) {
	b.calls.Add(1)
	return driver.Grant{}, errNoTables
}

func (b *misconfigured) Check(context.Context) error { return errNoTables }

// An error that retrying cannot fix (ErrSetup) ends a blocking Acquire,
// Run and Election.Run at once, with the error that names the fix, instead
// of a retry until the context ends; Manager.Check reports it before any
// lease is asked for. In virtual time: "at once" is exactly no time.
func TestSetupErrorEndsAcquireAtOnce(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := &misconfigured{Backend: memlease.New()}
		m, err := lease.NewManager(b, time.Second)
		if err != nil {
			t.Fatal(err)
		}
		if err := m.Check(context.Background()); !errors.Is(err, lease.ErrSetup) {
			t.Fatalf("Check = %v, want ErrSetup", err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), time.Hour)
		defer cancel()
		start := time.Now()
		_, err = m.Acquire(ctx, "jobs")
		if !errors.Is(err, lease.ErrSetup) || errors.Is(err, lease.ErrNotAcquired) || !strings.Contains(err.Error(), "fencekit migrate up") {
			t.Fatalf("Acquire = %v; want the setup error naming the fix, not ErrNotAcquired", err)
		}
		var se *lease.SetupError
		if !errors.As(err, &se) || se.Fix != errNoTables.Fix {
			t.Fatalf("Acquire = %v; want the backend's *SetupError with its fix", err)
		}
		if waited := time.Since(start); waited != 0 || b.calls.Load() != 1 {
			t.Fatalf("Acquire returned after %v and %d attempts; want at once, after one", waited, b.calls.Load())
		}
		err = m.Run(ctx, "jobs", func(context.Context, *lease.Lease) error { return nil })
		if !errors.Is(err, lease.ErrSetup) {
			t.Fatalf("Run = %v, want ErrSetup", err)
		}
		e, err := lease.NewElection(m, "leader")
		if err != nil {
			t.Fatal(err)
		}
		if err := e.Run(ctx, func(context.Context, *lease.Lease) error { return nil }); !errors.Is(err, lease.ErrSetup) {
			t.Fatalf("Election.Run = %v, want ErrSetup", err)
		}
		if time.Since(start) != 0 {
			t.Fatalf("took %v of virtual time", time.Since(start))
		}
		// A backend that cannot check says so.
		plain, _ := lease.NewManager(struct{ lease.Backend }{memlease.New()}, time.Second)
		if err := plain.Check(ctx); !errors.Is(err, errors.ErrUnsupported) {
			t.Fatalf("Check without a Checker = %v, want ErrUnsupported", err)
		}
	})
}

// flaky is a store whose first acquire fails with a transient error.
type flaky struct {
	*memlease.Backend
	calls atomic.Int32
}

var errFlaky = errors.New("connection reset by peer")

func (b *flaky) Acquire(ctx context.Context, r driver.Request) (driver.Grant, error) {
	if b.calls.Add(1) == 1 {
		return driver.Grant{}, errFlaky
	}
	return b.Backend.Acquire(ctx, r)
}

// capture is a slog handler that keeps warning messages.
type capture struct {
	mu   sync.Mutex
	msgs []string
}

func (c *capture) Enabled(_ context.Context, l slog.Level) bool { return l >= slog.LevelWarn }
func (c *capture) Handle(_ context.Context, r slog.Record) error {
	c.mu.Lock()
	c.msgs = append(c.msgs, r.Message)
	c.mu.Unlock()
	return nil
}
func (c *capture) WithAttrs([]slog.Attr) slog.Handler { return c }
func (c *capture) WithGroup(string) slog.Handler      { return c }

// With no Logger set, a failed acquire attempt that will be retried is a
// warning in the program's own logger (slog.Default), as docs/operations.md
// says and as every fencekit package does; and the error of an Acquire that
// gives up is one line that still matches each cause.
func TestDefaultLoggerAndOneLineErrors(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c := &capture{}
		prev := slog.Default()
		slog.SetDefault(slog.New(c))
		t.Cleanup(func() { slog.SetDefault(prev) })

		b := &flaky{Backend: memlease.New()}
		m, err := lease.NewManager(b, time.Second, lease.WithPollInterval(time.Millisecond))
		if err != nil {
			t.Fatal(err)
		}
		l, err := m.Acquire(context.Background(), "logged")
		if err != nil {
			t.Fatal(err)
		}
		c.mu.Lock()
		got := append([]string(nil), c.msgs...)
		c.mu.Unlock()
		if len(got) == 0 || !strings.Contains(got[0], "acquire attempt failed") {
			t.Fatalf("warnings in slog.Default: %q; want the failed attempt", got)
		}

		// Held by l: a second Acquire gives up when its context ends.
		b.calls.Store(0) // its first attempt fails with the store's error
		ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
		defer cancel()
		_, err = m.Acquire(ctx, "logged")
		for _, want := range []error{lease.ErrNotAcquired, errFlaky, context.DeadlineExceeded} {
			if !errors.Is(err, want) {
				t.Errorf("Acquire's error %v does not match %v", err, want)
			}
		}
		if strings.Contains(err.Error(), "\n") {
			t.Errorf("Acquire's error is not one line: %q", err)
		}
		_ = l.Release(context.Background())
	})
}

// The guards' setup errors (fence.SetupError, from a package that never
// imports lease) match lease.ErrSetup: one sentinel for both sides, so
// that a caller's retry loop stops on either. RunOnce returns a ledger's
// setup error before the job runs.
func TestGuardSetupErrorIsLeaseSetup(t *testing.T) {
	if lease.ErrSetup != fence.ErrSetup || driver.ErrSetup != fence.ErrSetup {
		t.Fatal("lease.ErrSetup, driver.ErrSetup and fence.ErrSetup are not one value")
	}
	guardErr := fmt.Errorf("dbguard: update `orders`: %w", fence.Setup("add it with `fencekit migrate add-lock-version`", "%w: orders", fence.ErrNoLockVersion))
	var se *lease.SetupError
	if !errors.Is(guardErr, lease.ErrSetup) || !errors.As(guardErr, &se) || se.Fix == "" {
		t.Fatalf("%v: want lease.ErrSetup and a *lease.SetupError with the fix", guardErr)
	}
	synctest.Test(t, func(t *testing.T) {
		m, err := lease.NewManager(memlease.New(), time.Second)
		if err != nil {
			t.Fatal(err)
		}
		ran, err := m.RunOnce(t.Context(), "nightly", "2026-12-01", setupLedger{guardErr}, func(context.Context, *lease.Lease) error {
			t.Error("the job ran over a ledger that is not set up")
			return nil
		})
		if ran || !errors.Is(err, lease.ErrSetup) || !errors.Is(err, fence.ErrNoLockVersion) {
			t.Fatalf("RunOnce = %v, %v; want the ledger's setup error, not run", ran, err)
		}
	})
}

// setupLedger is a ledger whose store is not set up.
type setupLedger struct{ err error }

func (l setupLedger) Claim(context.Context, string, string, fence.Token) (bool, error) {
	return false, l.err
}
func (l setupLedger) MarkDone(context.Context, string, string, fence.Token) error { return l.err }
