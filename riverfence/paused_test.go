package riverfence_test

import (
	"context"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"
	"github.com/riverqueue/river/rivertype"

	"github.com/fencekit/fencekit/fence"
	"github.com/fencekit/fencekit/internal/testkit"
	"github.com/fencekit/fencekit/migrations/migrationstest"
)

// The scenarios of a job whose first attempt River gives up on while the
// attempt is only paused (SIGSTOP) or dead (SIGKILL), with real River
// workers in processes of their own (the test binary again: worker_test.go)
// and River's own rescue, run by a leader client in the test's process.
// Every assertion is on the stores' rows and the order of events; no
// timing is asserted.

// rescueAfter is River's RescueStuckJobsAfter in these tests: short, so
// that a frozen attempt is rescued soon. Only the rescuing client uses it;
// the workers have no job deadline.
const rescueAfter = time.Second

// step bounds each wait for an event or a state: generous for a loaded
// machine. River's scheduler makes a rescued job available within its
// interval (5 s, not configurable), which most waits include.
const step = time.Minute

// retryNow is a River retry policy that retries at once.
type retryNow struct{}

func (retryNow) NextRetry(*rivertype.JobRow) time.Time { return time.Now() }

// startWorker starts a worker process, a River client that works one pay
// job under the Fence and exits, and waits for it to start its client.
// The job waits for a line on stdin at gate: "claimed" (before its first
// write), "written" (after it), or "" (nowhere).
func startWorker(t *testing.T, e *env, name, gate string) *testkit.Child[event] {
	t.Helper()
	c := testkit.StartChild[event](t, name, workerVar, e.Child(name, gate))
	c.Next(t, step, "start", func(ev event) bool { return ev.Kind == "started" }, nil)
	return c
}

// next returns the child's next event of kind.
func next(t *testing.T, c *testkit.Child[event], kind string) event {
	t.Helper()
	return c.Next(t, step, kind, func(ev event) bool { return ev.Kind == kind }, nil)
}

// rescueWhenStuck waits until the job's attempt has run longer than
// rescueAfter by the database's clock (River's rule for a stuck job), then
// starts a River client that is the only one to take part in leader
// elections: as leader it runs River's maintenance, whose rescuer finds
// the job stuck at its first run and makes it retryable, and whose
// scheduler makes it available again. It waits until the job has left
// its first attempt's run.
func rescueWhenStuck(t *testing.T, e *env, id int64) {
	t.Helper()
	ctx := testkit.Context(t)
	migrationstest.WaitTrue(t, e.Pool, step, "the job's attempt never became stuck",
		`SELECT pg_catalog.now() - attempted_at > $2 FROM river_job WHERE id = $1`, id, rescueAfter+100*time.Millisecond)
	workers := river.NewWorkers()
	river.AddWorker(workers, &payWorker{}) // River judges a stuck job by its worker's timeout
	client, err := river.NewClient(riverpgxv5.New(e.Pool), &river.Config{
		Queues:               map[string]river.QueueConfig{"maintenance": {MaxWorkers: 1}},
		Workers:              workers,
		JobTimeout:           rescueAfter,
		RescueStuckJobsAfter: rescueAfter,
		RetryPolicy:          retryNow{},
		Logger:               quietLogger(),
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := client.Start(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if err := client.Stop(ctx); err != nil {
			t.Errorf("stop the rescuing client: %v", err)
		}
	})
	e.waitJob(t, id, step, "rescued", func(r jobRow) bool { return r.State != "running" || r.Attempt > 1 })
}

// effects are the job's effects as the stores keep them.
type effects struct {
	status      string
	lockVersion fence.Token
	ledger      []ledgerLine
	balance     int
}

type ledgerLine struct {
	worker  string
	attempt int
	token   fence.Token
}

func (e *env) effects(t *testing.T, id int64) effects {
	t.Helper()
	ctx := testkit.Context(t)
	var ef effects
	var lv int64
	if err := e.Pool.QueryRow(ctx, `SELECT status, lock_version FROM payments WHERE job_id = $1`, id).Scan(&ef.status, &lv); err != nil {
		t.Fatal(err)
	}
	ef.lockVersion = fence.Token(lv)
	if err := e.Pool.QueryRow(ctx, `SELECT balance FROM accounts WHERE id = 1`).Scan(&ef.balance); err != nil {
		t.Fatal(err)
	}
	rows, err := e.Pool.Query(ctx, `SELECT worker, attempt, token FROM ledger WHERE job_id = $1 ORDER BY at`, id)
	if err != nil {
		t.Fatal(err)
	}
	lines, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (ledgerLine, error) {
		var l ledgerLine
		var tok int64
		err := r.Scan(&l.worker, &l.attempt, &tok)
		l.token = fence.Token(tok)
		return l, err
	})
	if err != nil {
		t.Fatal(err)
	}
	ef.ledger = lines
	return ef
}

