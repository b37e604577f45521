package bench

import (
	"context"
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"
	"github.com/riverqueue/river/rivermigrate"
	"github.com/riverqueue/river/rivertype"

	"github.com/fencekit/fencekit/riverfence"
)

// BenchmarkRiverPaired is the per-job cost of fencing a River job
// (riverfence) against the same job in plain River, on one PostgreSQL, in
// alternating batches of riverBatch jobs, each batch timed from its insert
// to its last completion event. Each side has a schema of its own (River's
// tables, fencekit's, a counters table) and one started River client with
// riverWorkers workers.
//
// The job adds 1 to one of 64 counter rows and completes in the same
// transaction: plain, pgx.BeginFunc with the UPDATE and River's
// JobCompleteTx; fenced, the Fence as middleware (the claim of the
// attempt's token: one transaction, two round trips) and riverfence.Complete
// (BEGIN and the advance of the job's resource in one round trip, the
// UPDATE, JobCompleteTx and its check, COMMIT), with the trigger on
// river_job installed.
//
// jobs/s is the fenced side's throughput, plain-jobs/s the plain side's,
// plain-ratio fenced time over plain time, and over-plain-us/job the
// difference per job.
//
// commit=sync is PostgreSQL's default; under commit=async both sides'
// connections have synchronous_commit off, so that no commit waits for the
// disk: what is left is CPU and round trips. The fenced job has one commit
// more than the plain one (its claim), which is most of its cost where
// commits wait for a WAL flush.
func BenchmarkRiverPaired(b *testing.B) {
	for _, commit := range []string{"sync", "async"} {
		b.Run("commit="+commit, func(b *testing.B) {
			plain := newRiverSide(b, false, commit == "async")
			fenced := newRiverSide(b, true, commit == "async")
			b.ResetTimer()
			var plainT, fencedT time.Duration
			for n, round := 0, 0; n < b.N; round++ {
				k := min(riverBatch, b.N-n)
				if round%2 == 0 {
					plainT += plain.run(b, k)
					fencedT += fenced.run(b, k)
				} else {
					fencedT += fenced.run(b, k)
					plainT += plain.run(b, k)
				}
				n += k
			}
			b.StopTimer()
			b.ReportMetric(float64(b.N)/fencedT.Seconds(), "jobs/s")
			b.ReportMetric(float64(b.N)/plainT.Seconds(), "plain-jobs/s")
			b.ReportMetric(float64(fencedT)/float64(plainT), "plain-ratio")
			b.ReportMetric(float64((fencedT-plainT).Microseconds())/float64(b.N), "over-plain-us/job")
			b.ReportMetric(0, "ns/op") // the batches are timed, not the loop
		})
	}
}

const (
	riverBatch   = 100
	riverWorkers = 10
)

type countArgs struct {
	Counter int `json:"counter"`
}

func (countArgs) Kind() string { return "count" }

type countWorker struct {
	river.WorkerDefaults[countArgs]
	pool   *pgxpool.Pool
	fenced bool
}

const countSQL = `UPDATE counters SET n = n + 1 WHERE id = $1`

func (w *countWorker) Work(ctx context.Context, job *river.Job[countArgs]) error {
	if w.fenced {
		_, err := riverfence.Complete(ctx, job, func(ctx context.Context, tx pgx.Tx) error {
			_, err := tx.Exec(ctx, countSQL, job.Args.Counter)
			return err
		})
		return err
	}
	return pgx.BeginFunc(ctx, w.pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, countSQL, job.Args.Counter); err != nil {
			return err
		}
		_, err := river.JobCompleteTx[*riverpgxv5.Driver](ctx, tx, job)
		return err
	})
}

// riverSide is one side of the pair: a schema, a started client, and its
// completion events.
type riverSide struct {
	client *river.Client[pgx.Tx]
	done   <-chan *river.Event
	next   int
}

func newRiverSide(b *testing.B, fenced, async bool) *riverSide {
	b.Helper()
	ctx := context.Background()
	small := pgSchema(b)
	cfg := small.Config()
	cfg.MaxConns = 2*riverWorkers + 4
	if async {
		cfg.ConnConfig.RuntimeParams["synchronous_commit"] = "off"
	}
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(pool.Close)
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	migrator, err := rivermigrate.New(riverpgxv5.New(pool), &rivermigrate.Config{Logger: quiet})
	if err != nil {
		b.Fatal(err)
	}
	if _, err := migrator.Migrate(ctx, rivermigrate.DirectionUp, nil); err != nil {
		b.Fatalf("River's migrations: %v", err)
	}
	if _, err := pool.Exec(ctx, `CREATE TABLE counters (id int PRIMARY KEY, n bigint NOT NULL);
		INSERT INTO counters SELECT g, 0 FROM generate_series(0, 63) AS g`); err != nil {
		b.Fatal(err)
	}
	var middleware []rivertype.Middleware
	if fenced {
		f, err := riverfence.New(pool)
		if err != nil {
			b.Fatal(err)
		}
		if err := f.Install(ctx); err != nil {
			b.Fatal(err)
		}
		middleware = append(middleware, f)
	}
	workers := river.NewWorkers()
	river.AddWorker(workers, &countWorker{pool: pool, fenced: fenced})
	client, err := river.NewClient(riverpgxv5.New(pool), &river.Config{
		Queues:        map[string]river.QueueConfig{river.QueueDefault: {MaxWorkers: riverWorkers}},
		Workers:       workers,
		Middleware:    middleware,
		FetchCooldown: river.FetchCooldownMin,
		Logger:        quiet,
	})
	if err != nil {
		b.Fatal(err)
	}
	done, cancel := client.Subscribe(river.EventKindJobCompleted, river.EventKindJobFailed)
	if err := client.Start(ctx); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() {
		cancel()
		ctx, stop := context.WithTimeout(context.Background(), time.Minute)
		defer stop()
		if err := client.Stop(ctx); err != nil {
			b.Errorf("stop River: %v", err)
		}
	})
	return &riverSide{client: client, done: done}
}

// run inserts k jobs and waits for their k completions; it returns the
// time it took.
func (s *riverSide) run(b *testing.B, k int) time.Duration {
	ctx := context.Background()
	params := make([]river.InsertManyParams, k)
	for i := range params {
		params[i] = river.InsertManyParams{Args: countArgs{Counter: s.next % 64}}
		s.next++
	}
	t0 := time.Now()
	if _, err := s.client.InsertMany(ctx, params); err != nil {
		b.Fatal(err)
	}
	timeout := time.After(time.Minute)
	for got := 0; got < k; {
		select {
		case e := <-s.done:
			if e.Kind != river.EventKindJobCompleted {
				b.Fatalf("job %d: %s: %v", e.Job.ID, e.Kind, e.Job.Errors)
			}
			got++
		case <-timeout:
			b.Fatalf("%d of %d jobs completed within a minute", got, k)
		}
	}
	return time.Since(t0)
}
