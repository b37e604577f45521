package lease

import (
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"time"
	"unicode"

	"github.com/fencekit/fencekit/lease/driver"
)

// Options configures a Manager. NewManager starts from the zero value with
// TTL set to its ttl argument, applies each Option, and fills every other
// zero field with its documented default. It never changes values the
// caller holds.
type Options struct {
	// TTL is how long the store keeps a grant after each acquire or renew:
	// NewManager's ttl argument. It must be within the backend's Limits
	// (Backend.Limits): at least MinTTL, at most MaxTTL where set, and a
	// whole multiple of Resolution.
	TTL time.Duration

	// RenewInterval is the time between automatic renewals. Default
	// (TTL - SafetyMargin)/3. It must leave room for at least two renew
	// attempts before the local deadline: RenewInterval <= (TTL -
	// SafetyMargin)/2, and be at least 1 ms.
	RenewInterval time.Duration

	// DisableAutoRenew turns the background heartbeat off; the holder then
	// calls Lease.Renew itself. The local deadline is enforced either way.
	DisableAutoRenew bool

	// SafetyMargin is subtracted from the TTL when computing a lease's
	// local deadline, to allow for clock drift between the store and this
	// process. Default TTL/100 + 2 ms (the Redlock drift allowance), or
	// TTL/10 for TTLs too short for that. Must be less than TTL. Set
	// NoSafetyMargin for none.
	SafetyMargin time.Duration

	// RenewBatchWindow is how far ahead of its time a heartbeat may be
	// sent to share a round trip with others, when the backend implements
	// BatchRenewer: the heartbeats due within this window are sent
	// together, in one batch (a renewal sent early counts from its own
	// send time, so nothing is lost). Default min(RenewInterval/20,
	// 100 ms). NoBatching turns batching off. It must be less than
	// RenewInterval/4.
	RenewBatchWindow time.Duration

	// RenewRetryInterval is the pause between retries of a renewal that
	// failed with a transient error. Renewal retries until the local
	// deadline. Default RenewInterval/4, at most 1 s; at least 1 ms.
	RenewRetryInterval time.Duration

	// PollInterval is the longest a blocked Acquire waits between attempts
	// when no release signal arrives (the fallback for leases that expire
	// rather than being released, and for backends without Watcher). When
	// the store reports that the holder's grant runs out within
	// PollInterval, the waiter tries again just after that; otherwise each
	// wait is jittered between half and all of PollInterval. Default: TTL/2,
	// at most 1 s; at least 1 ms.
	PollInterval time.Duration

	// FIFO makes blocked Acquire calls wait in line at the store and be
	// granted the lease in the order they arrived, instead of by
	// whichever retries first after a release (see "Waiting in line" in
	// the package doc). The backend must keep a line
	// (driver.Limits.Queues: memlease, redislease, pglease, etcdlease,
	// zklease; not dynamolease);
	// NewManager refuses FIFO otherwise, with an error matching both
	// ErrInvalidOptions and errors.ErrUnsupported. With FIFO,
	// PollInterval must be at most TTL/2 (the default is), because a
	// waiter keeps its place by asking again within its TTL. TryAcquire
	// and Semaphore do not wait in line (a semaphore's slots are leases of
	// their own). Default off: any waiter may win each release.
	FIFO bool

	// ReleaseTimeout bounds every Release (including its wait for a renew
	// request, or a give-back, already in flight), the give-back of a
	// grant that arrived too late, and a FIFO waiter's leaving the line
	// when its context ends. Default 5 s; at least 10 ms.
	ReleaseTimeout time.Duration

	// Identity prefixes every owner this Manager creates, to tell holders
	// apart in the store and in logs (for example "billing-7f9c/pid-42").
	// At most 128 bytes, printable, no spaces. A random suffix keeps each
	// owner unique. Default: "host/pid-N".
	Identity string

	// Observer receives events for metrics. Default: none.
	Observer Observer

	// Logger receives warnings (a failed acquire attempt that will be
	// retried, a lost lease, a grant that could not be given back) and
	// debug logs of grants and renewals. Default: slog.Default(), the
	// program's own logger, as for every fencekit package (slog.New(
	// slog.DiscardHandler) silences it).
	Logger *slog.Logger
}

// Option sets fields of Options. An Option may be any func(*Options), so a
// caller can set several fields at once:
//
//	lease.NewManager(b, 10*time.Second, func(o *lease.Options) {
//		o.Identity = "billing"
//		o.PollInterval = 200 * time.Millisecond
//	})
type Option func(*Options)

// NoBatching, as Options.RenewBatchWindow, sends every heartbeat on its own.
const NoBatching time.Duration = -1

// NoSafetyMargin, as Options.SafetyMargin, selects a margin of zero.
const NoSafetyMargin time.Duration = -1

