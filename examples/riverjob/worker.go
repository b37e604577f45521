package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"
	"github.com/riverqueue/river/rivertype"

	"github.com/fencekit/fencekit/examples/internal/demo"
	"github.com/fencekit/fencekit/fence"
	"github.com/fencekit/fencekit/riverfence"
	"github.com/fencekit/fencekit/sqlguard"
)

// configVar carries a worker's configuration (demo.StartChild).
const configVar = "RIVERJOB_WORKER"

// workerConfig is what a worker process needs.
type workerConfig struct {
	Role        string        `json:"role"` // A or B
	PostgresURL string        `json:"postgres_url"`
	Schema      string        `json:"schema"`
	Unfenced    bool          `json:"unfenced"`
	WriteDelay  time.Duration `json:"write_delay"`
}

// payArgs are the job's arguments: pay Amount into account 1, once.
type payArgs struct {
	Amount int `json:"amount"`
}

func (payArgs) Kind() string { return "pay" }

// Kinds of events.
const (
	evStarted  = "started"
	evClaimed  = "claimed"  // the attempt began (with its token, when fenced)
	evWrite    = "write"    // the progress write, with the store's answer
	evComplete = "complete" // the payment and the completion, with the answer
	evContext  = "context"  // whether the attempt's context ended as superseded
	evFailed   = "failed"   // the worker could not run
)

// event is one line a worker reports (and the orchestrator adds its own).
type event struct {
	At         time.Time   `json:"at"`
	Role       string      `json:"role"`
	Kind       string      `json:"kind"`
	Attempt    int         `json:"attempt,omitempty"`
	Token      fence.Token `json:"token,omitempty"`
	Accepted   bool        `json:"accepted"`
	Stale      bool        `json:"stale,omitempty"`
	Current    fence.Token `json:"current,omitempty"`
	Superseded bool        `json:"superseded,omitempty"`
	Text       string      `json:"text"`
}

// payWorker runs the pay job.
type payWorker struct {
	river.WorkerDefaults[payArgs]
	cfg   workerConfig
	out   *demo.Reporter
	pool  *pgxpool.Pool
	table *sqlguard.Table
	done  chan struct{}
}

func (w *payWorker) say(e event) {
	e.At, e.Role = time.Now(), w.cfg.Role
	w.out.Report(e)
}

// answer is the event of a write that returned err.
func answer(kind string, err error, what string) event {
	e := event{Kind: kind, Accepted: err == nil, Text: what + ": accepted"}
	if se, ok := fence.AsStale(err); ok {
		e.Stale, e.Current = true, se.Current
		e.Text = fmt.Sprintf("%s: REFUSED as stale (presented %d, current %d)", what, se.Presented, se.Current)
	} else if err != nil {
		e.Text = fmt.Sprintf("%s: failed: %v", what, err)
	}
	return e
}