// checkDoneOnceBy checks that the job's effects happened once, by worker
// at attempt with token, and that the job is completed by that attempt.
func checkDoneOnceBy(t *testing.T, e *env, id int64, amount int, worker string, attempt int, token fence.Token) {
	t.Helper()
	ef := e.effects(t, id)
	want := []ledgerLine{{worker, attempt, token}}
	if len(ef.ledger) != 1 || ef.ledger[0] != want[0] {
		t.Errorf("ledger of job %d = %+v; want once, by %s: %+v", id, ef.ledger, worker, want)
	}
	if ef.balance != amount {
		t.Errorf("balance = %d; want %d (the amount paid once)", ef.balance, amount)
	}
	if ef.status != "paid by "+worker || ef.lockVersion != token {
		t.Errorf("payment = %q at lock_version %d; want %q at %d", ef.status, ef.lockVersion, "paid by "+worker, token)
	}
	j := e.job(t, id)
	if j.State != "completed" || j.Attempt != attempt || j.Reported == nil || fence.Token(*j.Reported) != token {
		t.Errorf("job %d = %+v; want completed by attempt %d, its report's token %d", id, j, attempt, token)
	}
}

// claimsNext returns the claim of the worker c, which runs the job after
// the attempt whose claim was first: the job's second attempt, with a
// greater token.
func claimsNext(t *testing.T, c *testkit.Child[event], first event) event {
	t.Helper()
	ev := next(t, c, "claimed")
	if ev.Attempt != 2 || ev.Token <= first.Token {
		t.Fatalf("second attempt = %+v; want attempt 2 with a token above the first's %d", ev, first.Token)
	}
	return ev
}

// finishes checks that the worker c's write and completion are accepted,
// and that it exits.
func finishes(t *testing.T, c *testkit.Child[event]) {
	t.Helper()
	for _, kind := range []string{"write", "complete"} {
		if ev := next(t, c, kind); !ev.Accepted {
			t.Fatalf("%s's %s: %+v", c.Name, kind, ev)
		}
	}
	if err := c.Wait(t, step); err != nil {
		t.Fatalf("worker %s: %v", c.Name, err)
	}
}

// checkRefused checks that ev (a write or a completion) was refused as
// stale, naming the stale and the current token.
func checkRefused(t *testing.T, ev event, presented, current fence.Token) {
	t.Helper()
	if ev.Accepted || !ev.Stale || ev.Presented != presented || ev.Current != current {
		t.Errorf("%s of %s = %+v; want refused as stale, presented %d, current %d", ev.Kind, ev.Who, ev, presented, current)
	}
}