// WithRenewInterval sets Options.RenewInterval.
func WithRenewInterval(d time.Duration) Option { return func(o *Options) { o.RenewInterval = d } }

// WithoutAutoRenew sets Options.DisableAutoRenew.
func WithoutAutoRenew() Option { return func(o *Options) { o.DisableAutoRenew = true } }

// WithSafetyMargin sets Options.SafetyMargin.
func WithSafetyMargin(d time.Duration) Option { return func(o *Options) { o.SafetyMargin = d } }

// WithRenewBatchWindow sets Options.RenewBatchWindow.
func WithRenewBatchWindow(d time.Duration) Option {
	return func(o *Options) { o.RenewBatchWindow = d }
}

// WithRenewRetryInterval sets Options.RenewRetryInterval.
func WithRenewRetryInterval(d time.Duration) Option {
	return func(o *Options) { o.RenewRetryInterval = d }
}

// WithPollInterval sets Options.PollInterval.
func WithPollInterval(d time.Duration) Option { return func(o *Options) { o.PollInterval = d } }

// WithFIFO sets Options.FIFO: blocked acquires are granted in arrival order.
func WithFIFO() Option { return func(o *Options) { o.FIFO = true } }

// WithReleaseTimeout sets Options.ReleaseTimeout.
func WithReleaseTimeout(d time.Duration) Option { return func(o *Options) { o.ReleaseTimeout = d } }

// WithIdentity sets Options.Identity.
func WithIdentity(id string) Option { return func(o *Options) { o.Identity = id } }

// WithObserver sets Options.Observer.
func WithObserver(obs Observer) Option { return func(o *Options) { o.Observer = obs } }

// WithLogger sets Options.Logger.
func WithLogger(l *slog.Logger) Option { return func(o *Options) { o.Logger = l } }

