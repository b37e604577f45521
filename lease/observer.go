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

// JobObserver is an Observer that also hears when this process starts
// and ends a job under a lease: Manager.Run, TryRun and RunOnce (under the
// lease name they are given), Semaphore.Run (under the semaphore's name)
// and each term of an Election (under the election's name). A Manager
// whose Observer implements it reports every job: JobStarted once the
// job's lease is granted, before the job's function runs (for a term,
// just after Elected); JobEnded the moment that lease's validity ends,
// exactly once per job: on the goroutine that ends it (a Release once the
// function returned, the Manager's timer at the local deadline, a renewal
// that found another owner), before the lease's context is cancelled and
// before the request that frees it at the store is sent (for a term, just
// before Deposed). RunOnce reports a job also when the ledger finds the
// run done: the lease is held while it asks.
//
// Between the two, this process holds the job's lease. A function that
// ignores its context may run on after JobEnded; only its fenced writes
// stay safe then. While the store keeps its contract and every process
// runs on time, at most one process is between JobStarted and JobEnded
// for a lease name at any instant (for a semaphore, at most its permits).
// A process paused when its lease ends reports JobEnded only when it runs
// again, possibly after another process started the job. So a gauge of
// the jobs between the two (package leaseprom exports
// fencekit_job_running), summed across processes, can be above 1 for a
// moment at a hand-off and for as long as a paused holder has not caught
// up, as ElectionObserver says of the leader gauge. Alert when the sum
// stays above 1 for longer than a scrape interval or two.
type JobObserver interface {
	Observer
	JobStarted(JobEvent)
	JobEnded(JobEvent)
}

// JobEvent describes the start or the end of one job under a lease.
type JobEvent struct {
	// Ctx is the context Run, TryRun, RunOnce, Semaphore.Run or
	// Election.Run was called with, for both events (its values; it may
	// be done by then).
	Ctx context.Context
	// Name is the job's lease name as the call was given it: the lease
	// name of Run, TryRun and RunOnce, the semaphore's name (not its
	// slot's), the election's name.
	Name string
	// Token is the fencing token of the job's lease (a semaphore's
	// permit's).
	Token fence.Token
	// Err, for JobEnded, is why the job's lease ended: ErrReleased after
	// the job's function returned (or Resign), a *LostError when it was
	// lost. Nil for JobStarted.
	Err error
}

// Observers fans lease events out to several observers, in order (for
// example Prometheus metrics and OpenTelemetry traces at once). It is an
// ElectionObserver and a JobObserver: election and job events go to
// those of its observers that hear them.
type Observers []Observer

var _ JobObserver = Observers(nil)

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

// JobStarted passes e to each observer that is a JobObserver.
func (os Observers) JobStarted(e JobEvent) {
	for _, o := range os {
		if jo, ok := o.(JobObserver); ok {
			jo.JobStarted(e)
		}
	}
}

// JobEnded passes e to each observer that is a JobObserver.
func (os Observers) JobEnded(e JobEvent) {
	for _, o := range os {
		if jo, ok := o.(JobObserver); ok {
			jo.JobEnded(e)
		}
	}
}