// TestPausedAttemptIsFenced: the first attempt is frozen (SIGSTOP) after
// its claim, past River's rescue timeout; River rescues the job and a
// second worker runs it to completion; the first is resumed (SIGCONT) and
// writes and completes with its token. Both are refused as stale, naming
// both tokens; the job's effects happened once, and its row is the second
// attempt's: River's record of the first attempt's error was kept off it.
func TestPausedAttemptIsFenced(t *testing.T) {
	e := newEnv(t)
	id := e.insertPay(t, 10)
	a := startWorker(t, e, "A", "claimed")
	ca := next(t, a, "claimed")
	next(t, a, "waiting")
	a.Signal(t, syscall.SIGSTOP)

	rescueWhenStuck(t, e, id)
	b := startWorker(t, e, "B", "")
	cb := claimsNext(t, b, ca)
	finishes(t, b)
	checkDoneOnceBy(t, e, id, 10, "B", 2, cb.Token)

	a.Signal(t, syscall.SIGCONT)
	a.Say(t, "go")
	checkRefused(t, next(t, a, "write"), ca.Token, cb.Token)
	checkRefused(t, next(t, a, "complete"), ca.Token, cb.Token)
	if c := next(t, a, "context"); !c.Superseded {
		t.Error("the first attempt's context did not end as superseded")
	}
	next(t, a, "stopped") // River has recorded A's outcome, or dropped it
	if err := a.Wait(t, step); err != nil {
		t.Fatalf("worker A: %v", err)
	}
	checkDoneOnceBy(t, e, id, 10, "B", 2, cb.Token)
}

// TestKilledAttemptIsReplaced: the first attempt writes its progress with
// its token and is killed (SIGKILL) before it completes; River rescues the
// job and a second worker runs it. The second attempt's token overwrites
// the first's progress, and the job's effects happened once.
func TestKilledAttemptIsReplaced(t *testing.T) {
	e := newEnv(t)
	id := e.insertPay(t, 7)
	a := startWorker(t, e, "A", "written")
	ca := next(t, a, "claimed")
	if w := next(t, a, "write"); !w.Accepted {
		t.Fatalf("A's write: %+v", w)
	}
	next(t, a, "waiting")
	a.Signal(t, syscall.SIGKILL)
	_ = a.Wait(t, step)
	if ef := e.effects(t, id); ef.status != "paid by A" || ef.lockVersion != ca.Token {
		t.Fatalf("A's progress = %+v; want written with its token %d", ef, ca.Token)
	}

	rescueWhenStuck(t, e, id)
	b := startWorker(t, e, "B", "")
	cb := claimsNext(t, b, ca)
	finishes(t, b)
	checkDoneOnceBy(t, e, id, 7, "B", 2, cb.Token)
}

// TestPausedAttemptResumedWhileTheNextRuns: the first attempt wakes while
// the second is running. Its progress write is accepted (no newer token
// has written that row yet: fencing orders writes, it does not undo
// them), its completion is refused (the second attempt claimed a newer
// token on the job's resource), and River's record of its outcome, which
// River applies by the job's id and state alone, is kept off the row by
// the trigger: the job stays the second attempt's run, which then
// overwrites the progress and completes.
func TestPausedAttemptResumedWhileTheNextRuns(t *testing.T) {
	e := newEnv(t)
	id := e.insertPay(t, 5)
	a := startWorker(t, e, "A", "claimed")
	ca := next(t, a, "claimed")
	next(t, a, "waiting")
	a.Signal(t, syscall.SIGSTOP)

	rescueWhenStuck(t, e, id)
	b := startWorker(t, e, "B", "claimed")
	cb := claimsNext(t, b, ca)
	next(t, b, "waiting")
	before := e.job(t, id)

	a.Signal(t, syscall.SIGCONT)
	a.Say(t, "go")
	if w := next(t, a, "write"); !w.Accepted {
		t.Errorf("A's progress write = %+v; want accepted (the row has seen no newer token)", w)
	}
	checkRefused(t, next(t, a, "complete"), ca.Token, cb.Token)
	next(t, a, "stopped")
	if err := a.Wait(t, step); err != nil {
		t.Fatalf("worker A: %v", err)
	}
	if after := e.job(t, id); after != before {
		t.Fatalf("the first attempt's outcome changed the job's row: %+v, was %+v (B is running it)", after, before)
	}

	b.Say(t, "go")
	finishes(t, b)
	checkDoneOnceBy(t, e, id, 5, "B", 2, cb.Token)
}
