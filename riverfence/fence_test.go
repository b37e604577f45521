package riverfence_test

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"
	"github.com/riverqueue/river/rivertype"

	"github.com/fencekit/fencekit/fence"
	"github.com/fencekit/fencekit/internal/testkit"
	"github.com/fencekit/fencekit/riverfence"
	"github.com/fencekit/fencekit/sqlguard"
)

// funcWorker works the pay job with fn.
type funcWorker struct {
	river.WorkerDefaults[payArgs]
	fn func(ctx context.Context, job *river.Job[payArgs]) error
}

func (w *funcWorker) Work(ctx context.Context, job *river.Job[payArgs]) error { return w.fn(ctx, job) }

// startClient starts a River client in the test's process that works pay
// jobs with fn under the env's Fence, and stops it when the test ends.
func (e *env) startClient(t *testing.T, fn func(ctx context.Context, job *river.Job[payArgs]) error) {
	t.Helper()
	workers := river.NewWorkers()
	river.AddWorker(workers, &funcWorker{fn: fn})
	client, err := river.NewClient(riverpgxv5.New(e.Pool), &river.Config{
		Queues:            map[string]river.QueueConfig{river.QueueDefault: {MaxWorkers: 1}},
		Workers:           workers,
		Middleware:        []rivertype.Middleware{e.fence},
		FetchPollInterval: 20 * time.Millisecond,
		FetchCooldown:     5 * time.Millisecond,
		JobTimeout:        -1,
		Logger:            quietLogger(),
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := client.Start(testkit.Context(t)); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if err := client.Stop(ctx); err != nil {
			t.Errorf("stop the client: %v", err)
		}
	})
}

// TestTokensGrowWhenRiverRepeatsTheAttempt: a snooze hands River's attempt
// number back, so the job's next run has the same number again; each run
// still gets a token greater than the one before, which is why the
// attempt number is not the token.
func TestTokensGrowWhenRiverRepeatsTheAttempt(t *testing.T) {
	e := newEnv(t)
	type run struct {
		attempt int
		token   fence.Token
	}
	var (
		mu   sync.Mutex
		runs []run
	)
	e.startClient(t, func(ctx context.Context, job *river.Job[payArgs]) error {
		a, _ := riverfence.AttemptFrom(ctx)
		tok, _ := fence.FromContext(ctx)
		mu.Lock()
		defer mu.Unlock()
		if tok != a.Token {
			t.Errorf("the context's token %d is not the attempt's %d", tok, a.Token)
		}
		runs = append(runs, run{job.Attempt, a.Token})
		if len(runs) < 3 {
			return river.JobSnooze(time.Millisecond)
		}
		return nil
	})
	id := e.insertPay(t, 1)
	e.waitJob(t, id, time.Minute, "completed", func(r jobRow) bool { return r.State == "completed" })
	mu.Lock()
	defer mu.Unlock()
	if len(runs) != 3 {
		t.Fatalf("runs = %+v; want 3", runs)
	}
	for i, r := range runs {
		if r.attempt != 1 {
			t.Errorf("run %d: River's attempt %d; want 1 (a snooze hands the number back)", i, r.attempt)
		}
		if i > 0 && r.token <= runs[i-1].token {
			t.Errorf("run %d: token %d is not above the run before's %d", i, r.token, runs[i-1].token)
		}
	}
	if j := e.job(t, id); j.Reported == nil || fence.Token(*j.Reported) != runs[2].token {
		t.Errorf("job = %+v; want its report tagged with the last run's token %d", j, runs[2].token)
	}
}

// TestContextEndsWhenSuperseded: a later claim on the job's resource (here
// a greater token advanced by hand) supersedes the running attempt; its
// context ends with a *SupersededError naming both tokens, and its
// completion is refused as stale, having written nothing.
func TestContextEndsWhenSuperseded(t *testing.T) {
	e := newEnv(t)
	guard, err := sqlguard.New()
	if err != nil {
		t.Fatal(err)
	}
	type result struct {
		cause    error
		complete error
	}
	done := make(chan result, 1)
	e.startClient(t, func(ctx context.Context, job *river.Job[payArgs]) error {
		if job.Attempt > 1 {
			return nil // River's retry of the superseded attempt
		}
		a, _ := riverfence.AttemptFrom(ctx)
		if err := guard.BeginFunc(ctx, e.Pool, a.Resource, a.Token+1000, func(pgx.Tx) error { return nil }); err != nil {
			t.Errorf("advance the job's resource past the attempt: %v", err)
		}
		<-ctx.Done()
		_, cerr := riverfence.Complete(context.WithoutCancel(ctx), job, func(ctx context.Context, tx pgx.Tx) error {
			_, err := tx.Exec(ctx, `UPDATE accounts SET balance = balance + 1`)
			return err
		})
		done <- result{context.Cause(ctx), cerr}
		return nil
	})
	id := e.insertPay(t, 1)
	var r result
	select {
	case r = <-done:
	case <-time.After(time.Minute):
		t.Fatal("the attempt's context never ended")
	}
	var sup *riverfence.SupersededError
	if !errors.As(r.cause, &sup) || sup.JobID != id || sup.Current != sup.Token+1000 {
		t.Fatalf("cause = %v; want a *SupersededError of job %d naming the newer token", r.cause, id)
	}
	if se, ok := fence.AsStale(r.complete); !ok || se.Presented != sup.Token || se.Current != sup.Token+1000 {
		t.Errorf("Complete = %v; want stale, presented %d, current %d", r.complete, sup.Token, sup.Token+1000)
	}
	if ef := e.effects(t, id); ef.balance != 0 {
		t.Errorf("balance = %d; want 0: the refused completion wrote nothing", ef.balance)
	}
	// River records the attempt's outcome: the middleware reported it
	// superseded, never a success.
	j := e.waitJob(t, id, time.Minute, "failed", func(r jobRow) bool { return r.State != "running" })
	if j.State == "completed" {
		t.Errorf("job = %+v; a superseded attempt was recorded as a success", j)
	}
}