// withDefaults fills zero fields. Fields that are invalid are left for
// validate to report.
func (o Options) withDefaults() Options {
	if o.TTL <= 0 {
		return o
	}
	switch {
	case o.SafetyMargin == 0:
		o.SafetyMargin = o.TTL/100 + 2*time.Millisecond
		if o.SafetyMargin >= o.TTL/2 {
			// Very short TTLs: keep the margin proportionate.
			o.SafetyMargin = o.TTL / 10
		}
	case o.SafetyMargin == NoSafetyMargin:
		o.SafetyMargin = 0
	}
	if o.RenewInterval == 0 && o.SafetyMargin >= 0 && o.SafetyMargin < o.TTL {
		o.RenewInterval = (o.TTL - o.SafetyMargin) / 3
	}
	switch {
	case o.RenewBatchWindow == 0 && o.RenewInterval > 0:
		o.RenewBatchWindow = min(o.RenewInterval/20, 100*time.Millisecond)
	case o.RenewBatchWindow == NoBatching:
		o.RenewBatchWindow = 0
	}
	if o.RenewRetryInterval == 0 && o.RenewInterval > 0 {
		o.RenewRetryInterval = max(min(o.RenewInterval/4, time.Second), time.Millisecond)
	}
	if o.PollInterval == 0 {
		o.PollInterval = min(o.TTL/2, time.Second)
	}
	if o.ReleaseTimeout == 0 {
		o.ReleaseTimeout = 5 * time.Second
	}
	if o.Observer == nil {
		o.Observer = NopObserver{}
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	return o
}

// validate reports every problem at once, joined, each matching
// ErrInvalidOptions.
//
// given are the options as the caller set them, before defaults: a value
// the caller did not set but derived from a TTL too short to use is
// reported once, as a problem of the TTL, with the shortest TTL that works,
// rather than as a problem of fields the caller never set.
func (o Options) validate(given Options, b Backend, lim driver.Limits) error {
	var errs []error
	bad := func(format string, args ...any) {
		errs = append(errs, fmt.Errorf("%w: "+format, append([]any{ErrInvalidOptions}, args...)...))
	}
	if b == nil {
		bad("backend is nil")
	}
	res := lim.Resolution
	if res <= 0 {
		res = time.Millisecond
	}
	minTTL := max(lim.MinTTL, res)
	ttlBad := true
	switch {
	case o.TTL <= 0:
		bad("TTL is %v, it must be positive", o.TTL)
	case o.TTL%res != 0:
		bad("TTL is %v, it must be a whole multiple of %v (the backend's resolution)", o.TTL, res)
	case o.TTL < minTTL:
		bad("TTL is %v, too short for the backend: the minimum is %v", o.TTL, minTTL)
	case lim.MaxTTL > 0 && o.TTL > lim.MaxTTL:
		bad("TTL is %v, too long for the backend: the maximum is %v", o.TTL, lim.MaxTTL)
	default:
		ttlBad = false
	}
	if o.TTL <= 0 {
		// Nothing else can be related to a missing TTL.
		return errors.Join(errs...)
	}
	if o.SafetyMargin < 0 {
		bad("safety margin is %v, it must not be negative (use NoSafetyMargin for none)", o.SafetyMargin)
	} else if o.SafetyMargin >= o.TTL {
		bad("safety margin %v must be less than the TTL %v", o.SafetyMargin, o.TTL)
	}
	validity := o.TTL - max(o.SafetyMargin, 0)
	renewShort := given.RenewInterval == 0 && o.RenewInterval < time.Millisecond
	pollShort := given.PollInterval == 0 && o.PollInterval < time.Millisecond
	derivedShort := !ttlBad && (renewShort || pollShort)
	if derivedShort {
		var implied []string
		if renewShort {
			implied = append(implied, fmt.Sprintf("renew every (TTL - safety margin)/3 = %v", o.RenewInterval))
		}
		if pollShort {
			implied = append(implied, fmt.Sprintf("poll every TTL/2 = %v", o.PollInterval))
		}
		bad("TTL %v is too short: the default intervals it implies (%s) must be at least 1ms; use a TTL of at least %v, or set the intervals",
			o.TTL, strings.Join(implied, ", "), shortestUsableTTL(given, lim))
	}
	switch {
	case derivedShort && renewShort:
	case o.RenewInterval < time.Millisecond:
		bad("renew interval is %v, it must be at least 1ms", o.RenewInterval)
	case o.SafetyMargin >= 0 && o.SafetyMargin < o.TTL && o.RenewInterval > validity/2:
		bad("renew interval %v cannot keep the lease alive: at least two renewals must fit before the local deadline, so it must be at most (TTL - safety margin)/2 = %v", o.RenewInterval, validity/2)
	}
	if o.RenewBatchWindow < 0 {
		bad("renew batch window is %v, it must not be negative (use NoBatching to turn batching off)", o.RenewBatchWindow)
	} else if o.RenewInterval > 0 && o.RenewBatchWindow >= o.RenewInterval/4 {
		bad("renew batch window %v must be less than a quarter of the renew interval %v", o.RenewBatchWindow, o.RenewInterval)
	}
	if o.RenewRetryInterval < time.Millisecond && !(derivedShort && given.RenewRetryInterval == 0) {
		bad("renew retry interval is %v, it must be at least 1ms", o.RenewRetryInterval)
	}
	if o.PollInterval < time.Millisecond && !(derivedShort && pollShort) {
		bad("poll interval is %v, it must be at least 1ms", o.PollInterval)
	}
	errs = append(errs, o.validateFIFO(b, lim)...)
	if o.ReleaseTimeout < 10*time.Millisecond {
		bad("release timeout is %v, it must be at least 10ms", o.ReleaseTimeout)
	}
	if len(o.Identity) > 128 {
		bad("identity is %d bytes, the limit is 128", len(o.Identity))
	}
	for _, r := range o.Identity {
		if !unicode.IsPrint(r) || unicode.IsSpace(r) {
			bad("identity %q contains %U: only printable characters without spaces are allowed", o.Identity, r)
			break
		}
	}
	return errors.Join(errs...)
}

// shortestUsableTTL is the shortest TTL, in the backend's resolution, from
// which on every TTL's default intervals are at least 1 millisecond, with the
// caller's other options. (The default safety margin changes form at about
// 4 ms, so the property is not monotonic below that: the answer is one
// past the last TTL that fails.)
func shortestUsableTTL(given Options, lim driver.Limits) time.Duration {
	res := lim.Resolution
	if res <= 0 {
		res = time.Millisecond
	}
	from := max(lim.MinTTL, res)
	shortest := from
	for ttl := from; ttl <= 100*time.Millisecond; ttl += res {
		g := given
		g.TTL = ttl
		o := g.withDefaults()
		if (given.RenewInterval == 0 && o.RenewInterval < time.Millisecond) || (given.PollInterval == 0 && o.PollInterval < time.Millisecond) {
			shortest = ttl + res
		}
	}
	return shortest
}

// validateFIFO reports why Options.FIFO cannot be served, each problem
// matching ErrInvalidOptions.
func (o Options) validateFIFO(b Backend, lim driver.Limits) []error {
	if !o.FIFO || b == nil {
		return nil
	}
	var errs []error
	if !lim.Queues {
		errs = append(errs, fmt.Errorf("%w: FIFO needs a backend that keeps waiters in line at the store (driver.Limits.Queues), and %T does not: %w",
			ErrInvalidOptions, b, errors.ErrUnsupported))
	}
	if o.TTL > 0 && o.PollInterval > o.TTL/2 {
		errs = append(errs, fmt.Errorf("%w: poll interval %v is too long for FIFO: a waiter keeps its place in line by asking again within its TTL, so it must be at most TTL/2 = %v",
			ErrInvalidOptions, o.PollInterval, o.TTL/2))
	}
	return errs
}
