package lease

import (
	"context"
	"errors"
	"fmt"
	mrand "math/rand/v2"
	"reflect"
	"strconv"
	"time"

	"github.com/fencekit/fencekit/lease/driver"
)

// MaxPermits is the most permits a Semaphore can have. A TryAcquire on a
// full semaphore asks every slot in turn (one request each), and a blocked
// Acquire watches every slot, so the cost of a full semaphore grows with
// its permits: beyond a few hundred, partition the work instead.
const MaxPermits = 256

// SlotName returns the lease name of slot i of the semaphore name:
// name + "#permit/" + i in decimal (for example "crawlers#permit/0").
// Plain lease names cannot take this form (ValidateName refuses it), so a
// slot never collides with a lease of the Manager's own, and the form is
// unambiguous, so two semaphores never share a slot.
func SlotName(name string, i int) string {
	return name + permitMarker + strconv.Itoa(i)
}

// Semaphore lets at most a fixed number of holders (its permits) hold it at
// once, across processes: "at most N workers at once". Each permit is a
// lease of its own, so each carries its own fencing token.
//
// # Design: a semaphore of N permits is N slots
//
// Slot i is an ordinary lease named SlotName(name, i). Acquire grants one
// free slot; the permit it returns is that slot's *Lease, with everything a
// lease has: a Context cancelled when the permit is lost or released,
// heartbeats, a local deadline, Release, and a Token minted by the store
// atomically with the grant. Because each slot is a lease name, each slot's
// tokens grow strictly, on every backend, with every invariant of a lease
// (docs/design.md, invariants 1 to 4: exclusive, tokens only grow even after data loss, loss noticed
// before expiry, safe release, no ghost grants), and with no change to the
// backend contract: every backend and every guard works with semaphores as
// they are. A holder that crashed frees its slot after one TTL, as a lease
// does. The price: a full semaphore costs one request per slot to find so.
//
// # What fencing means for a permit
//
// Tokens of different slots are separate sequences: token 7 of slot 0 and
// token 3 of slot 1 say nothing about each other. So a fenced resource must
// belong to one slot: key it by the permit's Lease.Name() (the slot name),
// for example a row or object per slot that the permit's holder writes.
// Then a permit holder that was paused past its deadline has its write
// rejected (fence.ErrStaleToken) once the slot's next holder has written,
// while the other permits' writes go on untouched. Never fence a resource
// that several permits write (the whole semaphore's output, or a work item
// that any permit may pick up) with permit tokens: a valid holder of slot
// 1 would be refused after slot 0's larger token, and a stale holder of
// slot 0 would be let through. A work item that any permit may process
// needs a lease of its own (Manager.Acquire on the item's name), whose
// token then fences the item.
//
// A Semaphore is safe for concurrent use. Its permits are not FIFO: a
// released slot goes to whichever waiter asks first.
type Semaphore struct {
	m     *Manager
	name  string
	slots []string
}

// NewSemaphore returns a semaphore of the given number of permits, named
// name, whose permits m grants (with m's TTL and Options). Processes that
// share a semaphore must use the same name and number of permits: a
// process that counts fewer permits uses fewer slots, one that counts more
// lets more holders in.
//
// It returns an error matching ErrInvalidName when name is not a valid
// lease name (ValidateName) or when a slot name would be longer than
// driver.MaxNameLen, and one matching ErrInvalidOptions when m is nil or
// permits is less than 1 or more than MaxPermits. It does no I/O.
func NewSemaphore(m *Manager, name string, permits int) (*Semaphore, error) {
	var errs []error
	if m == nil {
		errs = append(errs, fmt.Errorf("%w: NewSemaphore: the Manager is nil", ErrInvalidOptions))
	}
	if permits < 1 || permits > MaxPermits {
		errs = append(errs, fmt.Errorf("%w: NewSemaphore: %d permits, it must be 1 to %d", ErrInvalidOptions, permits, MaxPermits))
	}
	if err := ValidateName(name); err != nil {
		errs = append(errs, fmt.Errorf("semaphore: %w", err))
	} else if permits >= 1 && permits <= MaxPermits {
		if last := SlotName(name, permits-1); len(last) > driver.MaxNameLen {
			errs = append(errs, fmt.Errorf("%w: semaphore name is %d bytes: the name of its slot %d would be %d bytes, the limit is %d",
				ErrInvalidName, len(name), permits-1, len(last), driver.MaxNameLen))
		}
	}
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	s := &Semaphore{m: m, name: name, slots: make([]string, permits)}
	for i := range s.slots {
		s.slots[i] = SlotName(name, i)
	}
	return s, nil
}

