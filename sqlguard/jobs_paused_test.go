package sqlguard_test

import (
	"bufio"
	"context"
	"errors"
	"os"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/fencekit/fencekit/fence"
	"github.com/fencekit/fencekit/internal/testkit"
	"github.com/fencekit/fencekit/migrations/migrationstest"
	"github.com/fencekit/fencekit/sqlguard"
)

// The job table's version of the paused worker: real worker processes
// (this test binary again) each run a claim loop over fencekit_jobs. The
// first attempt is frozen (SIGSTOP) past its claim, or killed (SIGKILL)
// mid-way; a second worker claims the job when the claim has expired (by
// the database's clock), and completes it; the first, resumed, is refused.
// Assertions are on the rows and the order of events.

// jobWorkerVar carries a job worker's configuration (testkit.StartChild).
const jobWorkerVar = "SQLGUARD_TEST_JOB_WORKER"

// jobClaim is the claim's length in these tests: the first attempt's
// claim expires while it is frozen.
const jobClaim = time.Second

// jobEvent is one line a job worker reports; the outcome of a heartbeat,
// a write or a completion is in its testkit.Outcome.
type jobEvent struct {
	Who     string      `json:"who"`
	Kind    string      `json:"kind"` // claimed, waiting, heartbeat, write, complete
	ID      int64       `json:"id,omitempty"`
	Attempt int         `json:"attempt,omitempty"`
	Token   fence.Token `json:"token,omitempty"`
	testkit.Outcome
}

func jobOutcome(who, kind string, err error) jobEvent {
	return jobEvent{Who: who, Kind: kind, Outcome: testkit.OutcomeOf(err)}
}

// runJobWorker is a job worker process (testkit.ChildMain): it claims one
// job (polling), writes its progress, then in one transaction its ledger
// line, the account's balance and the job's completion. It returns an
// error when it could not run.
func runJobWorker(cfg migrationstest.ChildConfig) error {
	ctx := context.Background()
	pool, err := migrationstest.OpenPool(ctx, cfg.URL, cfg.Schema)
	if err != nil {
		return err
	}
	defer pool.Close()
	jobs, err := sqlguard.NewJobs(pool, "", sqlguard.JobsTable)
	if err != nil {
		return err
	}
	payments, err := sqlguard.NewTable("", "payments", "job_id")
	if err != nil {
		return err
	}
	rep, stdin := testkit.NewReporter(os.Stdout), bufio.NewReader(os.Stdin)
	wait := func(at string) {
		if cfg.Gate == at {
			rep.Report(jobEvent{Who: cfg.Name, Kind: "waiting"})
			_, _ = stdin.ReadString('\n')
		}
	}
	var job sqlguard.Job
	for deadline := time.Now().Add(time.Minute); ; {
		job, err = jobs.Claim(ctx, "", jobClaim)
		if !errors.Is(err, sqlguard.ErrNoJob) {
			break
		}
		if time.Now().After(deadline) {
			return err
		}
		time.Sleep(20 * time.Millisecond)
	}
	if err != nil {
		return err
	}
	rep.Report(jobEvent{Who: cfg.Name, Kind: "claimed", ID: job.ID, Attempt: job.Attempt, Token: job.Token})
	wait("claimed")
	rep.Report(jobOutcome(cfg.Name, "heartbeat", jobs.Heartbeat(ctx, job, jobClaim)))
	err = payments.Update(ctx, pool, []any{job.ID}, job.Token, sqlguard.Col("status", "paid by "+cfg.Name))
	rep.Report(jobOutcome(cfg.Name, "write", err))
	wait("written")
	err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		if err := jobs.Complete(ctx, tx, job); err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, `INSERT INTO ledger (job_id, worker, attempt, token) VALUES ($1, $2, $3, $4)`,
			job.ID, cfg.Name, job.Attempt, int64(job.Token)); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, `UPDATE accounts SET balance = balance + 1 WHERE id = 1`)
		return err
	})
	rep.Report(jobOutcome(cfg.Name, "complete", err))
	return nil
}

// jobsScenario is one test's schema with the job table, one job and the
// job's own tables.
func jobsScenario(t *testing.T) (*env, int64) {
	t.Helper()
	e := newEnv(t)
	e.exec(t, `CREATE TABLE payments (job_id bigint PRIMARY KEY, status text NOT NULL DEFAULT 'new', lock_version bigint NOT NULL DEFAULT 0);
		CREATE TABLE ledger (job_id bigint, worker text, attempt int, token bigint);
		CREATE TABLE accounts (id int PRIMARY KEY, balance int NOT NULL); INSERT INTO accounts VALUES (1, 0)`)
	id := e.addJob(t, "default", 0)
	e.exec(t, `INSERT INTO payments (job_id) VALUES ($1)`, id)
	return e, id
}

// startJobWorker starts a job worker process that waits for a line on
// stdin at gate: "claimed", "written" (after its progress write), or ""
// (nowhere).
func startJobWorker(t *testing.T, e *env, name, gate string) *testkit.Child[jobEvent] {
	t.Helper()
	return testkit.StartChild[jobEvent](t, name, jobWorkerVar, e.Child(name, gate))
}

