// Package leaseprom exposes lease, election and guarded-write events as
// Prometheus metrics (client_golang). One Observer serves as the Manager's
// lease.Observer (lease.WithObserver) and as every guard's
// fence.WriteObserver (sqlguard, dbguard, blobguard and dynamoguard's
// WithObserver option, sqlguard.Table and dbguard.Table's WithObserver
// method, the Observer field of fencehttp.Transport and Handler and of
// fencegrpc.Client and Server).
//
// Lease metrics, all without a lease-name label so that holding many leases
// does not explode cardinality:
//
//	fencekit_lease_held                           gauge: leases granted to this process and not yet released or lost
//	fencekit_lease_acquired_total                 counter
//	fencekit_lease_acquire_wait_seconds           histogram: from the start of Acquire to the grant
//	fencekit_lease_renew_duration_seconds{result} histogram: one renew request; result is "ok" or "error"
//	fencekit_lease_lost_total{reason}             counter: reason is "expired" or "taken over"
//	fencekit_lease_released_total{result}         counter: result is "ok" or "error"
//	fencekit_lease_held_seconds                   histogram: how long leases were held, until lost or released
//
// Election and job metrics, labelled by lease name, of which a process has
// few:
//
//	fencekit_election_leader{election}            gauge: 1 while this process leads the election, else 0
//	fencekit_job_running{lease}                   gauge: jobs this process runs under the lease
//
// fencekit_job_running counts the jobs of lease.JobObserver (Manager.Run,
// TryRun and RunOnce, Semaphore.Run under the semaphore's name, an
// election's terms), each from the grant of its lease until that lease
// ends (released once the job returned, or lost): 0 or 1 per process for a
// lease name, up to its permits for a semaphore. Its cardinality is
// bounded: a series for each of the first MaxJobLeases lease names this
// process ran a job under; the jobs of any later name are counted together
// in the series lease="" (no lease name is empty). Run jobs under names
// written in the program ("settle-orders"), not a name per item.
//
// Guarded-write metrics, labelled by guard ("sqlguard", "dbguard",
// "blobguard", "dynamoguard", "fencehttp", "fencegrpc"), resource class (a
// table, a bucket, "transaction", a host, a gRPC service: never a row or
// object key; see fence.WriteEvent) and outcome ("accepted", "stale",
// "unknown", "failed"; see fence.Outcome):
//
//	fencekit_guard_writes_total{guard,class,outcome}         counter
//	fencekit_guard_write_duration_seconds{guard,outcome}     histogram: one guarded write, retries included
//
// Alert on fencekit_lease_lost_total: every loss means a holder's work was
// cut short (or, without fencing, might have overlapped with another's). Alert
// when sum(fencekit_election_leader) by (election) or
// sum(fencekit_job_running{lease!=""}) by (lease) across processes stays
// above 1 for longer than a scrape interval or two: two processes believe they
// lead, or run the job (gauges are scraped at different moments, so a hand-off
// can show 2 for one scrape without anything being wrong; fenced writes stay
// safe either way). Alert on any increase of
// fencekit_guard_writes_total{outcome="stale"} (a stale holder tried to
// write: fencing saved the data, but a holder was paused past its lease) and
// of outcome="unknown" (writes the caller must read back to settle).
package leaseprom

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/fencekit/fencekit/fence"
	"github.com/fencekit/fencekit/internal/jobnames"
	"github.com/fencekit/fencekit/lease"
)

// MaxJobLeases is how many lease names get a series of their own in
// fencekit_job_running; the jobs of later names are counted in the series
// lease="".
const MaxJobLeases = jobnames.Max

// Observer is a lease.ElectionObserver, a lease.JobObserver and a
// fence.WriteObserver that records Prometheus metrics.
type Observer struct {
	held     prometheus.Gauge
	leader   *prometheus.GaugeVec
	jobs     *prometheus.GaugeVec
	jobNames jobnames.Names
	writes   *prometheus.CounterVec
	writeDur *prometheus.HistogramVec
	acquired prometheus.Counter
	wait     prometheus.Histogram
	renew    *prometheus.HistogramVec
	lost     *prometheus.CounterVec
	released *prometheus.CounterVec
	heldFor  prometheus.Histogram
}

var (
	_ lease.ElectionObserver = (*Observer)(nil)
	_ lease.JobObserver      = (*Observer)(nil)
	_ fence.WriteObserver    = (*Observer)(nil)
)

