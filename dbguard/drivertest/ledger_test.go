package drivertest

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/fencekit/fencekit/dbguard"
	"github.com/fencekit/fencekit/fence"
	"github.com/fencekit/fencekit/guardtest"
	"github.com/fencekit/fencekit/internal/testkit"
	"github.com/fencekit/fencekit/lease"
	"github.com/fencekit/fencekit/lease/memlease"
)

// ledgerIn is a ledger with the database it writes to.
type ledgerIn struct {
	*dbguard.Ledger
	db *DB
}

// The ledger passes the ledger suite on both engines, each check with a
// database of its own; the done mark commits with the job's transaction.
func TestLedgerConformance(t *testing.T) {
	for _, d := range dialects {
		t.Run(d.String(), func(t *testing.T) {
			t.Parallel()
			guardtest.RunLedger(t, guardtest.LedgerConfig{
				NewLedger: func(t *testing.T) guardtest.Ledger {
					db := Open(t, d)
					lg, err := dbguard.NewLedger(d, db.SQL, "", dbguard.LedgerTable)
					if err != nil {
						t.Fatal(err)
					}
					return ledgerIn{lg, db}
				},
				MarkDoneWithJob: func(t *testing.T, ctx context.Context, l guardtest.Ledger, job, key string, token fence.Token, fail bool) error {
					in := l.(ledgerIn)
					in.db.Exec(t, `CREATE TABLE IF NOT EXISTS job_effects (run VARCHAR(100) PRIMARY KEY)`)
					tx, err := in.db.SQL.BeginTx(ctx, nil)
					if err != nil {
						return err
					}
					defer tx.Rollback() //nolint:errcheck
					if _, err := tx.ExecContext(ctx, `INSERT INTO job_effects VALUES (?)`, fmt.Sprint(key, fail)); err != nil {
						return err
					}
					if err := in.MarkDoneTx(ctx, tx, job, key, token); err != nil {
						return err
					}
					if fail {
						return errors.New("the job failed after its record")
					}
					return tx.Commit()
				},
			})
		})
	}
}

// RunOnce over a dbguard ledger runs each job once per run key, two jobs
// that share the ledger and the key included, on both engines.
func TestRunOnceWithTheLedger(t *testing.T) {
	for _, d := range dialects {
		t.Run(d.String(), func(t *testing.T) {
			t.Parallel()
			db := Open(t, d)
			ctx := testkit.Context(t)
			lg, err := dbguard.NewLedger(d, db.SQL, "", dbguard.LedgerTable)
			if err != nil {
				t.Fatal(err)
			}
			if err := lg.Check(ctx); err != nil {
				t.Fatalf("Ledger.Check on a migrated database = %v", err)
			}
			m := testkit.NewManager(t, memlease.New(), 10*time.Second)
			runs := map[string]int{}
			job := func(name string) func(context.Context, *lease.Lease) error {
				return func(context.Context, *lease.Lease) error { runs[name]++; return nil }
			}
			for range 3 { // three replicas, one after another
				for _, name := range []string{"settle orders", "reports"} {
					if _, err := m.RunOnce(ctx, name, "2026-12-01", lg, job(name)); err != nil {
						t.Fatalf("RunOnce(%q) = %v", name, err)
					}
				}
			}
			if runs["settle orders"] != 1 || runs["reports"] != 1 {
				t.Fatalf("runs = %v; want each job once", runs)
			}
		})
	}
}

