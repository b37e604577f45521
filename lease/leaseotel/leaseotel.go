// Package leaseotel records lease, election and guarded-write events as
// OpenTelemetry spans and metrics. One Observer serves as the Manager's
// lease.Observer (lease.WithObserver) and as every guard's
// fence.WriteObserver (sqlguard, dbguard, blobguard and dynamoguard's
// WithObserver option, sqlguard.Table and dbguard.Table's WithObserver
// method, the Observer field of fencehttp.Transport and Handler and of
// fencegrpc.Client and Server); to
// export Prometheus metrics as well, pass both observers (see
// lease.Observers and fence.WriteObservers).
//
// It is a module of its own, so that the core and the store modules never
// require OpenTelemetry.
//
// # Spans
//
// Each span is made after the fact from the event, with the event's start
// and end times, as a child of the span found in the event's context (the
// caller's context: see lease.Observer):
//
//	fencekit.lease.acquire   from the start of Acquire or TryAcquire to the grant
//	fencekit.lease.renew     one renew request; status Error when it failed
//	fencekit.lease.release   Release, from its start to the store's answer; status Error when unconfirmed
//	fencekit.lease.lost      an instant span when a lease is lost; status Error
//	fencekit.guard.write     one guarded write, retries included; status Error unless accepted
//
// Attributes: fencekit.lease.name, fencekit.token (the fencing token, as a
// decimal string: tokens are unsigned 64-bit numbers, and an OpenTelemetry
// integer is signed), fencekit.lease.attempts, fencekit.lease.lost_reason,
// fencekit.guard, fencekit.guard.class, fencekit.guard.op,
// fencekit.guard.resource and fencekit.guard.outcome.
//
// # Metrics
//
// The instruments mirror package leaseprom's; only the election and job
// instruments have a lease-name attribute (cardinality); durations are in
// seconds:
//
//	fencekit.lease.held                 up-down counter: leases granted and not yet released or lost
//	fencekit.lease.acquired             counter
//	fencekit.lease.acquire.wait         histogram (s)
//	fencekit.lease.renew.duration       histogram (s), attribute result = ok | error
//	fencekit.lease.lost                 counter, attribute reason
//	fencekit.lease.released             counter, attribute result
//	fencekit.election.leader            gauge, attribute election: 1 while this process leads, else 0
//	fencekit.job.running                up-down counter, attribute lease: jobs this process runs under the lease
//	fencekit.guard.writes               counter, attributes guard, class, outcome
//	fencekit.guard.write.duration       histogram (s), attributes guard, outcome
//
// fencekit.job.running counts the jobs of lease.JobObserver (Manager.Run,
// TryRun and RunOnce, Semaphore.Run under the semaphore's name, an
// election's terms), each from the grant of its lease until that lease
// ends: 0 or 1 per process for a lease name, up to its permits for a
// semaphore. Its cardinality is bounded as leaseprom's fencekit_job_running
// is: an attribute value for each of the first MaxJobLeases lease names,
// and lease="" for the jobs of every later name (no lease name is empty).
package leaseotel

import (
	"context"
	"errors"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/trace"

	"github.com/fencekit/fencekit/fence"
	"github.com/fencekit/fencekit/internal/jobnames"
	"github.com/fencekit/fencekit/lease"
)

// MaxJobLeases is how many lease names get an attribute value of their
// own in fencekit.job.running; the jobs of later names are counted under
// lease="".
const MaxJobLeases = jobnames.Max

// ScopeName is the instrumentation scope of the tracer and the meter.
const ScopeName = "github.com/fencekit/fencekit/lease/leaseotel"

// Attribute keys.
const (
	KeyLeaseName  = attribute.Key("fencekit.lease.name")
	KeyToken      = attribute.Key("fencekit.token")
	KeyAttempts   = attribute.Key("fencekit.lease.attempts")
	KeyLostReason = attribute.Key("fencekit.lease.lost_reason")
	KeyGuard      = attribute.Key("fencekit.guard")
	KeyClass      = attribute.Key("fencekit.guard.class")
	KeyOp         = attribute.Key("fencekit.guard.op")
	KeyResource   = attribute.Key("fencekit.guard.resource")
	KeyOutcome    = attribute.Key("fencekit.guard.outcome")
)