func nextJobEvent(t *testing.T, c *testkit.Child[jobEvent], kind string) jobEvent {
	t.Helper()
	return c.Next(t, time.Minute, kind, func(ev jobEvent) bool { return ev.Kind == kind }, nil)
}

// waitClaimExpired waits until the job's claim has expired by the
// database's clock.
func waitClaimExpired(t *testing.T, e *env, id int64) {
	t.Helper()
	migrationstest.WaitTrue(t, e.Pool, time.Minute, "the first attempt's claim never expired",
		`SELECT claimed_until < now() FROM fencekit_jobs WHERE id = $1`, id)
}

// secondWorkerCompletes starts worker B, which claims the job after the
// first attempt (claimed with first): attempt 2, a greater token, and
// runs it to completion.
func secondWorkerCompletes(t *testing.T, e *env, first jobEvent) jobEvent {
	t.Helper()
	b := startJobWorker(t, e, "B", "")
	cb := nextJobEvent(t, b, "claimed")
	if cb.ID != first.ID || cb.Attempt != 2 || cb.Token <= first.Token {
		t.Fatalf("B's claim = %+v; want job %d, attempt 2, a token above %d", cb, first.ID, first.Token)
	}
	for _, kind := range []string{"heartbeat", "write", "complete"} {
		if ev := nextJobEvent(t, b, kind); !ev.Accepted {
			t.Fatalf("B's %s: %+v", kind, ev)
		}
	}
	if err := b.Wait(t, time.Minute); err != nil {
		t.Fatalf("worker B: %v", err)
	}
	return cb
}

// checkJobDoneOnceBy checks the job completed, and its effects happened
// once, by the attempt claimed with c.
func checkJobDoneOnceBy(t *testing.T, e *env, c jobEvent) {
	t.Helper()
	if s := e.jobState(t, c.ID); s.state != sqlguard.JobCompleted || s.attempt != c.Attempt || s.lockVersion != int64(c.Token) {
		t.Errorf("job = %+v; want completed by attempt %d, token %d", s, c.Attempt, c.Token)
	}
	if n := e.int64Query(t, `SELECT count(*) FROM ledger`); n != 1 || e.int64Query(t, `SELECT count(*) FROM ledger WHERE worker = $1 AND token = $2`, c.Who, int64(c.Token)) != 1 {
		t.Errorf("ledger has %d lines; want one, by %s with token %d", n, c.Who, c.Token)
	}
	if b := e.int64Query(t, `SELECT balance FROM accounts WHERE id = 1`); b != 1 {
		t.Errorf("balance = %d; want 1 (paid once)", b)
	}
	var status string
	if err := e.Pool.QueryRow(context.Background(), `SELECT status FROM payments WHERE job_id = $1 AND lock_version = $2`, c.ID, int64(c.Token)).Scan(&status); err != nil || status != "paid by "+c.Who {
		t.Errorf("payment = %q, %v; want paid by %s at its token", status, err, c.Who)
	}
}

// TestJobsPausedAttemptIsFenced: the first attempt is frozen past its
// claim; the second claims the job and completes it; the first, resumed,
// has its heartbeat, its write and its completion refused as stale,
// naming both tokens. The job's effects happened once, and its row is the
// second attempt's.
func TestJobsPausedAttemptIsFenced(t *testing.T) {
	e, id := jobsScenario(t)
	a := startJobWorker(t, e, "A", "claimed")
	ca := nextJobEvent(t, a, "claimed")
	nextJobEvent(t, a, "waiting")
	a.Signal(t, syscall.SIGSTOP)
	waitClaimExpired(t, e, id)
	cb := secondWorkerCompletes(t, e, ca)
	checkJobDoneOnceBy(t, e, cb)

	a.Signal(t, syscall.SIGCONT)
	a.Say(t, "go")
	for _, kind := range []string{"heartbeat", "write", "complete"} {
		ev := nextJobEvent(t, a, kind)
		if ev.Accepted || !ev.Stale || ev.Presented != ca.Token || ev.Current != cb.Token {
			t.Errorf("A's %s = %+v; want refused as stale, presented %d, current %d", kind, ev, ca.Token, cb.Token)
		}
	}
	if err := a.Wait(t, time.Minute); err != nil {
		t.Fatalf("worker A: %v", err)
	}
	checkJobDoneOnceBy(t, e, cb)
}

// TestJobsKilledAttemptIsReplaced: the first attempt writes its progress
// and is killed before it completes; once its claim has expired the
// second attempt claims the job, overwrites the progress and completes.
func TestJobsKilledAttemptIsReplaced(t *testing.T) {
	e, id := jobsScenario(t)
	a := startJobWorker(t, e, "A", "written")
	ca := nextJobEvent(t, a, "claimed")
	if ev := nextJobEvent(t, a, "write"); !ev.Accepted {
		t.Fatalf("A's write: %+v", ev)
	}
	nextJobEvent(t, a, "waiting")
	a.Signal(t, syscall.SIGKILL)
	_ = a.Wait(t, time.Minute)
	waitClaimExpired(t, e, id)
	checkJobDoneOnceBy(t, e, secondWorkerCompletes(t, e, ca))
}
