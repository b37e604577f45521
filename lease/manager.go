package lease

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	mrand "math/rand/v2"
	"os"
	"strings"
	"time"
	"unicode"

	"github.com/fencekit/fencekit/lease/driver"
)

// Manager acquires leases from one Backend with one set of Options. It is
// safe for concurrent use; one Manager can hold any number of leases, and
// serves all their deadlines and heartbeats from one timer.
type Manager struct {
	o Options
	e engine // every request to the store
}

// NewManager returns a Manager over b whose leases have the given TTL: how
// long the store keeps a grant after each acquire or renew. The TTL must be
// within b's Limits (for example, a whole number of milliseconds of at least
// 10 ms for package redislease). Each opt is applied to Options whose TTL is
// ttl, then defaults fill the zero fields (see Options), and the result is
// validated. Every problem is reported at once, in an error matching
// ErrInvalidOptions; no I/O happens.
func NewManager(b Backend, ttl time.Duration, opts ...Option) (*Manager, error) {
	o := Options{TTL: ttl}
	for _, opt := range opts {
		if opt != nil {
			opt(&o)
		}
	}
	if o.Identity == "" {
		o.Identity = defaultIdentity()
	}
	var limits driver.Limits
	if b != nil {
		limits = b.Limits()
	}
	given := o
	o = o.withDefaults()
	if err := o.validate(given, b, limits); err != nil {
		return nil, err
	}
	m := &Manager{o: o}
	m.e.init(b, &m.o)
	return m, nil
}

// Check asks the store whether it can grant leases, without asking for
// one: a service can call it at start-up, before it takes traffic. It
// returns nil when the store can, an error matching ErrSetup, naming the
// fix, when the store answers but is not set up for leases, the store's
// error when it cannot be reached, and an error matching
// errors.ErrUnsupported when the backend does not implement Checker.
// ctx bounds the check.
func (m *Manager) Check(ctx context.Context) error {
	return m.e.check(ctx)
}

// Options returns the Manager's options, with defaults filled in.
func (m *Manager) Options() Options { return m.o }

// TryAcquire makes one attempt to acquire the lease name and returns at once.
// When another holder has it, the error matches ErrNotAcquired (a
// *NotAcquiredError where the backend knows how long the holder has left).
// A grant whose reply arrives after its own local deadline is given back and
// reported as not acquired. Other errors come from the store; after one the
// outcome may be unknown, and a grant the reply of which was lost expires
// after one TTL. Names are checked first (ErrInvalidName, no I/O).
//
// ctx bounds the attempt only (a grant whose reply comes after the lease's
// validity, TTL - safety margin, is given back: a ctx with that timeout
// stops waiting for one). When ctx ends while the request is in flight,
// TryAcquire tells the store to abandon it (Backend.Abandon) before it
// returns, so that a request arriving late grants nothing. The Abandon is
// given as long as the request had (at least 50 ms, at most
// Options.ReleaseTimeout), so TryAcquire returns within about twice ctx's
// time even when the store does not answer; the error then says that the
// Abandon failed. The lease's own Context is not derived from ctx's
// cancellation; it keeps ctx's values.
func (m *Manager) TryAcquire(ctx context.Context, name string) (*Lease, error) {
	if err := ValidateName(name); err != nil {
		return nil, err
	}
	start := time.Now()
	req := m.request(name)
	l, err := m.e.attempt(ctx, ctx, req, start, 1)
	if err != nil && ctx.Err() != nil && outcomeUnknown(err) {
		err, _ = m.abandonAfter(ctx, req, time.Since(start), err)
	}
	return l, err
}