// Observer is a lease.ElectionObserver, a lease.JobObserver and a
// fence.WriteObserver that records OpenTelemetry spans and metrics. It is
// safe for concurrent use.
type Observer struct {
	tracer trace.Tracer

	held      metric.Int64UpDownCounter
	acquired  metric.Int64Counter
	wait      metric.Float64Histogram
	renew     metric.Float64Histogram
	lost      metric.Int64Counter
	released  metric.Int64Counter
	leader    metric.Int64Gauge
	jobs      metric.Int64UpDownCounter
	jobNames  jobnames.Names
	writes    metric.Int64Counter
	writeTime metric.Float64Histogram
}

var (
	_ lease.ElectionObserver = (*Observer)(nil)
	_ lease.JobObserver      = (*Observer)(nil)
	_ fence.WriteObserver    = (*Observer)(nil)
)

// New returns an Observer that makes spans with tp's tracer and records
// metrics with mp's meter (pass otel.GetTracerProvider() and
// otel.GetMeterProvider() for the global ones). It returns an error
// wrapping ErrNilProvider when either is nil, and the meter's error if an
// instrument cannot be made.
func New(tp trace.TracerProvider, mp metric.MeterProvider) (*Observer, error) {
	if tp == nil || mp == nil {
		return nil, ErrNilProvider
	}
	m := mp.Meter(ScopeName)
	o := &Observer{tracer: tp.Tracer(ScopeName)}
	var errs []error
	add := func(err error) { errs = append(errs, err) }
	var err error
	o.held, err = m.Int64UpDownCounter("fencekit.lease.held", metric.WithDescription("Leases granted to this process and not yet released or lost."))
	add(err)
	o.acquired, err = m.Int64Counter("fencekit.lease.acquired", metric.WithDescription("Leases granted to this process."))
	add(err)
	o.wait, err = m.Float64Histogram("fencekit.lease.acquire.wait", metric.WithUnit("s"), metric.WithDescription("Time from the start of an acquire call to the grant."))
	add(err)
	o.renew, err = m.Float64Histogram("fencekit.lease.renew.duration", metric.WithUnit("s"), metric.WithDescription("Latency of one renew request."))
	add(err)
	o.lost, err = m.Int64Counter("fencekit.lease.lost", metric.WithDescription("Leases lost before being released, by reason."))
	add(err)
	o.released, err = m.Int64Counter("fencekit.lease.released", metric.WithDescription("Leases released by their holder, by whether the store confirmed it."))
	add(err)
	o.leader, err = m.Int64Gauge("fencekit.election.leader", metric.WithDescription("1 while this process leads the election, else 0."))
	add(err)
	o.jobs, err = m.Int64UpDownCounter("fencekit.job.running", metric.WithDescription("Jobs this process runs under the lease (Run, RunOnce, an election's term), from the lease's grant to its end."))
	add(err)
	o.writes, err = m.Int64Counter("fencekit.guard.writes", metric.WithDescription("Guarded writes, by guard, resource class and outcome (accepted, stale, unknown, failed)."))
	add(err)
	o.writeTime, err = m.Float64Histogram("fencekit.guard.write.duration", metric.WithUnit("s"), metric.WithDescription("Time of one guarded write, retries included."))
	add(err)
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	return o, nil
}

// ErrNilProvider is returned by New when a provider is nil.
var ErrNilProvider = errors.New("leaseotel: nil tracer or meter provider")

func token(t fence.Token) attribute.KeyValue { return KeyToken.String(t.String()) }

func result(err error) attribute.KeyValue {
	if err != nil {
		return attribute.String("result", "error")
	}
	return attribute.String("result", "ok")
}

