package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"
	"github.com/riverqueue/river/rivermigrate"
	"github.com/riverqueue/river/rivertype"

	"github.com/fencekit/fencekit/examples/internal/demo"
	"github.com/fencekit/fencekit/internal/rig/services"
	"github.com/fencekit/fencekit/riverfence"
)

// amount is what the job pays.
const amount = 100

// scenario is one run: its schema (demo.Stores) and the workers' config.
type scenario struct {
	cfg workerConfig
	*demo.Stores
	jobID int64
}

// setUp creates the run's schema with River's tables (rivermigrate),
// fencekit's (`fencekit migrate up`), the job's own, lock_version on the
// payments table, and the trigger of riverfence.Install; and inserts the
// job.
func setUp(ctx context.Context, svc *services.Set, o options) (*scenario, error) {
	schema := "riverjob_" + demo.RandomID()
	sc := &scenario{cfg: workerConfig{PostgresURL: svc.PostgresURL, Schema: schema, Unfenced: o.unfenced, WriteDelay: o.writeDelay}}
	var err error
	sc.Stores, err = demo.SetUpStores(ctx, demo.StoresConfig{
		PostgresURL: svc.PostgresURL, Schema: schema, PostgresStarted: svc.PostgresStarted,
		CreateTables: sc.createTables, FencedTables: []string{"payments"},
		// No lease: River's job row says which attempt is current. The
		// PostgreSQL lease store keeps nothing outside the schema.
		LeaseStore: demo.LeasePostgres,
	})
	if err != nil {
		return nil, err
	}
	if err := sc.prepare(ctx); err != nil {
		return nil, errors.Join(err, sc.Stores.TearDown())
	}
	return sc, nil
}

// createTables runs River's migrations in the schema and creates the
// job's tables.
func (sc *scenario) createTables(ctx context.Context, pool *pgxpool.Pool) error {
	migrator, err := rivermigrate.New(riverpgxv5.New(pool), &rivermigrate.Config{Schema: sc.cfg.Schema, Logger: quiet()})
	if err != nil {
		return err
	}
	if _, err := migrator.Migrate(ctx, rivermigrate.DirectionUp, nil); err != nil {
		return fmt.Errorf("migrating River's tables: %w", err)
	}
	s := pgx.Identifier{sc.cfg.Schema}.Sanitize()
	_, err = pool.Exec(ctx, `
CREATE TABLE `+s+`.payments (job_id bigint PRIMARY KEY, status text NOT NULL DEFAULT 'not paid');
CREATE TABLE `+s+`.ledger (job_id bigint NOT NULL, worker text NOT NULL, attempt int NOT NULL, token bigint NOT NULL,
    at timestamptz NOT NULL DEFAULT clock_timestamp());
CREATE TABLE `+s+`.accounts (id int PRIMARY KEY, balance int NOT NULL);
INSERT INTO `+s+`.accounts VALUES (1, 0);`)
	return err
}

// prepare installs riverfence's trigger (fenced runs) and inserts the job
// and its payment row.
func (sc *scenario) prepare(ctx context.Context) error {
	if !sc.cfg.Unfenced {
		f, err := riverfence.New(sc.Pool, riverfence.WithSchema(sc.cfg.Schema), riverfence.WithRiverSchema(sc.cfg.Schema))
		if err != nil {
			return err
		}
		if err := f.Install(ctx); err != nil {
			return err
		}
		if err := f.Check(ctx); err != nil {
			return err
		}
	}
	client, err := river.NewClient(riverpgxv5.New(sc.Pool), &river.Config{Schema: sc.cfg.Schema, Logger: quiet()})
	if err != nil {
		return err
	}
	res, err := client.Insert(ctx, payArgs{Amount: amount}, nil)
	if err != nil {
		return fmt.Errorf("insert the job: %w", err)
	}
	sc.jobID = res.Job.ID
	_, err = sc.Pool.Exec(ctx, `INSERT INTO `+pgx.Identifier{sc.cfg.Schema, "payments"}.Sanitize()+` (job_id) VALUES ($1)`, sc.jobID)
	return err
}

