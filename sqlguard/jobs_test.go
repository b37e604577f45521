package sqlguard_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/fencekit/fencekit/fence"
	"github.com/fencekit/fencekit/internal/testkit"
	"github.com/fencekit/fencekit/sqlguard"
)

// newJobs returns a Jobs over the env's fencekit_jobs.
func (e *env) newJobs(tb testing.TB) *sqlguard.Jobs {
	tb.Helper()
	j, err := sqlguard.NewJobs(e.Pool, "", sqlguard.JobsTable)
	if err != nil {
		tb.Fatal(err)
	}
	return j
}

// addJob inserts a job of queue, due after delay, and returns its id.
func (e *env) addJob(tb testing.TB, queue string, delay time.Duration) int64 {
	tb.Helper()
	return e.int64Query(tb, `INSERT INTO fencekit_jobs (queue, kind, run_at) VALUES ($1, 'pay', now() + $2 * interval '1 microsecond') RETURNING id`,
		queue, delay.Microseconds())
}

// expire ends the job's claim, as the passing of its length would: the
// database's clock is the claim's, and a test need not wait for it.
func (e *env) expire(tb testing.TB, id int64) {
	tb.Helper()
	e.exec(tb, `UPDATE fencekit_jobs SET claimed_until = now() - interval '1 second' WHERE id = $1`, id)
}

type jobState struct {
	state       string
	attempt     int
	lockVersion int64
	lastError   *string
}

func (e *env) jobState(tb testing.TB, id int64) jobState {
	tb.Helper()
	var s jobState
	if err := e.Pool.QueryRow(context.Background(), `SELECT state, attempt, lock_version, last_error FROM fencekit_jobs WHERE id = $1`, id).
		Scan(&s.state, &s.attempt, &s.lockVersion, &s.lastError); err != nil {
		tb.Fatal(err)
	}
	return s
}

// TestJobsClaimTakesTheOldestDueJob: a claim takes the oldest due job of
// its queue, skips jobs not due and jobs another attempt holds, and
// reports ErrNoJob when nothing is runnable.
func TestJobsClaimTakesTheOldestDueJob(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	j := e.newJobs(t)
	ctx := testkit.Context(t)
	first := e.addJob(t, "mail", 0)
	second := e.addJob(t, "mail", 0)
	e.addJob(t, "mail", time.Hour) // not due
	other := e.addJob(t, "billing", 0)
	for _, want := range []int64{first, second} {
		job, err := j.Claim(ctx, "mail", time.Minute)
		if err != nil || job.ID != want || job.Attempt != 1 || job.Token == fence.None {
			t.Fatalf("Claim = %+v, %v; want job %d, attempt 1, a token", job, err, want)
		}
		if s := e.jobState(t, want); s.state != sqlguard.JobRunning || s.lockVersion != int64(job.Token) {
			t.Fatalf("job %d after its claim = %+v; want running with lock_version %d", want, s, job.Token)
		}
	}
	if job, err := j.Claim(ctx, "mail", time.Minute); !errors.Is(err, sqlguard.ErrNoJob) {
		t.Fatalf("Claim with nothing runnable = %+v, %v; want ErrNoJob", job, err)
	}
	if job, err := j.Claim(ctx, "", time.Minute); err != nil || job.ID != other {
		t.Fatalf("Claim of any queue = %+v, %v; want job %d", job, err, other)
	}
}

