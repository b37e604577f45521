package lease

import (
	"context"
	"errors"
	"fmt"
	mrand "math/rand/v2"
	"sync"
	"time"

	"github.com/fencekit/fencekit/fence"
	"github.com/fencekit/fencekit/lease/driver"
)

// Holder asks the store who holds the lease name now. It returns an error
// matching ErrNotHeld when no one does, and one matching
// errors.ErrUnsupported when the backend does not implement Inspector.
// The answer may be stale by the time it arrives: use it to report, never
// to decide who may write (that is what the fencing token is for). name
// may be a semaphore's slot (Semaphore.Slots).
func (m *Manager) Holder(ctx context.Context, name string) (Holder, error) {
	if err := driver.ValidateName(name); err != nil { // a semaphore's slot too
		return Holder{}, err
	}
	in := m.e.inspector()
	if in == nil {
		return Holder{}, fmt.Errorf("lease: the backend cannot say who holds a lease: %w", errors.ErrUnsupported)
	}
	return in.Holder(ctx, name)
}

// ElectionOptions configures an Election. NewElection starts from the zero
// value, applies each ElectionOption, and fills zero fields with their
// defaults.
type ElectionOptions struct {
	// OnElected is called when this process becomes the leader, before the
	// leader's work starts. Default: none.
	OnElected func(l *Lease)
	// OnDeposed is called when a leadership ends, after the lease was
	// released: err is what Run returned for that term (the work's error,
	// joined with the loss if the lease was lost), nil after a clean end.
	// Default: none.
	OnDeposed func(l *Lease, err error)
	// MinBackoff is the pause before campaigning again after a term
	// ended. It doubles, with jitter, after each term shorter than
	// MaxBackoff, up to MaxBackoff, and starts again from MinBackoff after
	// a longer one. Default 100 ms; at least 1 ms.
	MinBackoff time.Duration
	// MaxBackoff bounds the pause. Default 10 s; at least MinBackoff.
	MaxBackoff time.Duration
}

// ElectionOption sets fields of ElectionOptions; any
// func(*ElectionOptions) is one.
type ElectionOption func(*ElectionOptions)

// WithOnElected sets ElectionOptions.OnElected.
func WithOnElected(fn func(l *Lease)) ElectionOption {
	return func(o *ElectionOptions) { o.OnElected = fn }
}

// WithOnDeposed sets ElectionOptions.OnDeposed.
func WithOnDeposed(fn func(l *Lease, err error)) ElectionOption {
	return func(o *ElectionOptions) { o.OnDeposed = fn }
}

// WithBackoff sets ElectionOptions.MinBackoff and MaxBackoff.
func WithBackoff(min, max time.Duration) ElectionOption {
	return func(o *ElectionOptions) { o.MinBackoff, o.MaxBackoff = min, max }
}

// Election is a leader election over one lease name: every process that
// runs one campaigns for the name, the one that holds the lease leads, and
// its work gets the lease's context and fencing token. Unlike client-go's
// leaderelection and etcd's concurrency.Election, the leader's writes can be
// fenced: present Lease.Token to sqlguard and blobguard, and a deposed
// leader that was paused past its term cannot overwrite its successor.
type Election struct {
	m    *Manager
	name string
	o    ElectionOptions

	mu      sync.Mutex
	current *Lease
	running bool
}

// NewElection returns an Election for the lease name on m. It does no I/O.
// Errors match ErrInvalidName or ErrInvalidOptions (every problem at once).
func NewElection(m *Manager, name string, opts ...ElectionOption) (*Election, error) {
	if err := ValidateName(name); err != nil {
		return nil, err
	}
	var o ElectionOptions
	for _, opt := range opts {
		if opt != nil {
			opt(&o)
		}
	}
	if o.MinBackoff == 0 {
		o.MinBackoff = 100 * time.Millisecond
	}
	if o.MaxBackoff == 0 {
		o.MaxBackoff = max(10*time.Second, o.MinBackoff)
	}
	var errs []error
	if m == nil {
		errs = append(errs, fmt.Errorf("%w: election: the Manager is nil", ErrInvalidOptions))
	}
	if o.MinBackoff < time.Millisecond {
		errs = append(errs, fmt.Errorf("%w: election: minimum backoff %v is below 1ms", ErrInvalidOptions, o.MinBackoff))
	}
	if o.MaxBackoff < o.MinBackoff {
		errs = append(errs, fmt.Errorf("%w: election: maximum backoff %v is below the minimum %v", ErrInvalidOptions, o.MaxBackoff, o.MinBackoff))
	}
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	return &Election{m: m, name: name, o: o}, nil
}

