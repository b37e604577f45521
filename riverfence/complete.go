package riverfence

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"
	"github.com/riverqueue/river/rivertype"

	"github.com/fencekit/fencekit/fence"
)

// ErrCompleted is returned by Complete and CompleteTx when the attempt has
// completed the job already: a second completion would commit the job's
// last writes twice. It matches fence.ErrInvalidArgument.
var ErrCompleted = fmt.Errorf("%w: riverfence: the attempt has completed the job already", fence.ErrInvalidArgument)

// Complete runs fn and completes job in one transaction fenced by the
// attempt's token, so that the job's last writes and its completion
// commit together, and only if the attempt is still the job's current
// one. ctx must be the context Work was given (or one derived from it);
// job is Work's job.
//
// It begins a transaction on the Fence's database and advances the job's
// resource to the attempt's token (sqlguard.Guard.BeginFunc: BEGIN and the
// advance in one round trip), runs fn with it, then River's JobCompleteTx,
// and commits. The resource's row stays locked until the transaction ends,
// so a later attempt's claim waits for it, and once a later attempt has
// claimed, this one's transaction is refused before fn runs. fn may be nil
// (the job had nothing left to write).
//
// It returns the completed job; or, having committed nothing: a
// *fence.StaleError (fence.ErrStaleToken) naming both tokens when a later
// attempt has claimed a token; a *SupersededError (ErrSuperseded) when the
// job's row no longer shows this attempt's fetch running (River rescued,
// cancelled, finished or fetched the job again: JobCompleteTx would have
// completed another attempt's run, or nothing); fn's error as returned;
// ErrNoAttempt when ctx is not a fenced attempt's; ErrCompleted when the
// attempt completed the job already; fence.ErrInvalidArgument for a nil
// job or one that is not the attempt's; and the errors of BeginFunc:
// fence.ErrOutcomeUnknown when COMMIT was sent and its answer never came
// (the job may be complete: read its row), fence.ErrRetryable, a
// *fence.SetupError. A stale or superseded outcome also ends the
// attempt's context with a *SupersededError. ctx bounds the transaction.
func Complete[T river.JobArgs](ctx context.Context, job *river.Job[T], fn func(ctx context.Context, tx pgx.Tx) error) (*river.Job[T], error) {
	r, err := runningFrom(ctx, job)
	if err != nil {
		return nil, err
	}
	var done *river.Job[T]
	err = r.f.guard.BeginFunc(ctx, r.f.db, r.a.Resource, r.a.Token, func(tx pgx.Tx) error {
		if fn != nil {
			if err := fn(ctx, tx); err != nil {
				return err
			}
		}
		var err error
		done, err = completeIn(ctx, r, tx, job)
		return err
	})
	if err != nil {
		r.refused(err)
		return nil, err
	}
	r.st.complete()
	return done, nil
}

// CompleteTx completes job in tx, a transaction of yours on the database
// River works in, fenced by the attempt's token: it advances the job's
// resource to the token (sqlguard.Guard.Advance), then runs River's
// JobCompleteTx and checks that it completed this attempt's run. Call it
// in the transaction of the job's last write, before you commit: the
// writes and the completion then commit together, and only if the attempt
// is still current (a later attempt's claim waits for tx to end).
//
// It returns the completed job, as it will be once tx commits. On a
// *fence.StaleError or a *SupersededError tx is left unable to complete
// the job (the advance aborted it, or the completion is not this
// attempt's): roll it back. Its other errors are Complete's. After it
// returns nil the middleware counts the attempt as complete; a tx that
// then rolls back leaves the job running, to end as the job's code
// returns. ctx bounds the statements.
func CompleteTx[T river.JobArgs](ctx context.Context, tx pgx.Tx, job *river.Job[T]) (*river.Job[T], error) {
	r, err := runningFrom(ctx, job)
	if err != nil {
		return nil, err
	}
	if tx == nil {
		return nil, fmt.Errorf("%w: riverfence: complete job %d: nil transaction", fence.ErrInvalidArgument, job.ID)
	}
	if err := r.f.guard.Advance(ctx, tx, r.a.Resource, r.a.Token); err != nil {
		r.refused(err)
		return nil, err
	}
	done, err := completeIn(ctx, r, tx, job)
	if err != nil {
		r.refused(err)
		return nil, err
	}
	r.st.complete()
	return done, nil
}

// runningFrom returns the attempt in ctx, checking that job is its job and
// that it has not completed yet.
func runningFrom[T river.JobArgs](ctx context.Context, job *river.Job[T]) (*running, error) {
	r, ok := ctx.Value(attemptKey{}).(*running)
	if !ok {
		return nil, ErrNoAttempt
	}
	if job == nil || job.JobRow == nil {
		return nil, fmt.Errorf("%w: riverfence: complete: nil job", fence.ErrInvalidArgument)
	}
	if job.ID != r.a.JobID {
		return nil, fmt.Errorf("%w: riverfence: complete job %d: the context's attempt is of job %d", fence.ErrInvalidArgument, job.ID, r.a.JobID)
	}
	if r.st.completed() {
		return nil, fmt.Errorf("riverfence: complete job %d attempt %d: %w", job.ID, r.a.Number, ErrCompleted)
	}
	return r, nil
}

// completeIn runs JobCompleteTx in tx and checks what it did: the row it
// returns must be this attempt's fetch, completed. River's statement
// checks only the job's id and that it is running: on a row another
// attempt is running it would complete that attempt's run (unless the
// trigger of Install drops the update), and on a rescued row it changes
// nothing. Either way the transaction must not commit.
func completeIn[T river.JobArgs](ctx context.Context, r *running, tx pgx.Tx, job *river.Job[T]) (*river.Job[T], error) {
	done, err := river.JobCompleteTx[*riverpgxv5.Driver](ctx, tx, job)
	if errors.Is(err, rivertype.ErrNotFound) {
		return nil, row{}.supersedes(&r.a)
	}
	if err != nil {
		return nil, fmt.Errorf("riverfence: complete job %d attempt %d: %w", job.ID, r.a.Number, err)
	}
	got := row{found: true, state: string(done.State), attempt: done.Attempt}
	if done.AttemptedAt != nil {
		got.attemptedAt = *done.AttemptedAt
	}
	if got.state == string(rivertype.JobStateCompleted) && got.fetchedBy(&r.a) {
		return done, nil
	}
	sup := got.supersedes(&r.a)
	if sup == nil {
		sup = &SupersededError{JobID: r.a.JobID, Attempt: r.a.Number, Token: r.a.Token, State: got.state, CurrentAttempt: got.attempt,
			Reason: "River did not complete the job for it (the job is " + got.state + ")"}
	}
	return nil, sup
}

// refused records a refusal of the attempt's completion that shows it
// superseded (a stale token, or a *SupersededError), and ends the
// attempt's context with it.
func (r *running) refused(err error) {
	var sup *SupersededError
	switch se, stale := fence.AsStale(err); {
	case errors.As(err, &sup):
	case stale:
		sup = &SupersededError{JobID: r.a.JobID, Attempt: r.a.Number, Token: r.a.Token, Current: se.Current,
			Reason: fmt.Sprintf("a later attempt claimed token %d", se.Current)}
	default:
		return
	}
	if r.st.supersede(sup) {
		r.cancel(sup)
	}
}
