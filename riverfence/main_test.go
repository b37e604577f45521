package riverfence_test

import (
	"context"
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"
	"github.com/riverqueue/river/rivermigrate"
	"go.uber.org/goleak"

	"github.com/fencekit/fencekit/internal/testkit"
	"github.com/fencekit/fencekit/migrations/migrationstest"
	"github.com/fencekit/fencekit/riverfence"
)

func TestMain(m *testing.M) {
	testkit.ChildMain(workerVar, runWorker)
	goleak.VerifyTestMain(m)
}

// env is one test's throwaway schema (migrationstest.Env), holding River's
// tables (rivermigrate), fencekit's (migrations.Up), the trigger of
// riverfence.Install and the job's own tables (payTables), with a pool
// whose search_path is the schema.
type env struct {
	*migrationstest.Env
	fence *riverfence.Fence
}

// newEnv sets up a schema for one test; it is dropped when the test ends.
func newEnv(tb testing.TB) *env {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	// River names its notification channels after the schema, within
	// PostgreSQL's 63 bytes: a name shorter than testkit.UniqueName's.
	name := testkit.UniqueName(tb, "")
	e := &env{Env: migrationstest.New(tb, "rf_"+name[max(0, len(name)-33):])}

	migrator, err := rivermigrate.New(riverpgxv5.New(e.Pool), &rivermigrate.Config{Logger: quietLogger()})
	if err != nil {
		tb.Fatal(err)
	}
	if _, err := migrator.Migrate(ctx, rivermigrate.DirectionUp, nil); err != nil {
		tb.Fatalf("River's migrations: %v", err)
	}
	if _, err := e.Pool.Exec(ctx, payTables); err != nil {
		tb.Fatalf("the job's tables: %v", err)
	}
	e.fence = newFence(tb, e.Pool)
	if err := e.fence.Install(ctx); err != nil {
		tb.Fatal(err)
	}
	return e
}

func newFence(tb testing.TB, pool *pgxpool.Pool, opts ...riverfence.Option) *riverfence.Fence {
	tb.Helper()
	f, err := riverfence.New(pool, append([]riverfence.Option{riverfence.WithWatchInterval(50 * time.Millisecond)}, opts...)...)
	if err != nil {
		tb.Fatal(err)
	}
	return f
}

// quietLogger drops River's logs below errors.
func quietLogger() *slog.Logger {
	return slog.New(slog.NewTextHandler(io.Discard, nil))
}

// insertPay inserts one pay job of amount and its payment row, and
// returns the job's id.
func (e *env) insertPay(tb testing.TB, amount int) int64 {
	tb.Helper()
	ctx := testkit.Context(tb)
	client, err := river.NewClient(riverpgxv5.New(e.Pool), &river.Config{Logger: quietLogger()})
	if err != nil {
		tb.Fatal(err)
	}
	res, err := client.Insert(ctx, payArgs{Amount: amount}, nil)
	if err != nil {
		tb.Fatalf("insert the job: %v", err)
	}
	if _, err := e.Pool.Exec(ctx, `INSERT INTO payments (job_id) VALUES ($1)`, res.Job.ID); err != nil {
		tb.Fatal(err)
	}
	return res.Job.ID
}

// jobRow is what a test reads of a job's row.
type jobRow struct {
	State    string
	Attempt  int
	Reported *int64 // the recorded report's token (riverfence.MetadataKey)
	Errors   int
}

func (e *env) job(tb testing.TB, id int64) jobRow {
	tb.Helper()
	var r jobRow
	err := e.Pool.QueryRow(testkit.Context(tb), `SELECT state::text, attempt,
		(metadata -> '`+riverfence.MetadataKey+`' ->> 'token')::bigint, coalesce(array_length(errors, 1), 0)
		FROM river_job WHERE id = $1`, id).Scan(&r.State, &r.Attempt, &r.Reported, &r.Errors)
	if err != nil {
		tb.Fatalf("read job %d: %v", id, err)
	}
	return r
}

// waitJob polls the job's row until ok holds, failing tb after timeout.
func (e *env) waitJob(tb testing.TB, id int64, timeout time.Duration, what string, ok func(jobRow) bool) jobRow {
	tb.Helper()
	deadline := time.Now().Add(timeout)
	for {
		r := e.job(tb, id)
		if ok(r) {
			return r
		}
		if time.Now().After(deadline) {
			tb.Fatalf("job %d: not %s within %v: %+v", id, what, timeout, r)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