func (sc *scenario) tearDown(errOut io.Writer) {
	if err := sc.Stores.TearDown(); err != nil {
		fmt.Fprintf(errOut, "riverjob: cleaning up: %v\n", err)
	}
}

func (sc *scenario) keep(out io.Writer) {
	sc.Stores.Keep()
	fmt.Fprintf(out, "\nKept (--keep):\n  schema %s in %s\n", sc.cfg.Schema, services.Redact(sc.cfg.PostgresURL))
}

func quiet() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

// retryNow is a River retry policy that retries at once: the rescued job
// is run again as soon as River's scheduler makes it available.
type retryNow struct{}

func (retryNow) NextRetry(*rivertype.JobRow) time.Time { return time.Now() }

// run is one run's state while it plays.
type playRun struct {
	sc      *scenario
	tl      *demo.Timeline
	workers *demo.Group[event]
	sum     *summary
}

// play runs the timeline: A fetches the job and is frozen; River rescues
// it; B runs it to completion; A is resumed and goes on. Then it reads
// what the stores kept and judges the run.
func (sc *scenario) play(ctx context.Context, tl *demo.Timeline, o options) (*summary, error) {
	r := &playRun{sc: sc, tl: tl, workers: demo.NewGroup[event]("worker", configVar), sum: &summary{Unfenced: o.unfenced, Schema: sc.cfg.Schema, JobID: sc.jobID}}
	defer r.workers.Stop() // never leave a process behind, frozen or not
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute+4*o.rescueAfter)
	defer cancel()

	a, err := r.start(ctx, "A")
	if err != nil {
		return nil, err
	}
	ca, err := r.next(ctx, "A", evClaimed)
	if err != nil {
		return nil, err
	}
	r.sum.TokenA = ca.Token
	if err := a.Signal(syscall.SIGSTOP); err != nil {
		return nil, fmt.Errorf("SIGSTOP worker A: %w", err)
	}
	r.say("orchestrator", "froze worker A with SIGSTOP: its attempt is still running, as far as River can tell")

	leader, err := r.rescue(ctx, o.rescueAfter)
	if leader != nil {
		defer func() {
			stop, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
			defer cancel()
			_ = leader.Stop(stop)
		}()
	}
	if err != nil {
		return nil, err
	}

	if _, err := r.start(ctx, "B"); err != nil {
		return nil, err
	}
	cb, err := r.next(ctx, "B", evClaimed)
	if err != nil {
		return nil, err
	}
	r.sum.TokenB = cb.Token
	if err := r.exit(ctx, "B"); err != nil {
		return nil, err
	}
	if err := a.Signal(syscall.SIGCONT); err != nil {
		return nil, fmt.Errorf("SIGCONT worker A: %w", err)
	}
	r.say("orchestrator", "resumed worker A with SIGCONT: it goes on with the attempt River gave up on")
	if err := r.exit(ctx, "A"); err != nil {
		return nil, err
	}
	if err := sc.conclude(ctx, r.sum); err != nil {
		return nil, err
	}
	return r.sum, nil
}

// start starts worker role and waits until its River client runs.
func (r *playRun) start(ctx context.Context, role string) (*demo.Proc, error) {
	cfg := r.sc.cfg
	cfg.Role = role
	p, err := r.workers.Start(role, cfg)
	if err != nil {
		return nil, err
	}
	r.say("orchestrator", fmt.Sprintf("started worker %s (pid %d), a River client in its own process", role, p.Pid()))
	if _, err := r.next(ctx, role, evStarted); err != nil {
		return nil, err
	}
	return p, nil
}