// New returns an Observer whose metrics are registered with reg (use
// prometheus.DefaultRegisterer for the default registry). It returns the
// registry's error if a metric of the same name is already registered.
func New(reg prometheus.Registerer) (*Observer, error) {
	o := &Observer{
		held: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "fencekit_lease_held",
			Help: "Leases granted to this process and not yet released or lost.",
		}),
		leader: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "fencekit_election_leader",
			Help: "1 while this process leads the election, else 0.",
		}, []string{"election"}),
		jobs: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "fencekit_job_running",
			Help: "Jobs this process runs under the lease (Run, RunOnce, an election's term), from the lease's grant to its end.",
		}, []string{"lease"}),
		writes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "fencekit_guard_writes_total",
			Help: "Guarded writes, by guard, resource class and outcome (accepted, stale, unknown, failed).",
		}, []string{"guard", "class", "outcome"}),
		writeDur: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "fencekit_guard_write_duration_seconds",
			Help:    "Time of one guarded write, retries included, in seconds.",
			Buckets: prometheus.ExponentialBuckets(0.0001, 3, 12), // 0.1 ms to about 18 s
		}, []string{"guard", "outcome"}),
		acquired: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "fencekit_lease_acquired_total",
			Help: "Leases granted to this process.",
		}),
		wait: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "fencekit_lease_acquire_wait_seconds",
			Help:    "Time from the start of an acquire call to the grant, in seconds.",
			Buckets: prometheus.ExponentialBuckets(0.0005, 4, 10), // 0.5 ms to about 2 min
		}),
		renew: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "fencekit_lease_renew_duration_seconds",
			Help:    "Latency of one renew request, in seconds.",
			Buckets: prometheus.ExponentialBuckets(0.0001, 3, 12), // 0.1 ms to about 18 s
		}, []string{"result"}),
		lost: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "fencekit_lease_lost_total",
			Help: "Leases lost before being released, by reason.",
		}, []string{"reason"}),
		released: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "fencekit_lease_released_total",
			Help: "Leases released by their holder, by whether the store confirmed it.",
		}, []string{"result"}),
		heldFor: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "fencekit_lease_held_seconds",
			Help:    "How long leases were held before being lost or released, in seconds.",
			Buckets: prometheus.ExponentialBuckets(0.01, 4, 10), // 10 ms to about 7 h
		}),
	}
	for _, c := range []prometheus.Collector{o.held, o.leader, o.jobs, o.writes, o.writeDur, o.acquired, o.wait, o.renew, o.lost, o.released, o.heldFor} {
		if err := reg.Register(c); err != nil {
			return nil, err
		}
	}
	// Expose the zero series, so that alerts on rates work from the start.
	o.renew.WithLabelValues("ok")
	o.renew.WithLabelValues("error")
	o.lost.WithLabelValues(string(lease.LostExpired))
	o.lost.WithLabelValues(string(lease.LostTakenOver))
	o.released.WithLabelValues("ok")
	o.released.WithLabelValues("error")
	return o, nil
}

func result(err error) string {
	if err != nil {
		return "error"
	}
	return "ok"
}

// Acquired implements lease.Observer.
func (o *Observer) Acquired(e lease.AcquiredEvent) {
	o.held.Inc()
	o.acquired.Inc()
	o.wait.Observe(e.Wait.Seconds())
}

// Renewed implements lease.Observer.
func (o *Observer) Renewed(e lease.RenewedEvent) {
	o.renew.WithLabelValues(result(e.Err)).Observe(e.Latency.Seconds())
}

// Lost implements lease.Observer.
func (o *Observer) Lost(e lease.LostEvent) {
	o.held.Dec()
	o.lost.WithLabelValues(string(e.Reason)).Inc()
	o.heldFor.Observe(e.Held.Seconds())
}

// Released implements lease.Observer.
func (o *Observer) Released(e lease.ReleasedEvent) {
	o.held.Dec()
	o.released.WithLabelValues(result(e.Err)).Inc()
	o.heldFor.Observe(e.Held.Seconds())
}

// Elected implements lease.ElectionObserver.
func (o *Observer) Elected(e lease.ElectionEvent) { o.leader.WithLabelValues(e.Election).Set(1) }

// Deposed implements lease.ElectionObserver.
func (o *Observer) Deposed(e lease.ElectionEvent) { o.leader.WithLabelValues(e.Election).Set(0) }

// JobStarted implements lease.JobObserver.
func (o *Observer) JobStarted(e lease.JobEvent) {
	o.jobs.WithLabelValues(o.jobNames.Label(e.Name)).Inc()
}

// JobEnded implements lease.JobObserver.
func (o *Observer) JobEnded(e lease.JobEvent) { o.jobs.WithLabelValues(o.jobNames.Label(e.Name)).Dec() }

// Written implements fence.WriteObserver.
func (o *Observer) Written(e fence.WriteEvent) {
	o.writes.WithLabelValues(e.Guard, e.Class, string(e.Outcome)).Inc()
	o.writeDur.WithLabelValues(e.Guard, string(e.Outcome)).Observe(e.Duration.Seconds())
}