// A table that cannot keep jobs apart, or whose done_at cannot record
// runs, is refused at the first claim and by Check, before anything is
// written, naming the fix; once fixed, the same Ledger claims.
func TestLedgerRefusesAnUnfitTable(t *testing.T) {
	for _, d := range dialects {
		t.Run(d.String(), func(t *testing.T) {
			t.Parallel()
			db := Open(t, d)
			ctx := testkit.Context(t)
			lv := lockVersionColumn(d)
			str := "VARCHAR(100)"
			for i, c := range []struct {
				ddl, says string
			}{
				{`(run_key ` + str + ` PRIMARY KEY, done_at ` + str + `, ` + lv + `)`,
					"no job column"},
				{`(job ` + str + ` NOT NULL, run_key ` + str + ` NOT NULL, done_at ` + str + `, ` + lv + `, PRIMARY KEY (job, run_key), UNIQUE (run_key))`,
					"unique key without job"},
				{`(job ` + str + ` NOT NULL, run_key ` + str + ` NOT NULL, done_at ` + str + `, ` + lv + `)`,
					"no unique key"},
				{`(job ` + str + ` NOT NULL, run_key ` + str + ` NOT NULL, done_at ` + str + ` NOT NULL, ` + lv + `, PRIMARY KEY (job, run_key))`,
					"NOT NULL"},
				{`(job ` + str + ` NOT NULL, run_key ` + str + ` NOT NULL, done_at ` + str + ` DEFAULT 'x', ` + lv + `, PRIMARY KEY (job, run_key))`,
					"default"},
			} {
				name := fmt.Sprintf("runs_%c", 'a'+i)
				db.Exec(t, `CREATE TABLE `+name+` `+c.ddl)
				lg, err := dbguard.NewLedger(d, db.SQL, "", name)
				if err != nil {
					t.Fatal(err)
				}
				done, err := lg.Claim(ctx, "nightly", "night-1", 5)
				if done {
					t.Errorf("%s: a refused claim says done", name)
				}
				guardtest.WantSetup(t, name+": Claim", err, []error{fence.ErrLedgerTable}, c.says, "fencekit migrate up --dialect "+d.String())
				guardtest.WantSetup(t, name+": Check", lg.Check(ctx), []error{fence.ErrLedgerTable}, c.says)
				var n int
				if err := db.SQL.QueryRowContext(ctx, `SELECT COUNT(*) FROM `+name).Scan(&n); err != nil || n != 0 {
					t.Errorf("%s: the refused ledger wrote %d rows (%v)", name, n, err)
				}
			}

			// The toolkit's table, not migrated.
			db.Exec(t, `DROP TABLE fencekit_job_runs`)
			lg, err := dbguard.NewLedger(d, db.SQL, "", dbguard.LedgerTable)
			if err != nil {
				t.Fatal(err)
			}
			_, err = lg.Claim(ctx, "nightly", "night-1", 5)
			guardtest.WantSetup(t, "Claim without the toolkit's table", err, []error{fence.ErrLedgerTable, fence.ErrNotMigrated}, "migration 00002")
			if err := lg.MarkDone(ctx, "nightly", "night-1", 5); !errors.Is(err, fence.ErrLedgerTable) {
				t.Errorf("MarkDone without the toolkit's table = %v", err)
			}
			// Migrated again, the same Ledger claims.
			db.Exec(t, `DELETE FROM fencekit_goose_version WHERE version_id = 2`)
			if _, err := db.SQL.ExecContext(ctx, migrationSQL(t, d)); err != nil {
				t.Fatal(err)
			}
			if done, err := lg.Claim(ctx, "nightly", "night-1", 5); done || err != nil {
				t.Errorf("Claim after the table was made = %v, %v", done, err)
			}
		})
	}
}

// migrationSQL is the Up section of the ledger's migration for d.
func migrationSQL(t *testing.T, d dbguard.Dialect) string {
	t.Helper()
	col := "job VARBINARY(512) NOT NULL, run_key VARBINARY(512) NOT NULL, done_at DATETIME(6) NULL, lock_version BIGINT UNSIGNED NOT NULL DEFAULT 0"
	if d == dbguard.SQLite {
		col = "job TEXT NOT NULL, run_key TEXT NOT NULL, done_at TEXT, lock_version INTEGER NOT NULL DEFAULT 0"
	}
	return `CREATE TABLE fencekit_job_runs (` + col + `, PRIMARY KEY (job, run_key))`
}