// Name returns the semaphore's name.
func (s *Semaphore) Name() string { return s.name }

// Permits returns how many holders the semaphore admits at once.
func (s *Semaphore) Permits() int { return len(s.slots) }

// Slots returns the lease names of the semaphore's slots, in slot order:
// SlotName(Name(), i) for each i. A permit's Lease.Name() is one of them.
func (s *Semaphore) Slots() []string { return append([]string(nil), s.slots...) }

// TryAcquire makes one attempt at each slot, in a random order (so that
// holders spread over the slots), and returns the first permit granted. When
// every slot is held, the error matches ErrNotAcquired and, through
// errors.As, carries the *NotAcquiredError of the slot the store expects to
// free first (its RetryAfter, where the backend knows it). When the store
// failed for some slot and no slot was granted, it returns the store's last
// error (not ErrNotAcquired: that slot may have been free). An error
// matching ErrSetup is returned at once.
//
// ctx bounds the attempts, as for Manager.TryAcquire: a request in flight
// when ctx ends is abandoned at the store before TryAcquire returns. A slot
// whose request failed with an unknown outcome while another slot was
// granted is abandoned as well, so that it does not stay taken by a grant
// nobody holds.
func (s *Semaphore) TryAcquire(ctx context.Context) (*Lease, error) {
	m := s.m
	start := time.Now()
	var (
		refusal, storeErr error
		unknown           []driver.Request // failed with the store's error: a grant may have been made
	)
	for _, i := range mrand.Perm(len(s.slots)) {
		req := m.request(s.slots[i])
		began := time.Now()
		l, err := m.e.attempt(ctx, ctx, req, start, 1)
		if err == nil {
			s.abandonEach(ctx, unknown)
			return l, nil
		}
		if ctx.Err() != nil {
			if outcomeUnknown(err) {
				err, _ = m.abandonAfter(ctx, req, time.Since(began), err)
			}
			s.abandonEach(ctx, unknown)
			return nil, fmt.Errorf("lease: semaphore %q: %w", s.name, err)
		}
		switch {
		case errors.Is(err, ErrSetup):
			s.abandonEach(ctx, unknown)
			return nil, err
		case errors.Is(err, ErrNotAcquired):
			refusal = sooner(refusal, err)
		default:
			storeErr = err
			if !errors.Is(err, errGivenBack) {
				unknown = append(unknown, req)
			}
		}
	}
	if storeErr != nil {
		return nil, fmt.Errorf("lease: semaphore %q: no permit granted, and the store failed: %w", s.name, storeErr)
	}
	return nil, fmt.Errorf("lease: semaphore %q: all %d permits are held: %w", s.name, len(s.slots), refusal)
}

