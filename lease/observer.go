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

// Observers fans lease events out to several observers, in order (for
// example Prometheus metrics and OpenTelemetry traces at once). It is an
// ElectionObserver: election events go to those of its observers that are
// ElectionObservers.
type Observers []Observer

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