// Acquire acquires the lease name, waiting while another holder has it until
// it is released or expires, or until ctx ends. A waiter is woken as soon as
// the holder releases when the backend implements Watcher (Redis: pub/sub),
// and otherwise polls with jitter (Options.PollInterval). Transient store
// errors are retried the same way, and logged as warnings. Attempts of one
// call use the same owner until one is abandoned (below), so a retry of an
// attempt whose reply was lost gets that grant back. Each attempt is
// bounded by the lease's validity (TTL - safety margin) as well as by ctx:
// a grant whose reply came later
// would be given back, so a request the store holds longer (etcd answers
// a proposal lost with its leader after its 5 s request timeout) is
// abandoned: the store is told to end that owner (Backend.Abandon, so
// that the request, if it arrives later, grants nothing), and the next
// attempt goes out under a new owner. When ctx ends with a request in
// flight, that request is abandoned the same way before Acquire returns,
// given as long as that request had (at least 50 ms, at most
// Options.ReleaseTimeout). PollInterval bounds the time between attempts,
// a Watch that the store does not confirm included. With Options.FIFO, an
// Acquire that ends without the lease gives up its place in line before it
// returns (Backend.Abandon; the abandonment of a request in flight, once
// the store confirms it, does that too): after ctx has ended it waits up
// to ReleaseTimeout for the store, as a Release called with an ended
// context does, or, when the abandonment of a request in flight went
// unanswered, up to PollInterval more.
//
// A store error that retrying cannot fix (one matching ErrSetup: missing
// tables, refused credentials) ends Acquire at once with that error, which
// names the fix.
//
// When ctx ends first, the error wraps ErrNotAcquired, the last store error
// seen (if any: a store that cannot be reached is named even when the last
// attempt only saw the context end) and ctx.Err(), in one line, so
// errors.Is matches all of them. ctx bounds the wait, not the lease. Names are checked first
// (ErrInvalidName, no I/O).
func (m *Manager) Acquire(ctx context.Context, name string) (_ *Lease, err error) {
	if err := ValidateName(name); err != nil {
		return nil, err
	}
	start := time.Now()
	req := m.waiterRequest(name)
	// How far the Abandon of a request cut short by ctx got (abandonAfter):
	// 0 none sent, 1 confirmed, -1 sent and not confirmed.
	abandoned := 0
	defer func() { m.leaveLine(ctx, req, err, abandoned) }() // FIFO
	var (
		signals  <-chan struct{}
		timer    *time.Timer
		storeErr error // the last error that was not a refusal or the context's
		refused  error // the last refusal (ErrNotAcquired)
	)
	defer func() {
		if timer != nil {
			timer.Stop()
		}
	}()
	for attempt := 1; ; attempt++ {
		began := time.Now()
		var watched time.Duration // spent this round in a Watch that failed
		l, err := m.boundedAttempt(ctx, req, start, attempt)
		if err == nil {
			return l, nil
		}
		if ctx.Err() != nil {
			if outcomeUnknown(err) {
				// This Abandon also gives up req's place in line.
				var done bool
				if err, done = m.abandonAfter(ctx, req, time.Since(began), err); done {
					abandoned = 1
				} else {
					abandoned = -1
				}
			}
			return nil, m.giveUp(ctx, name, err, refused, storeErr)
		}
		if errors.Is(err, ErrSetup) {
			// Retrying cannot fix it: say so now, not at ctx's end. (The
			// backend's error names the operation, the lease and the fix.)
			return nil, err
		}
		switch {
		case errors.Is(err, errAttemptAbandoned):
			// The request may still reach the store and grant the name
			// to this owner after nobody waits for it any more: end that
			// owner at the store, and go on as a new one.
			if aerr := m.e.abandon(ctx, req, m.o.TTL-m.o.SafetyMargin); aerr != nil {
				m.o.Logger.Warn("lease: could not abandon an unanswered acquire attempt; a grant it made expires after its TTL", "name", name, "owner", req.Owner, "err", aerr)
			}
			req = m.waiterRequest(name)
		case errors.Is(err, errGivenBack):
			// The store ended this owner with the give-back: it would
			// refuse it from now on.
			req = m.waiterRequest(name)
		}
		if errors.Is(err, ErrNotAcquired) {
			refused = err
		} else {
			storeErr = err
			m.o.Logger.Warn("lease: acquire attempt failed, will retry", "name", name, "attempt", attempt, "err", err)
		}
		if signals == nil && m.e.w != nil {
			// Subscribe before the next attempt so that a release between
			// that attempt and the wait is not missed. If subscribing
			// fails, or the store does not confirm the subscription
			// within PollInterval, poll this round and try again next
			// round: PollInterval is the longest wait between attempts,
			// whatever the Watch does.
			watchStart := time.Now()
			wctx, wcancel := context.WithTimeout(ctx, m.o.PollInterval)
			sig, stop, werr := m.e.watch(wctx, name)
			wcancel()
			if werr == nil {
				signals = sig
				defer stop()
				continue
			}
			if ctx.Err() != nil {
				return nil, m.giveUp(ctx, name, err, refused, storeErr)
			}
			m.o.Logger.Warn("lease: cannot watch for releases, polling", "name", name, "err", werr)
			watched = time.Since(watchStart)
		}
		// The time a failed Watch took counts towards this round's wait.
		wait := m.pollWait(err) - watched
		if wait <= 0 {
			continue
		}
		if timer == nil {
			timer = time.NewTimer(wait)
		} else {
			timer.Reset(wait)
		}
		select {
		case <-signals:
		case <-timer.C:
		case <-ctx.Done():
			return nil, m.giveUp(ctx, name, err, refused, storeErr)
		}
	}
}