// Acquire returns a permit, waiting while every slot is held until one is
// released or expires, or until ctx ends. Each round tries every slot once,
// in a new random order, as TryAcquire does; between rounds it waits as
// Manager.Acquire does: woken at once when any slot is released where the
// backend implements Watcher (a waiter watches every slot), and otherwise
// polling with jitter within Options.PollInterval, or just after the
// soonest slot's holder expires when the store says when. Each slot's
// attempts keep one owner until one is abandoned, so a retry of an attempt
// whose reply was lost gets that grant back; an attempt that outlived the
// lease's validity is abandoned at the store, and when Acquire returns
// (with a permit or not) every slot whose last attempt had an unknown
// outcome is abandoned too, so no slot is left taken by a grant nobody
// holds.
//
// A store error that retrying cannot fix (ErrSetup) ends Acquire at once.
// When ctx ends first, the error wraps ErrNotAcquired, the last store error
// seen (if any) and ctx.Err(), as Manager.Acquire's does. ctx bounds the
// wait, not the permit.
func (s *Semaphore) Acquire(ctx context.Context) (*Lease, error) {
	m := s.m
	n := len(s.slots)
	start := time.Now()
	reqs := make([]driver.Request, n)
	unknown := make([]bool, n)
	ws := &slotWatches{signals: make([]<-chan struct{}, n), stops: make([]func(), n)}
	defer ws.stop()
	var (
		timer    *time.Timer
		storeErr error
	)
	defer func() {
		if timer != nil {
			timer.Stop()
		}
	}()
	// pending are the requests of slots whose last attempt failed with an
	// unknown outcome; they are abandoned before Acquire returns.
	pending := func() []driver.Request {
		var rs []driver.Request
		for i, u := range unknown {
			if u {
				rs = append(rs, reqs[i])
			}
		}
		return rs
	}
	for attempt := 1; ; attempt++ {
		var refusal, last error
		for _, i := range mrand.Perm(n) {
			if reqs[i].Owner == "" {
				reqs[i] = m.request(s.slots[i])
			}
			began := time.Now()
			l, err := m.boundedAttempt(ctx, reqs[i], start, attempt)
			unknown[i] = false
			if err == nil {
				s.abandonEach(ctx, pending())
				return l, nil
			}
			last = err
			if ctx.Err() != nil {
				if outcomeUnknown(err) {
					err, _ = m.abandonAfter(ctx, reqs[i], time.Since(began), err)
				}
				s.abandonEach(ctx, pending())
				return nil, m.giveUp(ctx, s.name, err, nil, storeErr)
			}
			if errors.Is(err, ErrSetup) {
				s.abandonEach(ctx, pending())
				return nil, err
			}
			switch {
			case errors.Is(err, errAttemptAbandoned):
				if aerr := m.e.abandon(ctx, reqs[i], m.o.TTL-m.o.SafetyMargin); aerr != nil {
					m.o.Logger.Warn("lease: could not abandon an unanswered acquire attempt; a grant it made expires after its TTL", "name", reqs[i].Name, "owner", reqs[i].Owner, "err", aerr)
				}
				reqs[i] = m.request(s.slots[i])
			case errors.Is(err, errGivenBack):
				reqs[i] = m.request(s.slots[i])
			case !errors.Is(err, ErrNotAcquired):
				unknown[i] = true // the next round retries it with the same owner
			}
			if errors.Is(err, ErrNotAcquired) {
				refusal = sooner(refusal, err)
				continue
			}
			storeErr = err
			m.o.Logger.Warn("lease: acquire attempt failed, will retry", "name", reqs[i].Name, "semaphore", s.name, "attempt", attempt, "err", err)
		}
		if refusal == nil {
			refusal = last
		}
		// Subscribe to the slots not yet watched before the next round, so
		// that a release between that round and the wait is not missed;
		// a slot whose Watch fails is polled, and watched again next round.
		watchStart := time.Now()
		if m.e.w != nil && ws.subscribe(ctx, m, s.slots) {
			continue
		}
		if ctx.Err() != nil {
			s.abandonEach(ctx, pending())
			return nil, m.giveUp(ctx, s.name, last, nil, storeErr)
		}
		wait := m.pollWait(refusal) - time.Since(watchStart)
		if wait <= 0 {
			continue
		}
		if timer == nil {
			timer = time.NewTimer(wait)
		} else {
			timer.Reset(wait)
		}
		if !ws.wait(ctx, timer.C) {
			s.abandonEach(ctx, pending())
			return nil, m.giveUp(ctx, s.name, last, nil, storeErr)
		}
	}
}

