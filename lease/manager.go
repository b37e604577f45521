package lease

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	mrand "math/rand/v2"
	"os"
	"strings"
	"time"
	"unicode"

	"github.com/fencekit/fencekit/fence"
)

// Manager acquires leases from one Backend with one set of Options. It is
// safe for concurrent use; one Manager can hold any number of leases.
type Manager struct {
	b       Backend
	w       Watcher   // nil when b cannot signal releases
	batcher *batcher  // nil unless b implements BatchRenewer and batching is on
	epoch   time.Time // origin of the heartbeat grid (see renewDelay)
	o       Options
}

// NewManager returns a Manager over b. opts is copied, then each optFn is
// applied to the copy, then defaults fill the zero fields (see Options), and
// the result is validated. Every problem is reported at once, in an error
// matching ErrInvalidOptions; no I/O happens.
func NewManager(b Backend, opts Options, optFns ...func(*Options)) (*Manager, error) {
	for _, fn := range optFns {
		fn(&opts)
	}
	if opts.Identity == "" {
		opts.Identity = defaultIdentity()
	}
	opts = opts.withDefaults()
	if err := opts.validate(b); err != nil {
		return nil, err
	}
	m := &Manager{b: b, o: opts, epoch: time.Now()}
	m.w, _ = b.(Watcher)
	if br, ok := b.(BatchRenewer); ok && opts.RenewBatchWindow > 0 && !opts.DisableAutoRenew {
		m.batcher = &batcher{m: m, br: br, window: opts.RenewBatchWindow}
	}
	return m, nil
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
// ctx bounds the attempt only. The lease's own Context is not derived from
// ctx's cancellation; it keeps ctx's values.
func (m *Manager) TryAcquire(ctx context.Context, name string) (*Lease, error) {
	if err := ValidateName(name); err != nil {
		return nil, err
	}
	start := time.Now()
	return m.attempt(ctx, m.record(name), start, 1)
}

// Acquire acquires the lease name, waiting while another holder has it until
// it is released or expires, or until ctx ends. A waiter is woken as soon as
// the holder releases when the backend implements Watcher (Redis: pub/sub),
// and otherwise polls with jitter (Options.PollInterval). Transient store
// errors are retried the same way. All attempts of one call use the same
// owner, so a retry of an attempt whose reply was lost gets that grant back.
//
// When ctx ends first, the error joins ErrNotAcquired (with the last store
// error, if any) and ctx.Err(), so errors.Is matches both. ctx bounds the
// wait, not the lease. Names are checked first (ErrInvalidName, no I/O).
func (m *Manager) Acquire(ctx context.Context, name string) (*Lease, error) {
	if err := ValidateName(name); err != nil {
		return nil, err
	}
	start := time.Now()
	rec := m.record(name)
	var (
		signals <-chan struct{}
		timer   *time.Timer
	)
	defer func() {
		if timer != nil {
			timer.Stop()
		}
	}()
	for attempt := 1; ; attempt++ {
		l, err := m.attempt(ctx, rec, start, attempt)
		if err == nil {
			return l, nil
		}
		if errors.Is(err, ErrInvalidName) || ctx.Err() != nil {
			return nil, m.giveUp(ctx, name, err)
		}
		if !errors.Is(err, ErrNotAcquired) {
			m.o.Logger.Warn("lease: acquire attempt failed, will retry", "name", name, "attempt", attempt, "err", err)
		}
		if signals == nil && m.w != nil {
			// Subscribe before the next attempt so that a release between
			// that attempt and the wait is not missed. If subscribing
			// fails, poll this round and try again next round.
			sig, stop, werr := m.w.Watch(ctx, name)
			if werr == nil {
				signals = sig
				defer stop()
				continue
			}
			if ctx.Err() != nil {
				return nil, m.giveUp(ctx, name, err)
			}
			m.o.Logger.Warn("lease: cannot watch for releases, polling", "name", name, "err", werr)
		}
		wait := m.pollWait(err)
		if timer == nil {
			timer = time.NewTimer(wait)
		} else {
			timer.Reset(wait)
		}
		select {
		case <-signals:
		case <-timer.C:
		case <-ctx.Done():
			return nil, m.giveUp(ctx, name, err)
		}
	}
}

func (m *Manager) giveUp(ctx context.Context, name string, last error) error {
	if ctx.Err() == nil {
		return last
	}
	if !errors.Is(last, ErrNotAcquired) {
		last = fmt.Errorf("%w: %q: last attempt: %w", ErrNotAcquired, name, last)
	}
	return errors.Join(last, ctx.Err())
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

func (m *Manager) record(name string) Record {
	var b [16]byte
	_, _ = rand.Read(b[:]) // crypto/rand.Read never fails (Go 1.24+)
	return Record{Name: name, Owner: m.o.Identity + "/" + hex.EncodeToString(b[:]), TTL: m.o.TTL}
}

// attempt sends one acquire request and turns a grant into a Lease.
func (m *Manager) attempt(ctx context.Context, rec Record, start time.Time, n int) (*Lease, error) {
	sent := time.Now()
	tok, err := m.b.Acquire(ctx, rec)
	if err != nil {
		return nil, err
	}
	rec.Token = tok
	deadline := sent.Add(m.o.TTL - m.o.SafetyMargin)
	if tok == fence.None {
		m.releaseQuietly(ctx, rec)
		return nil, fmt.Errorf("lease: acquire %q: the backend granted token 0, which is never valid; lease given back", rec.Name)
	}
	if now := time.Now(); !now.Before(deadline) {
		// The reply took longer than the lease is valid: the store may
		// already have let it expire. Never hand out such a grant.
		m.releaseQuietly(ctx, rec)
		return nil, fmt.Errorf("%w: %q: the grant arrived %v after its request was sent, past its local deadline (TTL %v - safety margin %v); given back",
			ErrNotAcquired, rec.Name, now.Sub(sent), m.o.TTL, m.o.SafetyMargin)
	}
	l := newLease(m, ctx, rec, sent, deadline)
	m.o.Observer.Acquired(AcquiredEvent{Name: rec.Name, Token: tok, Wait: time.Since(start), Attempts: n})
	if m.o.Logger.Enabled(ctx, slog.LevelDebug) { // spare the hot path the arguments' allocations
		m.o.Logger.Debug("lease: acquired", "name", rec.Name, "token", uint64(tok), "owner", rec.Owner, "attempts", n)
	}
	return l, nil
}

// releaseContext bounds a release: the caller's context while it is live,
// else a detached one; never longer than ReleaseTimeout.
func (m *Manager) releaseContext(ctx context.Context) (context.Context, context.CancelFunc) {
	if ctx.Err() != nil {
		ctx = context.WithoutCancel(ctx)
	}
	return context.WithTimeout(ctx, m.o.ReleaseTimeout)
}

// releaseQuietly gives a grant back, best effort, within ReleaseTimeout.
func (m *Manager) releaseQuietly(ctx context.Context, rec Record) {
	rctx, cancel := m.releaseContext(ctx)
	defer cancel()
	if err := m.b.Release(rctx, rec); err != nil && !errors.Is(err, ErrNotHeld) {
		m.o.Logger.Warn("lease: could not give back a grant; it expires after its TTL", "name", rec.Name, "token", uint64(rec.Token), "err", err)
	}
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
