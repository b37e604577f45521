package fence

import (
	"context"
	"errors"
	"time"
)

// Outcome classifies the result of one guarded write, for metrics and
// traces. Its values are fixed label values: "accepted", "stale",
// "unknown" and "failed".
type Outcome string

const (
	// Accepted: the store applied the write.
	Accepted Outcome = "accepted"
	// Rejected: the store refused the write because its token was stale
	// (the error matches ErrStaleToken). Nothing changed.
	Rejected Outcome = "stale"
	// Unknown: the write was sent but its outcome could not be learned
	// (the error matches ErrOutcomeUnknown). Alert on these: each one is a
	// write the caller must read back to settle.
	Unknown Outcome = "unknown"
	// Failed: any other error (bad input, a missing row or object, a store
	// error before or instead of the write). Nothing changed.
	Failed Outcome = "failed"
)

// OutcomeOf classifies err as a guard returns it: nil is Accepted; an
// error matching ErrOutcomeUnknown is Unknown (checked first: a guard that
// could not learn the outcome never reports a clean rejection); one
// matching ErrStaleToken is Rejected; anything else is Failed.
func OutcomeOf(err error) Outcome {
	switch {
	case err == nil:
		return Accepted
	case errors.Is(err, ErrOutcomeUnknown):
		return Unknown
	case errors.Is(err, ErrStaleToken):
		return Rejected
	default:
		return Failed
	}
}

// WriteEvent describes one guarded write, after its outcome is known.
type WriteEvent struct {
	// Ctx is the context the write was called with: a tracer finds the
	// caller's span in it. Never nil.
	Ctx context.Context
	// Guard names the guard: "sqlguard", "dbguard", "blobguard",
	// "dynamoguard", "fencehttp" or "fencegrpc".
	Guard string
	// Class is the kind of resource written, chosen by the guard to keep
	// metric cardinality bounded: a table (sqlguard, dbguard,
	// dynamoguard), a bucket (blobguard), "transaction" for fenced
	// transactions, the host a call goes to or arrives at (fencehttp), the
	// gRPC service (fencegrpc). Never a row key, an object key or a path.
	Class string
	// Op is the operation: "update", "insert", "upsert", "delete", "put",
	// "put-if", "transaction", "advance" (the SQL and AWS guards), "call"
	// (a client's call that carried a token: fencehttp.Transport,
	// fencegrpc.Client) or "admit" (a server's check of a call's token
	// before its handler runs: fencehttp.Handler, fencegrpc.Server).
	Op string
	// Resource names the one resource written (a row, an object, a
	// resource name), in the format of the guard's errors. It is for
	// traces and logs, not for metric labels.
	Resource string
	// Token is the token the write presented.
	Token Token
	// Outcome is OutcomeOf(Err).
	Outcome Outcome
	// Err is what the guard returned; nil when the write was accepted.
	Err error
	// Start is when the guard was called, with a monotonic reading;
	// Duration is the time from Start to the outcome.
	Start    time.Time
	Duration time.Duration
}

// WriteObserver receives an event for every guarded write, for metrics
// and tracing. Every guard takes one: sqlguard, dbguard, blobguard and
// dynamoguard as an option (WithObserver; sqlguard.Table and
// dbguard.Table through their WithObserver method), fencehttp's Transport
// and Handler and fencegrpc's Client and Server as a field (Observer). Written is called synchronously on the
// writing goroutine after the write's outcome is known, so it must be
// quick and must not write through the guard.
type WriteObserver interface {
	Written(WriteEvent)
}

// ObserveWrite is the helper guards use to report a write: it fills
// Outcome and Duration (measured from e.Start) and passes e to o. It does
// nothing when o is nil, and returns err unchanged so that a guard can end
// with "return fence.ObserveWrite(o, e, err)".
func ObserveWrite(o WriteObserver, e WriteEvent, err error) error {
	if o == nil {
		return err
	}
	e.Err = err
	e.Outcome = OutcomeOf(err)
	e.Duration = time.Since(e.Start)
	o.Written(e)
	return err
}

// Observe runs write and, when o is not nil, reports it to o as e: Start
// is set just before write runs, and Err, Outcome and Duration once it
// returned. It returns write's error. Guards wrap each write with it; a
// write whose Resource is known only afterwards sets it on e itself and
// calls ObserveWrite.
func Observe(o WriteObserver, e WriteEvent, write func() error) error {
	if o == nil {
		return write()
	}
	e.Start = time.Now()
	return ObserveWrite(o, e, write())
}

// WriteObservers fans events out to several observers, in order (for
// example Prometheus metrics and OpenTelemetry traces at once).
type WriteObservers []WriteObserver

// Written passes e to each observer in turn.
func (os WriteObservers) Written(e WriteEvent) {
	for _, o := range os {
		if o != nil {
			o.Written(e)
		}
	}
}