// Run campaigns until ctx ends. Each time this process is elected, it calls
// lead with a context that ends when the leadership does (the lease was
// lost, Resign was called, or ctx ended) and with the lease, whose Token
// fences the leader's writes. When lead returns, or the leadership is lost,
// the lease is released, OnDeposed is called, and after a backoff the
// process campaigns again. lead should return promptly once its context is
// done; a lead that returns early simply ends its term.
//
// Run returns ctx's error when ctx ends, an error matching
// ErrInvalidOptions if lead is nil or Run is already running, and Acquire's
// error if it fails for another reason than ctx's end. The errors of
// single terms go to OnDeposed and the Manager's log, not to Run's caller.
// A panic in OnElected or lead propagates out of Run once its term has
// ended: the lease released and Deposed reported (OnDeposed is not called).
func (e *Election) Run(ctx context.Context, lead func(ctx context.Context, l *Lease) error) error {
	if lead == nil {
		return fmt.Errorf("%w: election %q: the leader's function is nil", ErrInvalidOptions, e.name)
	}
	e.mu.Lock()
	if e.running {
		e.mu.Unlock()
		return fmt.Errorf("%w: election %q: Run is already running", ErrInvalidOptions, e.name)
	}
	e.running = true
	e.mu.Unlock()
	defer func() {
		e.mu.Lock()
		e.running = false
		e.mu.Unlock()
	}()

	backoff := e.o.MinBackoff
	for {
		l, err := e.m.Acquire(ctx, e.name)
		if err != nil {
			// Acquire retries the store until ctx ends (its failures are
			// in the Manager's log); an error before that is not one the
			// next campaign can fix.
			if ctx.Err() != nil {
				return ctx.Err()
			}
			return fmt.Errorf("lease: election %q: %w", e.name, err)
		}
		err = e.term(ctx, l, lead)
		if e.o.OnDeposed != nil {
			e.o.OnDeposed(l, err)
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
		if err != nil {
			e.m.o.Logger.Warn("lease: election term ended with an error", "name", e.name, "token", uint64(l.Token()), "err", err)
		}
		if held := time.Since(l.granted); held > e.o.MaxBackoff {
			backoff = e.o.MinBackoff
		}
		wait := backoff/2 + mrand.N(backoff/2+1)
		backoff = min(2*backoff, e.o.MaxBackoff)
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return ctx.Err()
		case <-t.C:
		}
	}
}

// term runs the term of l: it reports it to the observer (a term is a job
// too: observeHeld), calls OnElected and lead, and releases l. A panic in
// OnElected or lead propagates, as from any function, but only after the
// term has ended: l released (others need not wait a TTL), JobEnded and
// Deposed reported, Lease nil.
func (e *Election) term(ctx context.Context, l *Lease, lead func(ctx context.Context, l *Lease) error) error {
	e.setCurrent(l)
	stopObserving := func() {}
	ended := false
	defer func() {
		if !ended {
			_ = l.Release(context.WithoutCancel(ctx))
		}
		stopObserving()
		e.setCurrent(nil)
	}()
	stopObserving = observeHeld(ctx, e.m.o.Observer, l, e.name, true)
	if e.o.OnElected != nil {
		e.o.OnElected(l)
	}
	err := runHeld(ctx, l, lead)
	ended = true
	return err
}

func (e *Election) setCurrent(l *Lease) {
	e.mu.Lock()
	e.current = l
	e.mu.Unlock()
}

// Lease returns the lease of the current term while this process leads,
// and nil otherwise.
func (e *Election) Lease() *Lease {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.current
}

// Resign ends this process's current term, if it leads. In this order: the
// leader's context is cancelled (its cause is ErrReleased) and Lease.Err
// reports the lease ended, then the lease is released at the store, which
// lets the next leader in; so no other process leads while this one's
// context is live (docs/design.md, invariant 1). Resign does not wait for the
// leader's function to return (it may call Resign itself): work that
// ignores its context runs on after leadership passed, and only its fenced
// writes stay safe. Run then calls OnDeposed and campaigns again after its
// backoff. It returns what Lease.Release returns, or nil when this process
// does not lead. ctx bounds the release (see Lease.Release).
func (e *Election) Resign(ctx context.Context) error {
	l := e.Lease()
	if l == nil {
		return nil
	}
	return l.Release(ctx)
}