// TestCompleteNeedsTheMiddleware: Complete outside a fenced attempt is a
// setup problem naming the fix, before any I/O.
func TestCompleteNeedsTheMiddleware(t *testing.T) {
	job := &river.Job[payArgs]{JobRow: &rivertype.JobRow{ID: 1, State: rivertype.JobStateRunning}}
	_, err := riverfence.Complete(context.Background(), job, nil)
	if !errors.Is(err, riverfence.ErrNoAttempt) || !errors.Is(err, fence.ErrSetup) || !strings.Contains(err.Error(), "Middleware") {
		t.Fatalf("Complete = %v; want ErrNoAttempt, a setup error naming the middleware", err)
	}
	if _, err := riverfence.CompleteTx(context.Background(), nil, job); !errors.Is(err, riverfence.ErrNoAttempt) {
		t.Fatalf("CompleteTx = %v; want ErrNoAttempt", err)
	}
}

// TestNewRefusesBadOptions: every problem at once, before any I/O.
func TestNewRefusesBadOptions(t *testing.T) {
	_, err := riverfence.New(nil, riverfence.WithSchema("a\x00b"), riverfence.WithRiverSchema(""),
		riverfence.WithPrefix(""), riverfence.WithWatchInterval(time.Millisecond))
	for _, want := range []string{"nil database", "schema", "empty resource prefix", "watch interval 1ms"} {
		if !errors.Is(err, fence.ErrInvalidArgument) || !strings.Contains(err.Error(), want) {
			t.Errorf("New = %v; want fence.ErrInvalidArgument naming %q", err, want)
		}
	}
	var pool *pgxpool.Pool
	if _, err := riverfence.New(pool); !errors.Is(err, fence.ErrInvalidArgument) {
		t.Errorf("New(typed nil) = %v; want fence.ErrInvalidArgument", err)
	}
}

// TestResourceNames: a job's resource is the prefix and its id; a River
// schema gets a prefix of its own unless one is given.
func TestResourceNames(t *testing.T) {
	pool := &pgxpool.Pool{} // no I/O: New does none
	for _, tc := range []struct {
		opts []riverfence.Option
		want string
	}{
		{nil, "river/job/42"},
		{[]riverfence.Option{riverfence.WithRiverSchema("jobs")}, "river/jobs/job/42"},
		{[]riverfence.Option{riverfence.WithRiverSchema("jobs"), riverfence.WithPrefix("billing/")}, "billing/42"},
	} {
		f, err := riverfence.New(pool, tc.opts...)
		if err != nil {
			t.Fatal(err)
		}
		if got := f.Resource(42); got != tc.want {
			t.Errorf("Resource(42) = %q; want %q", got, tc.want)
		}
	}
}

// TestCheckNamesTheFix: Check reports a missing trigger and missing River
// tables as setup problems naming the fix, and nothing once set up.
func TestCheckNamesTheFix(t *testing.T) {
	e := newEnv(t)
	ctx := testkit.Context(t)
	if err := e.fence.Check(ctx); err != nil {
		t.Fatalf("Check on a set-up schema = %v", err)
	}
	if _, err := e.Pool.Exec(ctx, `DROP TRIGGER fencekit_river_attempt_fence ON river_job`); err != nil {
		t.Fatal(err)
	}
	if err := e.fence.Check(ctx); !errors.Is(err, fence.ErrSetup) || !strings.Contains(err.Error(), "Fence.Install") {
		t.Errorf("Check without the trigger = %v; want a setup error naming Fence.Install", err)
	}
	if err := e.fence.Install(ctx); err != nil {
		t.Fatal(err)
	}
	if err := e.fence.Install(ctx); err != nil {
		t.Fatalf("Install again: %v", err)
	}
	if err := e.fence.Check(ctx); err != nil {
		t.Errorf("Check after Install = %v", err)
	}
	other := newFence(t, e.Pool, riverfence.WithRiverSchema("no_such_schema"))
	if err := other.Check(ctx); !errors.Is(err, fence.ErrNoTable) || !strings.Contains(err.Error(), "River's migrations") {
		t.Errorf("Check without River's tables = %v; want fence.ErrNoTable naming River's migrations", err)
	}
}