// span records a finished span from start to end under ctx's span.
func (o *Observer) span(ctx context.Context, name string, start, end time.Time, err error, attrs ...attribute.KeyValue) {
	_, sp := o.tracer.Start(ctx, name, trace.WithTimestamp(start), trace.WithAttributes(attrs...))
	if err != nil {
		sp.RecordError(err)
		sp.SetStatus(codes.Error, err.Error())
	}
	sp.End(trace.WithTimestamp(end))
}

// Acquired implements lease.Observer.
func (o *Observer) Acquired(e lease.AcquiredEvent) {
	end := time.Now()
	o.span(e.Ctx, "fencekit.lease.acquire", end.Add(-e.Wait), end, nil,
		KeyLeaseName.String(e.Name), token(e.Token), KeyAttempts.Int(e.Attempts))
	o.held.Add(e.Ctx, 1)
	o.acquired.Add(e.Ctx, 1)
	o.wait.Record(e.Ctx, e.Wait.Seconds())
}

// Renewed implements lease.Observer.
func (o *Observer) Renewed(e lease.RenewedEvent) {
	o.span(e.Ctx, "fencekit.lease.renew", e.Sent, e.Sent.Add(e.Latency), e.Err,
		KeyLeaseName.String(e.Name), token(e.Token))
	o.renew.Record(e.Ctx, e.Latency.Seconds(), metric.WithAttributes(result(e.Err)))
}

// Lost implements lease.Observer.
func (o *Observer) Lost(e lease.LostEvent) {
	now := time.Now()
	err := e.Err
	if err == nil {
		err = lease.ErrLost
	}
	o.span(e.Ctx, "fencekit.lease.lost", now, now, err,
		KeyLeaseName.String(e.Name), token(e.Token), KeyLostReason.String(string(e.Reason)))
	o.held.Add(e.Ctx, -1)
	o.lost.Add(e.Ctx, 1, metric.WithAttributes(attribute.String("reason", string(e.Reason))))
}

// Released implements lease.Observer.
func (o *Observer) Released(e lease.ReleasedEvent) {
	o.span(e.Ctx, "fencekit.lease.release", e.Sent, e.Sent.Add(e.Latency), e.Err,
		KeyLeaseName.String(e.Name), token(e.Token))
	o.held.Add(e.Ctx, -1)
	o.released.Add(e.Ctx, 1, metric.WithAttributes(result(e.Err)))
}

// Elected implements lease.ElectionObserver.
func (o *Observer) Elected(e lease.ElectionEvent) {
	o.leader.Record(e.Ctx, 1, metric.WithAttributes(attribute.String("election", e.Election)))
}

// Deposed implements lease.ElectionObserver.
func (o *Observer) Deposed(e lease.ElectionEvent) {
	o.leader.Record(e.Ctx, 0, metric.WithAttributes(attribute.String("election", e.Election)))
}

// JobStarted implements lease.JobObserver.
func (o *Observer) JobStarted(e lease.JobEvent) {
	o.jobs.Add(e.Ctx, 1, metric.WithAttributes(attribute.String("lease", o.jobNames.Label(e.Name))))
}

// JobEnded implements lease.JobObserver.
func (o *Observer) JobEnded(e lease.JobEvent) {
	o.jobs.Add(e.Ctx, -1, metric.WithAttributes(attribute.String("lease", o.jobNames.Label(e.Name))))
}

// Written implements fence.WriteObserver.
func (o *Observer) Written(e fence.WriteEvent) {
	var err error
	if e.Outcome != fence.Accepted {
		err = e.Err
	}
	o.span(e.Ctx, "fencekit.guard.write", e.Start, e.Start.Add(e.Duration), err,
		KeyGuard.String(e.Guard), KeyClass.String(e.Class), KeyOp.String(e.Op),
		KeyResource.String(e.Resource), token(e.Token), KeyOutcome.String(string(e.Outcome)))
	o.writes.Add(e.Ctx, 1, metric.WithAttributes(attribute.String("guard", e.Guard), attribute.String("class", e.Class), attribute.String("outcome", string(e.Outcome))))
	o.writeTime.Record(e.Ctx, e.Duration.Seconds(), metric.WithAttributes(attribute.String("guard", e.Guard), attribute.String("outcome", string(e.Outcome))))
}
