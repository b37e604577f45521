package sqlguard_test

import (
	"context"
	"errors"
	"github.com/fencekit/fencekit/fence"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/fencekit/fencekit/lease"
	"github.com/fencekit/fencekit/lease/memlease"
	"github.com/fencekit/fencekit/migrations"
	"github.com/fencekit/fencekit/sqlguard"
)

// Two jobs share a ledger table and a run key ("2026-12-01"): each runs
// once. On the toolkit's table (migration 00006) both run; on a table of
// the old shape (keyed by run_key alone) neither runs and both are told
// the fix, so that no job is ever skipped with ran == false and no error.
// On the old code the old-shaped table ran the first job and skipped the
// second (ran false, err nil).
func TestRunOnceKeepsJobsApart(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name  string
		ddl   string // creates the ledger table "runs", or "" for the toolkit's
		table string
	}{
		{name: "toolkit table", table: sqlguard.LedgerTable},
		{name: "old-shaped table", table: "runs",
			ddl: `CREATE TABLE runs (run_key text PRIMARY KEY, done_at timestamptz, lock_version bigint NOT NULL DEFAULT 0)`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			e := newEnv(t)
			ctx := context.Background()
			if tc.ddl != "" {
				e.exec(t, tc.ddl)
			}
			lg, err := sqlguard.NewLedger(e.Pool, "", tc.table)
			if err != nil {
				t.Fatal(err)
			}
			m, err := lease.NewManager(memlease.New(), 10*time.Second)
			if err != nil {
				t.Fatal(err)
			}
			const night = "2026-12-01"
			runs := map[string]int{}
			for _, job := range []string{"settle-orders", "send-reminders", "settle-orders", "send-reminders"} {
				ran, err := m.RunOnce(ctx, job, night, lg, func(context.Context, *lease.Lease) error {
					runs[job]++
					return nil
				})
				switch {
				case tc.ddl == "" && err != nil:
					t.Errorf("RunOnce(%s, %s) = %v, %v; want it run (or done) on the toolkit's table", job, night, ran, err)
				case tc.ddl != "" && (err == nil || ran || !errors.Is(err, lease.ErrSetup) || !errors.Is(err, fence.ErrLedgerTable)):
					t.Errorf("RunOnce(%s, %s) on a table keyed by run_key alone = ran %v, err %v; want a setup error naming the migration, nothing run", job, night, ran, err)
				case tc.ddl != "" && !strings.Contains(err.Error(), "fencekit migrate up") || tc.ddl != "" && !strings.Contains(err.Error(), "00006"):
					t.Errorf("the setup error does not name the migration to run: %v", err)
				}
			}
			want := map[string]int{"settle-orders": 1, "send-reminders": 1}
			if tc.ddl != "" {
				want = map[string]int{}
			}
			if len(runs) != len(want) || runs["settle-orders"] != want["settle-orders"] || runs["send-reminders"] != want["send-reminders"] {
				t.Fatalf("runs = %v; want %v", runs, want)
			}
			if tc.ddl == "" {
				// Each job's run is a row of its own, fenced by its own token.
				if n := e.int64Query(t, `SELECT count(*) FROM `+sqlguard.LedgerTable+` WHERE run_key = $1 AND done_at IS NOT NULL`, night); n != 2 {
					t.Fatalf("%d runs of %s recorded done; want 2", n, night)
				}
			} else if n := e.int64Query(t, `SELECT count(*) FROM runs`); n != 0 {
				t.Fatalf("the refused ledger wrote %d rows", n)
			}
		})
	}
}