// outcomeUnknown reports whether an attempt that failed with err may still
// have been granted at the store: its request was cut short by a context
// while in flight. A refusal, or an error the store answered, is not.
func outcomeUnknown(err error) bool {
	return !errors.Is(err, ErrNotAcquired) && !errors.Is(err, ErrInvalidName) &&
		(errors.Is(err, context.DeadlineExceeded) || errors.Is(err, context.Canceled) || errors.Is(err, errAttemptAbandoned))
}

// abandonAfter abandons req after its attempt, which had taken spent when
// the caller's context ended, failed with err: the Abandon gets no more
// time than the attempt had (so that a caller with a short context is not
// held for ReleaseTimeout by a store that does not answer), and its
// failure is added to err. done says whether the store confirmed it.
func (m *Manager) abandonAfter(ctx context.Context, req driver.Request, spent time.Duration, err error) (_ error, done bool) {
	aerr := m.e.abandon(ctx, req, spent)
	if aerr == nil {
		return err, true
	}
	m.o.Logger.Warn("lease: could not abandon an unanswered acquire attempt; a grant it made expires after its TTL", "name", req.Name, "owner", req.Owner, "err", aerr)
	return fmt.Errorf("%w (and the store could not be told to abandon it, so a grant it made expires after its TTL: %w)", err, aerr), false
}

// giveUp is Acquire's error when ctx ended: ErrNotAcquired with the last
// attempt's error, the last store error if that was another one, and
// ctx.Err(). When the last attempt was cut short by ctx (no answer) after
// the store had refused an earlier one (refused, nil if none), the refusal
// leads, so that the error still names the holder, and the cut attempt
// follows it.
func (m *Manager) giveUp(ctx context.Context, name string, last, refused, storeErr error) error {
	var cut error
	if refused != nil && !errors.Is(last, ErrNotAcquired) {
		last, cut = refused, last
	}
	last = m.nameHolder(context.WithoutCancel(ctx), last)
	// One line, every cause matchable with errors.Is.
	format, args := "%w", []any{last}
	if !errors.Is(last, ErrNotAcquired) {
		format, args = "%w: %q: last attempt: %w", []any{ErrNotAcquired, name, last}
	}
	if cut != nil {
		format, args = format+"; the attempt in flight when the wait ended: %w", append(args, cut)
	}
	if storeErr != nil && storeErr != last && storeErr != cut {
		format, args = format+"; last store error: %w", append(args, storeErr)
	}
	return fmt.Errorf(format+"; %w", append(args, ctx.Err())...)
}

// holderLookupTimeout bounds the read that names the holder in a refusal.
const holderLookupTimeout = 500 * time.Millisecond

// nameHolder fills in the Holder of a *NotAcquiredError in err that lacks
// one, when the backend can say who holds the lease (Inspector): one read,
// bounded by ctx and by holderLookupTimeout. Acquire calls it once, when it
// gives up; TryAcquire does not (its refusal costs one request, as the
// backend's own, and names the holder when the backend's refusal does). A
// failed read leaves err as it was.
func (m *Manager) nameHolder(ctx context.Context, err error) error {
	var na *NotAcquiredError
	in := m.e.inspector()
	if in == nil || !errors.As(err, &na) || na.Holder.Owner != "" {
		return err
	}
	hctx, cancel := context.WithTimeout(ctx, holderLookupTimeout)
	defer cancel()
	if h, herr := in.Holder(hctx, na.Name); herr == nil {
		na.Holder = h
	}
	return err
}

// pollWait is how long a blocked Acquire sleeps without a signal. When the
// store said when the holder's grant runs out and that is within
// PollInterval, it sleeps until just after then (plus up to 5 ms of jitter),
// so that an expired lease is taken over at once. Otherwise it sleeps a
// jittered time between half and all of PollInterval, so that waiters spread
// out.
func (m *Manager) pollWait(err error) time.Duration {
	var na *NotAcquiredError
	if errors.As(err, &na) && na.RetryAfter > 0 && na.RetryAfter <= m.o.PollInterval {
		return na.RetryAfter + time.Millisecond + mrand.N(5*time.Millisecond)
	}
	d := m.o.PollInterval
	half := d / 2
	return half + mrand.N(d-half+1)
}