// TestJobsExpiredClaimIsFenced: a claim that expires is taken over by the
// next claim, with the next attempt and a greater token; the first
// attempt's heartbeat, completion and failure are refused as stale, naming
// both tokens, and change nothing; the second attempt completes the job,
// and a completion of a job already completed is not stale.
func TestJobsExpiredClaimIsFenced(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	j := e.newJobs(t)
	ctx := testkit.Context(t)
	id := e.addJob(t, "default", 0)
	a, err := j.Claim(ctx, "", time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := j.Claim(ctx, "", time.Minute); !errors.Is(err, sqlguard.ErrNoJob) {
		t.Fatalf("a second Claim while the first holds = %v; want ErrNoJob", err)
	}
	if err := j.Heartbeat(ctx, a, time.Minute); err != nil {
		t.Fatalf("Heartbeat of the current attempt = %v", err)
	}
	e.expire(t, id)
	b, err := j.Claim(ctx, "", time.Minute)
	if err != nil || b.ID != id || b.Attempt != 2 || b.Token <= a.Token {
		t.Fatalf("Claim after the expiry = %+v, %v; want job %d, attempt 2, a token above %d", b, err, id, a.Token)
	}
	before := e.jobState(t, id)
	for name, err := range map[string]error{
		"heartbeat": j.Heartbeat(ctx, a, time.Minute),
		"complete":  j.Complete(ctx, e.Pool, a),
		"fail":      j.Fail(ctx, e.Pool, a, "gave up", time.Time{}),
		"retry":     j.Fail(ctx, e.Pool, a, "try again", time.Now()),
	} {
		if se, ok := fence.AsStale(err); !ok || se.Presented != a.Token || se.Current != b.Token || !strings.Contains(se.Resource, "fencekit_jobs(id=") {
			t.Errorf("%s of the first attempt = %v; want stale, presented %d, current %d", name, err, a.Token, b.Token)
		}
	}
	if after := e.jobState(t, id); after != before {
		t.Fatalf("the refused writes changed the job: %+v, was %+v", after, before)
	}
	if err := j.Complete(ctx, e.Pool, b); err != nil {
		t.Fatalf("Complete of the current attempt = %v", err)
	}
	if s := e.jobState(t, id); s.state != sqlguard.JobCompleted || s.lockVersion != int64(b.Token) {
		t.Fatalf("job after completion = %+v", s)
	}
	if err := j.Complete(ctx, e.Pool, b); !errors.Is(err, sqlguard.ErrJobNotRunning) || errors.Is(err, fence.ErrStaleToken) {
		t.Errorf("a second Complete = %v; want ErrJobNotRunning, not stale", err)
	}
	if _, err := j.Claim(ctx, "", time.Minute); !errors.Is(err, sqlguard.ErrNoJob) {
		t.Errorf("Claim of a completed job = %v; want ErrNoJob", err)
	}
	missing := sqlguard.Job{ID: id + 1000, Token: b.Token}
	if err := j.Heartbeat(ctx, missing, time.Minute); !errors.Is(err, fence.ErrNotFound) {
		t.Errorf("Heartbeat of a missing job = %v; want fence.ErrNotFound", err)
	}
}

// TestJobsCompleteInTheJobsTransaction: the job's write and its
// completion commit together; a superseded attempt's completion is
// refused in its transaction, which rolls back its write with it. While a
// transaction holds the completion, no claim can take the job.
func TestJobsCompleteInTheJobsTransaction(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	j := e.newJobs(t)
	ctx := testkit.Context(t)
	e.exec(t, `CREATE TABLE effects (job_id bigint, token bigint)`)
	id := e.addJob(t, "default", 0)
	a, err := j.Claim(ctx, "", time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	e.expire(t, id)
	b, err := j.Claim(ctx, "", time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	work := func(job sqlguard.Job) error {
		return pgx.BeginFunc(ctx, e.Pool, func(tx pgx.Tx) error {
			if _, err := tx.Exec(ctx, `INSERT INTO effects VALUES ($1, $2)`, job.ID, int64(job.Token)); err != nil {
				return err
			}
			return j.Complete(ctx, tx, job)
		})
	}
	if err := work(a); !errors.Is(err, fence.ErrStaleToken) {
		t.Fatalf("the first attempt's transaction = %v; want stale", err)
	}
	// The current attempt's completion holds the job's row until its
	// transaction ends: even with its claim expired meanwhile, no other
	// claim takes the job then.
	e.expire(t, id)
	tx, err := e.Pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx) //nolint:errcheck
	if err := j.Complete(ctx, tx, b); err != nil {
		t.Fatal(err)
	}
	if _, err := j.Claim(ctx, "", time.Minute); !errors.Is(err, sqlguard.ErrNoJob) {
		t.Errorf("Claim while a completion holds the expired job = %v; want ErrNoJob", err)
	}
	if _, err := tx.Exec(ctx, `INSERT INTO effects VALUES ($1, $2)`, b.ID, int64(b.Token)); err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if n := e.int64Query(t, `SELECT count(*) FROM effects WHERE token = $1`, int64(b.Token)); n != 1 || e.int64Query(t, `SELECT count(*) FROM effects`) != 1 {
		t.Errorf("effects: %d of the current attempt, want exactly 1 and nothing else", n)
	}
}

// TestJobsFailRetriesOrEnds: a failure with a retry time makes the job
// available then (for the next attempt, with a greater token); one
// without ends it.
func TestJobsFailRetriesOrEnds(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	j := e.newJobs(t)
	ctx := testkit.Context(t)
	id := e.addJob(t, "default", 0)
	a, err := j.Claim(ctx, "", time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	if err := j.Fail(ctx, e.Pool, a, "timeout talking to the bank", time.Now().Add(-time.Second)); err != nil {
		t.Fatal(err)
	}
	if s := e.jobState(t, id); s.state != sqlguard.JobAvailable || s.lastError == nil || *s.lastError != "timeout talking to the bank" {
		t.Fatalf("job after a retryable failure = %+v", s)
	}
	b, err := j.Claim(ctx, "", time.Minute)
	if err != nil || b.Attempt != 2 || b.Token <= a.Token {
		t.Fatalf("the retry's claim = %+v, %v; want attempt 2 with a token above %d", b, err, a.Token)
	}
	if err := j.Fail(ctx, e.Pool, b, "card refused", time.Time{}); err != nil {
		t.Fatal(err)
	}
	if s := e.jobState(t, id); s.state != sqlguard.JobFailed {
		t.Fatalf("job after a final failure = %+v", s)
	}
	if _, err := j.Claim(ctx, "", time.Minute); !errors.Is(err, sqlguard.ErrNoJob) {
		t.Errorf("Claim of a failed job = %v; want ErrNoJob", err)
	}
}

// TestJobsBadInputDoesNoIO: a zero token, a claim's length that is not
// positive, a nil transaction and a nil database are refused before any
// I/O.
func TestJobsBadInputDoesNoIO(t *testing.T) {
	db := &countingDB{}
	j, err := sqlguard.NewJobs(db, "", sqlguard.JobsTable)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	job := sqlguard.Job{ID: 1, Token: 7}
	for name, err := range map[string]error{
		"zero token":      j.Complete(ctx, db, sqlguard.Job{ID: 1}),
		"heartbeat lease": j.Heartbeat(ctx, job, 0),
		"nil transaction": j.Fail(ctx, nil, job, "", time.Time{}),
	} {
		if !errors.Is(err, fence.ErrInvalidArgument) {
			t.Errorf("%s: %v; want fence.ErrInvalidArgument", name, err)
		}
	}
	if _, err := j.Claim(ctx, "", -time.Second); !errors.Is(err, fence.ErrInvalidArgument) {
		t.Errorf("Claim with a negative length: %v", err)
	}
	if n := db.calls.Load(); n != 0 {
		t.Errorf("%d calls reached the database", n)
	}
	if _, err := sqlguard.NewJobs(nil, "", "jobs;drop"); !errors.Is(err, fence.ErrInvalidArgument) || !strings.Contains(err.Error(), "nil database") {
		t.Errorf("NewJobs(nil, bad name) = %v", err)
	}
}

// TestJobsCheckNamesTheFix: a table of one's own that lacks columns is
// told the ALTER TABLE that adds each, a missing toolkit table the
// migration, and a fit table nothing.
func TestJobsCheckNamesTheFix(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := testkit.Context(t)
	if err := e.newJobs(t).Check(ctx); err != nil {
		t.Fatalf("Check of %s = %v", sqlguard.JobsTable, err)
	}
	e.exec(t, `CREATE TABLE jobs (id bigserial PRIMARY KEY, state text NOT NULL DEFAULT 'available', run_at timestamptz NOT NULL DEFAULT now(), lock_version integer NOT NULL DEFAULT 0)`)
	own, err := sqlguard.NewJobs(e.Pool, "", "jobs")
	if err != nil {
		t.Fatal(err)
	}
	err = own.Check(ctx)
	for _, want := range []string{"ADD COLUMN attempt integer", "ADD COLUMN claimed_until timestamptz", "ADD COLUMN last_error text",
		"ADD COLUMN finished_at timestamptz", "ALTER COLUMN lock_version TYPE bigint"} {
		if !errors.Is(err, fence.ErrSetup) || !strings.Contains(err.Error(), want) {
			t.Errorf("Check of an unfit table = %v; want a setup error with %q", err, want)
		}
	}
	if _, cerr := own.Claim(ctx, "", time.Minute); !errors.Is(cerr, fence.ErrSetup) {
		t.Errorf("Claim on the unfit table = %v; want the setup error", cerr)
	}
	e.exec(t, `DROP TABLE fencekit_jobs`)
	if err := e.newJobs(t).Check(ctx); !errors.Is(err, fence.ErrNotMigrated) || !strings.Contains(err.Error(), "fencekit migrate up") {
		t.Errorf("Check without %s = %v; want fence.ErrNotMigrated naming the migration", sqlguard.JobsTable, err)
	}
}