// A table that cannot keep jobs apart is refused before anything is
// written, with an error that matches lease.ErrSetup and says what to do;
// once the table is fixed, the same Ledger uses it. A schema without the
// toolkit's table is told to run the migrations.
func TestLedgerRefusesATableThatMixesJobs(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := context.Background()
	if sqlguard.LedgerTable != migrations.LedgerTable {
		t.Fatalf("sqlguard.LedgerTable %q, migrations.LedgerTable %q", sqlguard.LedgerTable, migrations.LedgerTable)
	}
	for i, c := range []struct {
		ddl, fix, says string
	}{
		{`(run_key text PRIMARY KEY, done_at timestamptz, lock_version bigint NOT NULL DEFAULT 0)`,
			`ADD COLUMN job text NOT NULL DEFAULT 'nightly', DROP CONSTRAINT %s_pkey, ADD PRIMARY KEY (job, run_key)`, "no job column"},
		{`(job text NOT NULL, run_key text PRIMARY KEY, done_at timestamptz, lock_version bigint NOT NULL DEFAULT 0)`,
			`DROP CONSTRAINT %s_pkey, ADD PRIMARY KEY (job, run_key)`, "unique keys without job"},
		{`(job text NOT NULL, run_key text NOT NULL, done_at timestamptz, lock_version bigint NOT NULL DEFAULT 0, PRIMARY KEY (job, run_key), UNIQUE (run_key))`,
			`DROP CONSTRAINT %s_run_key_key`, "unique keys without job"},
		{`(job text NOT NULL, run_key text NOT NULL, done_at timestamptz, lock_version bigint NOT NULL DEFAULT 0)`,
			`ADD PRIMARY KEY (job, run_key)`, "no unique key"},
	} {
		name := "runs_" + string(rune('a'+i))
		e.exec(t, `CREATE TABLE `+name+` `+c.ddl)
		lg, err := sqlguard.NewLedger(e.Pool, e.Schema, name)
		if err != nil {
			t.Fatal(err)
		}
		done, err := lg.Claim(ctx, "nightly", "night-1", 5)
		if done || !errors.Is(err, fence.ErrLedgerTable) || !errors.Is(err, lease.ErrSetup) ||
			!strings.Contains(err.Error(), c.says) || !strings.Contains(err.Error(), "fencekit migrate up --schema") {
			t.Errorf("%s: Claim = %v, %v; want ErrLedgerTable and lease.ErrSetup, saying %q and naming the migration", c.ddl, done, err, c.says)
		}
		if err := lg.MarkDone(ctx, "nightly", "night-1", 5); !errors.Is(err, fence.ErrLedgerTable) {
			t.Errorf("%s: MarkDone = %v; want ErrLedgerTable", c.ddl, err)
		}
		if n := e.int64Query(t, `SELECT count(*) FROM `+name); n != 0 {
			t.Errorf("%s: the refused ledger wrote %d rows", c.ddl, n)
		}
		e.exec(t, `ALTER TABLE `+name+` `+strings.ReplaceAll(c.fix, "%s", name))
		if done, err := lg.Claim(ctx, "nightly", "night-1", 5); done || err != nil {
			t.Errorf("%s, fixed: Claim = %v, %v; want a claim of a run not done", c.ddl, done, err)
		}
		if done, err := lg.Claim(ctx, "reports", "night-1", 1); done || err != nil {
			t.Errorf("%s, fixed: another job's Claim of the same key = %v, %v; want its own run, not done", c.ddl, done, err)
		}
	}

	// A schema where the migrations did not run.
	other := e.Schema + "_bare"
	e.exec(t, `CREATE SCHEMA `+pgx.Identifier{other}.Sanitize())
	t.Cleanup(func() { e.exec(t, `DROP SCHEMA `+pgx.Identifier{other}.Sanitize()+` CASCADE`) })
	lg, err := sqlguard.NewLedger(e.Pool, other, sqlguard.LedgerTable)
	if err != nil {
		t.Fatal(err)
	}
	_, err = lg.Claim(ctx, "nightly", "night-1", 5)
	if !errors.Is(err, fence.ErrNotMigrated) || !errors.Is(err, lease.ErrSetup) || !strings.Contains(err.Error(), "fencekit migrate up --schema") {
		t.Fatalf("Claim without the toolkit's table = %v; want ErrNotMigrated and lease.ErrSetup, naming the command", err)
	}
}