// Observe calls fn with the leader as the store reports it: once when the
// store first answers, then every time the leader changes (another owner
// or another token, so a leader that lost its lease and won it again is
// reported again), with the zero Holder (empty Owner) while no one leads.
// It suits followers that do not campaign as well as those that do. It
// asks the store (Manager.Holder, one read) every Options.PollInterval of
// the Manager. It does not subscribe to releases (Watcher): on some stores
// (ZooKeeper) a subscription queues behind the holder like a waiter, and an
// observer must never stand in the queue. fn is called on Observe's
// goroutine, one call at a time; while it runs, nothing is asked.
//
// What fn is told is a report, late by up to a poll interval and possibly
// stale by the time it is read: use it to display, route or alert, never
// to decide who may write (that is the fencing token's job). Client-go's
// OnNewLeader and etcd's Election.Observe give the same kind of report.
//
// Observe returns ctx's error when ctx ends; an error matching
// errors.ErrUnsupported at once when the backend cannot say who holds a
// lease (it does not implement Inspector), or a setup error (ErrSetup) that
// asking again cannot fix. Other failed requests are logged (Options.Logger,
// at warning level) and asked again at the next poll; fn is not called for
// them.
func (e *Election) Observe(ctx context.Context, fn func(Holder)) error {
	if fn == nil {
		return fmt.Errorf("%w: election %q: the observer's function is nil", ErrInvalidOptions, e.name)
	}
	in := e.m.e.inspector()
	if in == nil {
		return fmt.Errorf("lease: election %q: the backend cannot say who holds a lease: %w", e.name, errors.ErrUnsupported)
	}
	t := time.NewTimer(0)
	defer t.Stop()
	var (
		last  Holder
		known bool
	)
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-t.C:
		}
		h, err := in.Holder(ctx, e.name)
		switch {
		case err == nil, errors.Is(err, ErrNotHeld):
			if err != nil {
				h = Holder{Name: e.name} // whatever else the store returned
			}
			if !known || h.Owner != last.Owner || h.Token != last.Token {
				known, last = true, h
				fn(h)
			}
		case ctx.Err() != nil:
			return ctx.Err()
		case errors.Is(err, ErrSetup):
			return fmt.Errorf("lease: election %q: observe: %w", e.name, err)
		default:
			e.m.o.Logger.Warn("lease: election observer: asking who leads failed", "name", e.name, "err", err)
		}
		t.Reset(e.m.o.PollInterval)
	}
}

// Leader asks the store who leads now (see Manager.Holder): an error
// matching ErrNotHeld when no one does, or errors.ErrUnsupported when the
// backend cannot tell.
func (e *Election) Leader(ctx context.Context) (Holder, error) {
	return e.m.Holder(ctx, e.name)
}

// ElectionObserver is an Observer that also hears when this process's
// leadership of an election starts and ends. An Election whose Manager's
// Observer implements it reports every term: Elected when the term's lease
// is granted (before OnElected and the leader's work), Deposed the moment
// that lease's validity ends (it was lost, resigned or released), exactly
// once per term: on the goroutine that ends it, before the lease's context
// is cancelled, before the request that frees it at the store is sent, and
// before OnDeposed.
// Between the two this process leads. While the store keeps its contract
// and every process runs on time, at most one process is between Elected
// and Deposed at any instant: a term's Deposed comes at its lease's local
// deadline, before the store may grant the lease again. A process paused
// when its term ends (a GC, a suspended VM, a stalled observer) reports
// Deposed only when it runs again, possibly after another process was
// Elected. So a gauge that is 1 between the two (package leaseprom exports
// fencekit_election_leader), summed across processes, can be above 1: for
// a moment at a hand-off, also because each process is scraped at its own
// moments, and for as long as a paused leader has not caught up. Alert
// when the sum stays above 1 for longer than a scrape interval or two: two
// processes believe they lead (fenced writes stay safe either way).
// A term is a job too: a JobObserver hears JobStarted just after Elected
// and JobEnded just before Deposed.
type ElectionObserver interface {
	Observer
	Elected(ElectionEvent)
	Deposed(ElectionEvent)
}

// ElectionEvent describes the start or the end of one term.
type ElectionEvent struct {
	// Ctx: for Elected, the context Run was called with; for Deposed, the
	// same (its values; it may be done by then).
	Ctx context.Context
	// Election is the election's lease name.
	Election string
	// Token is the fencing token of the term's lease.
	Token fence.Token
	// Err, for Deposed, is why the term's lease ended: ErrReleased after
	// Resign, a Release or the end of the leader's work, a *LostError when
	// it was lost. Nil for Elected.
	Err error
}

var _ ElectionObserver = Observers(nil)

// Elected passes e to each observer that is an ElectionObserver.
func (os Observers) Elected(e ElectionEvent) {
	for _, o := range os {
		if eo, ok := o.(ElectionObserver); ok {
			eo.Elected(e)
		}
	}
}

// Deposed passes e to each observer that is an ElectionObserver.
func (os Observers) Deposed(e ElectionEvent) {
	for _, o := range os {
		if eo, ok := o.(ElectionObserver); ok {
			eo.Deposed(e)
		}
	}
}