func (m *Manager) request(name string) driver.Request {
	var r [16]byte
	_, _ = rand.Read(r[:]) // crypto/rand.Read never fails (Go 1.24+)
	var owner strings.Builder
	owner.Grow(len(m.o.Identity) + 1 + hex.EncodedLen(len(r)))
	owner.WriteString(m.o.Identity)
	owner.WriteByte('/')
	var h [32]byte
	hex.Encode(h[:], r[:])
	owner.Write(h[:])
	return driver.Request{Name: name, Owner: owner.String(), TTL: m.o.TTL}
}

// boundedAttempt is one attempt of a blocking Acquire, cut short once the
// lease's validity (TTL - safety margin) has passed since it began: a grant
// whose reply came later would be given back anyway, and a request stuck at
// the store (an etcd proposal forwarded to a leader that has just died is
// answered only after etcd's request timeout, 5 s) is better abandoned and
// sent again, with the same owner, so that a grant it made is found.
func (m *Manager) boundedAttempt(ctx context.Context, req driver.Request, start time.Time, n int) (*Lease, error) {
	validity := m.o.TTL - m.o.SafetyMargin
	if dl, ok := ctx.Deadline(); ok && time.Until(dl) <= validity {
		return m.e.attempt(ctx, ctx, req, start, n)
	}
	actx, cancel := context.WithTimeout(ctx, validity)
	defer cancel()
	l, err := m.e.attempt(ctx, actx, req, start, n)
	if err != nil && ctx.Err() == nil && actx.Err() != nil {
		err = fmt.Errorf("lease: acquire %q: no reply within the lease's validity %v (TTL - safety margin), when a grant could no longer be used; %w, its owner given up at the store: %w", req.Name, validity, errAttemptAbandoned, err)
	}
	return l, err
}

func defaultIdentity() string {
	host, err := os.Hostname()
	if err != nil || host == "" {
		host = "host"
	}
	host = strings.Map(func(r rune) rune {
		if !unicode.IsPrint(r) || unicode.IsSpace(r) {
			return '_'
		}
		return r
	}, host)
	if len(host) > 64 {
		host = host[:64]
	}
	return fmt.Sprintf("%s/pid-%d", host, os.Getpid())
}

// The Manager's side of FIFO hand-off (Options.FIFO, the package doc's
// "Waiting in line"): a blocked Acquire sends its attempts with
// Request.Queue set, so that the store keeps its place in line, and tells
// the store when it gives up (Backend.Abandon), so that the waiter behind
// it is next at once. The line itself, its order and the hand-off are the
// backend's (driver package doc, "Waiters in line").

// waiterRequest is request for a blocked Acquire: with FIFO, each attempt
// also keeps the owner's place in line.
func (m *Manager) waiterRequest(name string) driver.Request {
	req := m.request(name)
	req.Queue = m.o.FIFO
	return req
}

// leaveLine gives up req.Owner's place in line when a FIFO Acquire ends
// with err: Abandon removes the place, so that the waiter behind is next
// at once instead of after the place lapses (one TTL after the waiter last
// asked). It runs even when ctx is done, and is bounded by ReleaseTimeout
// (never by more than the TTL): a store slow to answer for a moment must
// not hold the waiters behind for a TTL. abandoned says what became of the
// Abandon of a request cut short by ctx (Acquire): confirmed (1), that
// Abandon gave up the place already; sent but not confirmed (-1), the
// store did not answer in the time that request had, and this one tries
// again for at most PollInterval, so that a caller with a short context is
// not held for ReleaseTimeout by a store that does not answer. A failure
// is logged, and the place then lapses by itself. A store not set up for
// leases (ErrSetup) holds no place.
func (m *Manager) leaveLine(ctx context.Context, req driver.Request, err error, abandoned int) {
	if err == nil || !req.Queue || abandoned == 1 || errors.Is(err, ErrSetup) || errors.Is(err, ErrInvalidName) {
		return
	}
	budget := m.o.TTL
	if abandoned == -1 {
		budget = m.o.PollInterval
	}
	if aerr := m.e.abandon(ctx, req, budget); aerr != nil {
		m.o.Logger.Warn("lease: could not leave the line of waiters; the place lapses after its TTL", "name", req.Name, "owner", req.Owner, "err", aerr)
	}
}
