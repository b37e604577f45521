package lease

import (
	"context"
	"time"

	"github.com/fencekit/fencekit/fence"
)

// Observer receives lease events, for metrics and tracing. Its methods are
// called synchronously from the goroutine that caused the event, so they
// must be quick and must not call back into the lease. Embed NopObserver to
// implement only some of them. Package leaseprom adapts an Observer to
// Prometheus.
type Observer interface {
	// Acquired is called after a lease is granted; Wait is the time from
	// the start of the Acquire or TryAcquire call.
	Acquired(AcquiredEvent)
	// Renewed is called after every renew request, successful or not.
	Renewed(RenewedEvent)
	// Lost is called once when a lease is lost.
	Lost(LostEvent)
	// Released is called once when a lease is released by its holder.
	Released(ReleasedEvent)
}

// The Ctx field of every event is the context the event happened in, so
// that a tracer can find the caller's span in it: for Acquired the
// context Acquire or TryAcquire was called with; for Released the one
// Release was called with; for Renewed and Lost, which happen on the
// Manager's own goroutine, the context the lease was acquired with (its
// values; it may be done by then). Never nil.

// AcquiredEvent describes a grant.
type AcquiredEvent struct {
	Ctx   context.Context
	Name  string
	Token fence.Token
	// Wait is how long the caller waited for the grant.
	Wait time.Duration
	// Attempts is the number of acquire requests sent.
	Attempts int
}

// RenewedEvent describes one renew request.
type RenewedEvent struct {
	Ctx   context.Context
	Name  string
	Token fence.Token
	// Sent is when the request was sent (with a monotonic reading).
	Sent time.Time
	// Latency is the time from sending the request to its outcome.
	Latency time.Duration
	// Err is nil when the renewal succeeded.
	Err error
}

// LostEvent describes a lost lease.
type LostEvent struct {
	Ctx    context.Context
	Name   string
	Token  fence.Token
	Reason LostReason
	// Held is how long the lease was held, from its grant.
	Held time.Duration
	Err  error
}

// ReleasedEvent describes a release by the holder.
type ReleasedEvent struct {
	Ctx   context.Context
	Name  string
	Token fence.Token
	Held  time.Duration
	// Sent is when Release began (with a monotonic reading); Latency is
	// the time from then to the store's answer, waiting for renewals in
	// flight included.
	Sent    time.Time
	Latency time.Duration
	// Err is nil when the store confirmed the release.
	Err error
}

// NopObserver ignores every event. Embed it in an Observer that handles only
// some events.
type NopObserver struct{}

func (NopObserver) Acquired(AcquiredEvent) {}
func (NopObserver) Renewed(RenewedEvent)   {}
func (NopObserver) Lost(LostEvent)         {}
func (NopObserver) Released(ReleasedEvent) {}

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

// Observers fans lease events out to several observers, in order (for
// example Prometheus metrics and OpenTelemetry traces at once). It is an
// ElectionObserver: election events go to those of its observers that are
// ElectionObservers.
type Observers []Observer

var _ ElectionObserver = Observers(nil)

// Acquired passes e to each observer.
func (os Observers) Acquired(e AcquiredEvent) {
	for _, o := range os {
		o.Acquired(e)
	}
}

// Renewed passes e to each observer.
func (os Observers) Renewed(e RenewedEvent) {
	for _, o := range os {
		o.Renewed(e)
	}
}

// Lost passes e to each observer.
func (os Observers) Lost(e LostEvent) {
	for _, o := range os {
		o.Lost(e)
	}
}

// Released passes e to each observer.
func (os Observers) Released(e ReleasedEvent) {
	for _, o := range os {
		o.Released(e)
	}
}

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