// Run acquires a permit (waiting as Acquire does), runs fn under it and
// releases it, as Manager.Run does for a lease: fn's context ends when the
// permit is lost or released or ctx ends, and l.Name() is the slot whose
// resources fn may fence with l.Token(). Its errors are Manager.Run's.
func (s *Semaphore) Run(ctx context.Context, fn func(ctx context.Context, l *Lease) error) error {
	if fn == nil {
		return errNilRunFunc
	}
	l, err := s.Acquire(ctx)
	if err != nil {
		return err
	}
	return s.m.runJob(ctx, l, s.name, fn)
}

// abandonEach abandons each request (Backend.Abandon), each given as long as
// an abandoned attempt of Acquire is, and logs those the store could not
// take: a grant they made then expires after its TTL.
func (s *Semaphore) abandonEach(ctx context.Context, reqs []driver.Request) {
	m := s.m
	for _, req := range reqs {
		if err := m.e.abandon(ctx, req, m.o.TTL-m.o.SafetyMargin); err != nil {
			m.o.Logger.Warn("lease: could not abandon an acquire attempt of unknown outcome; a grant it made expires after its TTL", "name", req.Name, "owner", req.Owner, "err", err)
		}
	}
}

// sooner returns whichever refusal the store expects to end first: the one
// with the smaller known RetryAfter, else the first.
func sooner(a, b error) error {
	if a == nil {
		return b
	}
	var na, nb *NotAcquiredError
	if !errors.As(b, &nb) || nb.RetryAfter <= 0 {
		return a
	}
	if !errors.As(a, &na) || na.RetryAfter <= 0 || nb.RetryAfter < na.RetryAfter {
		return b
	}
	return a
}

// slotWatches are a blocked semaphore Acquire's subscriptions to its slots'
// releases.
type slotWatches struct {
	signals []<-chan struct{} // nil for a slot not (yet) watched
	stops   []func()
	failed  bool // a Watch failed this round; it was logged
}

// subscribe watches every slot not yet watched, all within PollInterval,
// and reports whether a new subscription became active (the caller then
// tries again at once, so that a release just before it is not missed).
func (ws *slotWatches) subscribe(ctx context.Context, m *Manager, slots []string) bool {
	wctx, cancel := context.WithTimeout(ctx, m.o.PollInterval)
	defer cancel()
	added := false
	for i, name := range slots {
		if ws.signals[i] != nil {
			continue
		}
		sig, stop, err := m.e.watch(wctx, name)
		if err != nil {
			if ctx.Err() != nil || wctx.Err() != nil {
				break
			}
			if !ws.failed {
				ws.failed = true
				m.o.Logger.Warn("lease: cannot watch for releases, polling", "name", name, "err", err)
			}
			continue
		}
		ws.signals[i], ws.stops[i] = sig, stop
		added = true
	}
	return added
}

// wait blocks until a slot signals a release, timer fires or ctx ends; it
// reports false when ctx ended.
func (ws *slotWatches) wait(ctx context.Context, timer <-chan time.Time) bool {
	cases := make([]reflect.SelectCase, 0, 2+len(ws.signals))
	cases = append(cases,
		reflect.SelectCase{Dir: reflect.SelectRecv, Chan: reflect.ValueOf(ctx.Done())},
		reflect.SelectCase{Dir: reflect.SelectRecv, Chan: reflect.ValueOf(timer)})
	for _, sig := range ws.signals {
		if sig != nil {
			cases = append(cases, reflect.SelectCase{Dir: reflect.SelectRecv, Chan: reflect.ValueOf(sig)})
		}
	}
	chosen, _, _ := reflect.Select(cases)
	return chosen != 0
}

// stop ends every subscription.
func (ws *slotWatches) stop() {
	for _, stop := range ws.stops {
		if stop != nil {
			stop()
		}
	}
}