func (w *payWorker) Work(ctx context.Context, job *river.Job[payArgs]) error {
	defer close(w.done)
	a, fenced := riverfence.AttemptFrom(ctx)
	text := fmt.Sprintf("fetched job %d, attempt %d", job.ID, job.Attempt)
	if fenced {
		text += fmt.Sprintf(", fencing token %d", a.Token)
	}
	w.say(event{Kind: evClaimed, Attempt: job.Attempt, Token: a.Token, Text: text})
	if job.Attempt == 1 {
		time.Sleep(w.cfg.WriteDelay) // the orchestrator freezes A here
	}
	// Like a job stuck in a call that ignores its context, this one does
	// not look at it: its writes go on after its attempt has ended, and
	// only the stores can refuse them. The token goes with the values.
	wctx := context.WithoutCancel(ctx)
	status := "paid by " + w.cfg.Role
	var err error
	if fenced {
		err = w.table.Update(wctx, w.pool, []any{job.ID}, a.Token, sqlguard.Col("status", status))
	} else {
		_, err = w.pool.Exec(wctx, `UPDATE payments SET status = $2 WHERE job_id = $1`, job.ID, status)
	}
	w.say(answer(evWrite, err, "progress write on the payment row"))
	pay := func(ctx context.Context, tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `INSERT INTO ledger (job_id, worker, attempt, token) VALUES ($1, $2, $3, $4)`,
			job.ID, w.cfg.Role, job.Attempt, int64(a.Token)); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, `UPDATE accounts SET balance = balance + $1 WHERE id = 1`, job.Args.Amount)
		return err
	}
	var cerr error
	if fenced {
		_, cerr = riverfence.Complete(wctx, job, pay)
	} else {
		cerr = pgx.BeginFunc(wctx, w.pool, func(tx pgx.Tx) error {
			if err := pay(wctx, tx); err != nil {
				return err
			}
			_, err := river.JobCompleteTx[*riverpgxv5.Driver](wctx, tx, job)
			return err
		})
	}
	w.say(answer(evComplete, cerr, fmt.Sprintf("pay %d and complete the job", job.Args.Amount)))
	if fenced {
		sup := errors.Is(context.Cause(ctx), riverfence.ErrSuperseded)
		text := "its context is live"
		if sup {
			text = "its context has ended: " + context.Cause(ctx).Error()
		}
		w.say(event{Kind: evContext, Superseded: sup, Text: text})
	}
	return errors.Join(err, cerr)
}

// runWorker is the worker subcommand: a River client that works one pay
// job and exits.
func runWorker() int {
	w := &payWorker{out: demo.NewReporter(os.Stdout), done: make(chan struct{})}
	fail := func(err error) int {
		w.say(event{Kind: evFailed, Text: err.Error()})
		return 2
	}
	if err := demo.ReadChildConfig(configVar, &w.cfg); err != nil {
		return fail(err)
	}
	ctx := context.Background()
	// The job's own statements name its tables unqualified: the pool's
	// search_path is the run's schema. River and the Fence are told the
	// schema as well.
	pcfg, err := pgxpool.ParseConfig(w.cfg.PostgresURL)
	if err != nil {
		return fail(err)
	}
	pcfg.ConnConfig.RuntimeParams["search_path"] = w.cfg.Schema
	pool, err := pgxpool.NewWithConfig(ctx, pcfg)
	if err != nil {
		return fail(err)
	}
	defer pool.Close()
	w.pool = pool
	if w.table, err = sqlguard.NewTable(w.cfg.Schema, "payments", "job_id"); err != nil {
		return fail(err)
	}
	var middleware []rivertype.Middleware
	if !w.cfg.Unfenced {
		f, err := riverfence.New(pool, riverfence.WithSchema(w.cfg.Schema), riverfence.WithRiverSchema(w.cfg.Schema),
			riverfence.WithWatchInterval(100*time.Millisecond))
		if err != nil {
			return fail(err)
		}
		middleware = append(middleware, f)
	}
	workers := river.NewWorkers()
	river.AddWorker(workers, w)
	client, err := river.NewClient(riverpgxv5.New(pool), &river.Config{
		Schema:                 w.cfg.Schema,
		Queues:                 map[string]river.QueueConfig{river.QueueDefault: {MaxWorkers: 1}},
		Workers:                workers,
		Middleware:             middleware,
		LeaderElectionDisabled: true, // the orchestrator's client leads and rescues
		FetchPollInterval:      100 * time.Millisecond,
		JobTimeout:             -1,
		Logger:                 slog.New(slog.NewTextHandler(io.Discard, nil)),
	})
	if err != nil {
		return fail(err)
	}
	if err := client.Start(ctx); err != nil {
		return fail(err)
	}
	w.say(event{Kind: evStarted, Text: "River client started; waiting for a job"})
	<-w.done
	stop, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if err := client.Stop(stop); err != nil { // waits for River to record the outcome
		return fail(err)
	}
	return 0
}
