package lease

import (
	"context"
	"errors"
	"fmt"

	"github.com/fencekit/fencekit/fence"
)

// Ledger records which runs of once-per-period jobs are done, in the
// store the jobs write to, fenced by the lease's token. Its two writes go
// through a guard: sqlguard.Ledger keeps it in a PostgreSQL table,
// dbguard.Ledger in a MySQL, MariaDB or SQLite table, dynamoguard.Ledger
// in a DynamoDB table; any type with these methods will do (package
// guardtest's RunLedger checks one).
//
// A run is named by its job and its key. The job is the lease name RunOnce
// runs under (or the name ForJob gives); the key names the run: a period
// ("2026-12-01" for a nightly job), or anything a job must be done once
// for. A Ledger keeps jobs apart: two jobs that share a ledger and a key
// each have a run of their own, fenced by their own tokens (tokens of two
// lease names never compare), so that neither is skipped because the
// other ran. A store that cannot keep jobs apart (a table keyed by the run
// key alone) must refuse, with an error matching ErrSetup that names the
// fix, rather than report a run done that is another job's.
type Ledger interface {
	// Claim records token as the newest holder of job's run key, unless
	// a newer token has claimed it, and reports whether that run is
	// already done. It returns an error matching fence.ErrStaleToken when
	// a newer token has claimed the run (nothing changed). After Claim, a
	// MarkDone with an older token is refused: a holder paused past its
	// lease cannot mark a run done once its successor has claimed it.
	Claim(ctx context.Context, job, key string, token fence.Token) (done bool, err error)
	// MarkDone records job's run key as done by token. It returns nil when
	// the run is recorded done (also when this token recorded it already,
	// for example inside the job's own transaction), and an error matching
	// fence.ErrStaleToken when a newer token has claimed the run.
	MarkDone(ctx context.Context, job, key string, token fence.Token) error
}

// ForJob returns a Ledger that records every run under job, whatever job
// name it is given: for several jobs that take turns under one lease name
// (RunOnce passes the lease name as the job), each wrapped with a job name
// of its own, so that they keep runs of their own. A call through it with
// an empty job returns an error matching ErrInvalidOptions, before any
// I/O.
func ForJob(l Ledger, job string) Ledger { return jobLedger{l: l, job: job} }

type jobLedger struct {
	l   Ledger
	job string
}

func (j jobLedger) check() error {
	switch {
	case j.l == nil:
		return fmt.Errorf("%w: ledger for job %q: the ledger is nil", ErrInvalidOptions, j.job)
	case j.job == "":
		return fmt.Errorf("%w: ledger for a job: the job name is empty", ErrInvalidOptions)
	}
	return nil
}

func (j jobLedger) Claim(ctx context.Context, _, key string, token fence.Token) (bool, error) {
	if err := j.check(); err != nil {
		return false, err
	}
	return j.l.Claim(ctx, j.job, key, token)
}

func (j jobLedger) MarkDone(ctx context.Context, _, key string, token fence.Token) error {
	if err := j.check(); err != nil {
		return err
	}
	return j.l.MarkDone(ctx, j.job, key, token)
}

// ErrInvalidKey is returned by RunOnce, before any I/O, for an empty run key.
var ErrInvalidKey = errors.New("lease: invalid run key")

// RunOnce runs fn at most once for the run key across every process that
// calls it with the same lease name and ledger: the nightly job on three
// replicas runs once a night, not three times in turn. The lease name is
// the job in the ledger (Ledger.Claim's job; ForJob names another): another
// job that shares the ledger and the key runs once too. In this order:
//
//  1. it takes the lease name as Run does (waiting while another process
//     holds it);
//  2. under the lease, it claims the job's run key in the ledger with the
//     lease's token (Ledger.Claim); if the run is done it releases the
//     lease and returns ran == false;
//  3. it runs fn with the lease's context, as Run does;
//  4. if fn returned nil, it marks the run done with the same token
//     (Ledger.MarkDone), then releases the lease.
//
// fn's writes must be fenced with l.Token(), like every leased write. For
// a run that must take effect once even if its process dies, record the
// run done inside the job's own last transaction (sqlguard.Ledger's and
// dbguard.Ledger's MarkDoneTx, dynamoguard.Ledger's MarkDoneTransact) so
// that the effect and the record commit together; step 4 then finds it
// done by the same token.
//
// What happens when things fail (docs/design.md, invariant 1; Kleppmann 2016):
//
//   - fn returns an error, or its process dies before step 4: the run is
//     not done, and the next RunOnce (on any replica) runs fn again. A job
//     whose writes are not all in one transaction with the record must be
//     safe to run again over its own partial writes.
//   - The holder is paused past its lease: a successor claims the key with
//     a newer token and runs fn. When the paused holder wakes, its fenced
//     writes to resources the successor wrote, and its MarkDone, are
//     refused as stale; RunOnce returns that error (and, from Run, the
//     loss of the lease).
//   - MarkDone's outcome is unknown (an error matching
//     fence.ErrOutcomeUnknown): RunOnce returns it with ran == true; the
//     next RunOnce reads the ledger and runs fn again only if the record
//     did not land.
//
// RunOnce returns ran == true when fn ran (whatever it returned), with
// fn's error, a Ledger error (one matching ErrSetup, for a ledger that
// cannot keep jobs apart or is not set up, before fn runs), and the
// lease's loss or release error as Run returns them. It returns an error matching ErrInvalidKey for an empty
// key and ErrInvalidOptions for a nil ledger or fn, before any I/O; and
// Acquire's errors when the lease could not be had (ctx bounds the wait,
// as for Run).
func (m *Manager) RunOnce(ctx context.Context, name, key string, ledger Ledger, fn func(ctx context.Context, l *Lease) error) (ran bool, err error) {
	var errs []error
	if key == "" {
		errs = append(errs, fmt.Errorf("%w: the run key is empty", ErrInvalidKey))
	}
	if ledger == nil {
		errs = append(errs, fmt.Errorf("%w: run once: the ledger is nil", ErrInvalidOptions))
	}
	if fn == nil {
		errs = append(errs, fmt.Errorf("%w: run once: the job's function is nil", ErrInvalidOptions))
	}
	if err := errors.Join(errs...); err != nil {
		return false, err
	}
	err = m.Run(ctx, name, func(ctx context.Context, l *Lease) error {
		done, err := ledger.Claim(ctx, name, key, l.Token())
		if err != nil {
			return fmt.Errorf("lease: run once %q: claim %q: %w", name, key, err)
		}
		if done {
			return nil
		}
		ran = true
		if err := fn(ctx, l); err != nil {
			return err
		}
		if err := ledger.MarkDone(ctx, name, key, l.Token()); err != nil {
			return fmt.Errorf("lease: run once %q: mark %q done: %w", name, key, err)
		}
		return nil
	})
	return ran, err
}