// next prints the workers' events until role reports kind, and returns
// that event.
func (r *playRun) next(ctx context.Context, role, kind string) (event, error) {
	for {
		select {
		case e := <-r.workers.Events:
			r.record(e)
			if e.Kind == evFailed {
				return e, fmt.Errorf("worker %s: %s", e.Role, e.Text)
			}
			if e.Role == role && e.Kind == kind {
				return e, nil
			}
		case x := <-r.workers.Exits:
			r.workers.Exited(x)
			return event{}, fmt.Errorf("worker %s exited (%v) before %s %s", x.Name, x.Err, role, kind)
		case <-ctx.Done():
			return event{}, fmt.Errorf("waiting for %s %s: %w", role, kind, ctx.Err())
		}
	}
}

// exit prints the workers' events until role exits.
func (r *playRun) exit(ctx context.Context, role string) error {
	for {
		select {
		case e := <-r.workers.Events:
			r.record(e)
		case x := <-r.workers.Exits:
			r.workers.Exited(x)
			r.workers.Drain(r.record)
			if x.Err != nil {
				return fmt.Errorf("worker %s: %w", x.Name, x.Err)
			}
			if x.Name == role {
				return nil
			}
		case <-ctx.Done():
			return fmt.Errorf("waiting for worker %s to finish: %w", role, ctx.Err())
		}
	}
}

func (r *playRun) record(e event) {
	r.sum.Events = append(r.sum.Events, e)
	if e.Kind != evStarted {
		r.tl.Say(e.At, "worker "+e.Role, "%s", e.Text)
	}
}

func (r *playRun) say(who, text string) {
	e := event{At: time.Now(), Role: who, Kind: "note", Text: text}
	r.sum.Events = append(r.sum.Events, e)
	r.tl.Say(e.At, who, "%s", text)
}

// rescue waits until the job's attempt has run longer than rescueAfter by
// the database's clock (River's rule), then starts a River client in this
// process that leads: River's rescuer makes the stuck job retryable and
// its scheduler makes it available. It returns the client, to stop at the
// end.
func (r *playRun) rescue(ctx context.Context, rescueAfter time.Duration) (*river.Client[pgx.Tx], error) {
	job := pgx.Identifier{r.sc.cfg.Schema, "river_job"}.Sanitize()
	for {
		var stuck bool
		if err := r.sc.Pool.QueryRow(ctx, `SELECT now() - attempted_at > $2 FROM `+job+` WHERE id = $1`, r.sc.jobID, rescueAfter).Scan(&stuck); err != nil {
			return nil, err
		}
		if stuck {
			break
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
	}
	workers := river.NewWorkers()
	river.AddWorker(workers, &payWorker{}) // River judges a stuck job by its worker
	leader, err := river.NewClient(riverpgxv5.New(r.sc.Pool), &river.Config{
		Schema:               r.sc.cfg.Schema,
		Queues:               map[string]river.QueueConfig{"maintenance": {MaxWorkers: 1}},
		Workers:              workers,
		JobTimeout:           rescueAfter,
		RescueStuckJobsAfter: rescueAfter,
		RetryPolicy:          retryNow{},
		Logger:               quiet(),
	})
	if err != nil {
		return nil, err
	}
	if err := leader.Start(ctx); err != nil {
		return nil, err
	}
	r.say("orchestrator", fmt.Sprintf("A's attempt has run %v: started River's leader here; its rescuer looks for stuck jobs", rescueAfter))
	for seen := ""; ; {
		var state string
		if err := r.sc.Pool.QueryRow(ctx, `SELECT state::text FROM `+job+` WHERE id = $1`, r.sc.jobID).Scan(&state); err != nil {
			return leader, err
		}
		if state != seen && state != "running" {
			r.say("river", "the job is "+state+map[string]string{
				"retryable": " (rescued: River gave up on attempt 1)",
				"available": " (River's scheduler made it runnable again)",
			}[state])
			seen = state
		}
		if state == "available" {
			return leader, nil
		}
		select {
		case <-ctx.Done():
			return leader, ctx.Err()
		case <-time.After(20 * time.Millisecond):
		}
	}
}
