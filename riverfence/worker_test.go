package riverfence_test

import (
	"bufio"
	"context"
	"errors"
	"log/slog"
	"os"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"
	"github.com/riverqueue/river/rivertype"

	"github.com/fencekit/fencekit/fence"
	"github.com/fencekit/fencekit/internal/testkit"
	"github.com/fencekit/fencekit/migrations/migrationstest"
	"github.com/fencekit/fencekit/riverfence"
	"github.com/fencekit/fencekit/sqlguard"
)

// The job the tests run: pay an amount once. Its effects are a progress
// write on the job's payment row (a sqlguard.Table write with the token),
// then, in Complete's fenced transaction with the job's completion, a
// ledger line and the account's balance.
const payTables = `
CREATE TABLE payments (
    job_id       bigint PRIMARY KEY,
    status       text   NOT NULL DEFAULT 'new',
    lock_version bigint NOT NULL DEFAULT 0 CHECK (lock_version >= 0)
);
CREATE TABLE ledger (
    job_id  bigint      NOT NULL,
    worker  text        NOT NULL,
    attempt int         NOT NULL,
    token   bigint      NOT NULL,
    at      timestamptz NOT NULL DEFAULT pg_catalog.clock_timestamp()
);
CREATE TABLE accounts (id int PRIMARY KEY, balance int NOT NULL);
INSERT INTO accounts VALUES (1, 0);`

type payArgs struct {
	Amount int `json:"amount"`
}

func (payArgs) Kind() string { return "pay" }

// workerVar carries a worker process's configuration (testkit.StartChild).
const workerVar = "RIVERFENCE_TEST_WORKER"

// event is one line a worker reports; the outcome of a write or a
// completion is in its testkit.Outcome.
type event struct {
	Who     string      `json:"who"`
	Kind    string      `json:"kind"` // started, claimed, write, complete, context, stopped
	Attempt int         `json:"attempt,omitempty"`
	Token   fence.Token `json:"token,omitempty"`
	testkit.Outcome
	Superseded bool `json:"superseded,omitempty"`
}

// payWorker is the pay job's worker.
type payWorker struct {
	river.WorkerDefaults[payArgs]
	name  string
	gate  string
	rep   *testkit.Reporter
	stdin *bufio.Reader
	db    riverfence.DB
	table *sqlguard.Table
	done  chan struct{}
}

func (w *payWorker) report(e event) {
	e.Who = w.name
	w.rep.Report(e)
}

// outcome is the event of a write or a completion that returned err.
func outcome(kind string, err error) event {
	return event{Kind: kind, Outcome: testkit.OutcomeOf(err)}
}

func (w *payWorker) wait(at string) {
	if w.gate == at {
		w.report(event{Kind: "waiting"})
		_, _ = w.stdin.ReadString('\n')
	}
}

func (w *payWorker) Work(ctx context.Context, job *river.Job[payArgs]) error {
	defer close(w.done)
	a, ok := riverfence.AttemptFrom(ctx)
	if !ok {
		return errors.New("no fenced attempt: the middleware did not run")
	}
	w.report(event{Kind: "claimed", Attempt: a.Number, Token: a.Token})
	w.wait("claimed")
	// This job does not watch its context, as stuck jobs do not: its
	// writes go on after the attempt's context has ended, and only the
	// stores can refuse them. The token travels with the context's values.
	wctx := context.WithoutCancel(ctx)
	err := w.table.Update(wctx, w.db, []any{job.ID}, a.Token, sqlguard.Col("status", "paid by "+w.name))
	w.report(outcome("write", err))
	w.wait("written")
	_, cerr := riverfence.Complete(wctx, job, func(ctx context.Context, tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `INSERT INTO ledger (job_id, worker, attempt, token) VALUES ($1, $2, $3, $4)`,
			job.ID, w.name, a.Number, int64(a.Token)); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, `UPDATE accounts SET balance = balance + $1 WHERE id = 1`, job.Args.Amount)
		return err
	})
	w.report(outcome("complete", cerr))
	w.report(event{Kind: "context", Superseded: errors.Is(context.Cause(ctx), riverfence.ErrSuperseded)})
	return errors.Join(err, cerr)
}

// runWorker is a worker process (testkit.ChildMain): it works one job
// and returns, or returns an error when it could not run.
func runWorker(cfg migrationstest.ChildConfig) error {
	ctx := context.Background()
	pool, err := migrationstest.OpenPool(ctx, cfg.URL, cfg.Schema)
	if err != nil {
		return err
	}
	defer pool.Close()
	f, err := riverfence.New(pool, riverfence.WithWatchInterval(50*time.Millisecond))
	if err != nil {
		return err
	}
	table, err := sqlguard.NewTable("", "payments", "job_id")
	if err != nil {
		return err
	}
	w := &payWorker{name: cfg.Name, gate: cfg.Gate, rep: testkit.NewReporter(os.Stdout), stdin: bufio.NewReader(os.Stdin),
		db: pool, table: table, done: make(chan struct{})}
	workers := river.NewWorkers()
	river.AddWorker(workers, w)
	client, err := river.NewClient(riverpgxv5.New(pool), &river.Config{
		Queues:                 map[string]river.QueueConfig{river.QueueDefault: {MaxWorkers: 1}},
		Workers:                workers,
		Middleware:             []rivertype.Middleware{f},
		LeaderElectionDisabled: true, // the test's own client rescues
		FetchPollInterval:      50 * time.Millisecond,
		FetchCooldown:          10 * time.Millisecond,
		JobTimeout:             -1, // no deadline: only a superseded attempt's context ends
		Logger:                 slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelError})),
	})
	if err != nil {
		return err
	}
	if err := client.Start(ctx); err != nil {
		return err
	}
	w.report(event{Kind: "started"})
	<-w.done
	// Stop waits for River to record the attempt's outcome.
	stopCtx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if err := client.Stop(stopCtx); err != nil {
		return err
	}
	w.report(event{Kind: "stopped"})
	return nil
}
