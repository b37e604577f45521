package sqlguard_test

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/fencekit/fencekit/fence"
	"github.com/fencekit/fencekit/guardtest"
	"github.com/fencekit/fencekit/lease"
	"github.com/fencekit/fencekit/sqlguard"
)

// The ledger's claim and record are fenced: a newer claim refuses an older
// holder's record, a record by the claimant is seen by the next claim, and
// a record commits with the job's own transaction or not at all.
func TestLedger(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := context.Background()
	lg, err := sqlguard.NewLedger(e.Pool, "", sqlguard.LedgerTable)
	if err != nil {
		t.Fatal(err)
	}
	if err := lg.MarkDone(ctx, "nightly", "night-1", 5); !errors.Is(err, fence.ErrNotFound) {
		t.Fatalf("MarkDone of an unclaimed run = %v, want ErrNotFound", err)
	}
	if done, err := lg.Claim(ctx, "nightly", "night-1", 5); done || err != nil {
		t.Fatalf("first claim: done %v, err %v", done, err)
	}
	if done, err := lg.Claim(ctx, "nightly", "night-1", 7); done || err != nil {
		t.Fatalf("newer claim: done %v, err %v", done, err)
	}
	err = lg.MarkDone(ctx, "nightly", "night-1", 5)
	if se, ok := fence.AsStale(err); !ok || se.Presented != 5 || se.Current != 7 {
		t.Fatalf("the older holder's record = %v, want stale (5 < 7)", err)
	}
	if _, err := lg.Claim(ctx, "nightly", "night-1", 6); !errors.Is(err, fence.ErrStaleToken) {
		t.Fatalf("an older claim = %v, want stale", err)
	}
	// The record rolls back with the job's transaction.
	rollback := errors.New("job failed")
	err = pgx.BeginFunc(ctx, e.Pool, func(tx pgx.Tx) error {
		if err := lg.MarkDoneTx(ctx, tx, "nightly", "night-1", 7); err != nil {
			return err
		}
		return rollback
	})
	if !errors.Is(err, rollback) {
		t.Fatal(err)
	}
	if done, err := lg.Claim(ctx, "nightly", "night-1", 7); done || err != nil {
		t.Fatalf("after a rolled-back record: done %v, err %v; want not done", done, err)
	}
	if err := pgx.BeginFunc(ctx, e.Pool, func(tx pgx.Tx) error { return lg.MarkDoneTx(ctx, tx, "nightly", "night-1", 7) }); err != nil {
		t.Fatal(err)
	}
	if err := lg.MarkDone(ctx, "nightly", "night-1", 7); err != nil {
		t.Fatalf("recording again with the same token = %v, want nil", err)
	}
	if done, err := lg.Claim(ctx, "nightly", "night-1", 8); !done || err != nil {
		t.Fatalf("claim after the record: done %v, err %v; want done", done, err)
	}
	if _, err := sqlguard.NewLedger(nil, "", "bad;name"); !errors.Is(err, fence.ErrInvalidArgument) {
		t.Fatalf("NewLedger(nil, bad name) = %v, want ErrInvalid", err)
	}
}

// A done_at column that cannot record runs is refused at the first claim,
// before anything is written: a default (or generated value) would make
// the first claim find the run done, so that the job never ran; a type
// the record cannot be written to would let the job run and then fail to
// record it, again at every claim. Once the column is fixed, the same
// Ledger claims.
func TestLedgerRefusesAnUnfitDoneColumn(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := context.Background()
	for i, c := range []struct{ done, fix string }{
		{"done_at timestamptz DEFAULT now()", "ALTER COLUMN done_at DROP DEFAULT"},
		{"done_at timestamptz NOT NULL", "ALTER COLUMN done_at DROP NOT NULL"},
		{"done_at boolean", "ALTER COLUMN done_at TYPE timestamptz USING NULL"},
		{"done_at integer", "ALTER COLUMN done_at TYPE timestamp USING NULL"},
		{"done_at text", "ALTER COLUMN done_at TYPE date USING NULL"},
		{"done_at timestamptz GENERATED ALWAYS AS ('2026-01-01'::timestamptz) STORED", "DROP COLUMN done_at, ADD COLUMN done_at timestamptz"},
		{"finished timestamptz", "RENAME COLUMN finished TO done_at"},
	} {
		name := fmt.Sprintf("runs_%d", i)
		e.exec(t, `CREATE TABLE `+name+` (job text, run_key text, `+c.done+`, lock_version bigint NOT NULL DEFAULT 0, PRIMARY KEY (job, run_key))`)
		lg, err := sqlguard.NewLedger(e.Pool, "", name)
		if err != nil {
			t.Fatal(err)
		}
		if done, err := lg.Claim(ctx, "nightly", "night-1", 5); !errors.Is(err, fence.ErrLedgerTable) || !errors.Is(err, lease.ErrSetup) || done {
			t.Errorf("%s: Claim = %v, %v; want ErrLedgerColumn and lease.ErrSetup", c.done, done, err)
		}
		if n := e.int64Query(t, `SELECT count(*) FROM `+name); n != 0 {
			t.Errorf("%s: the refused claim wrote %d rows", c.done, n)
		}
		e.exec(t, `ALTER TABLE `+name+` `+c.fix)
		if done, err := lg.Claim(ctx, "nightly", "night-1", 5); done || err != nil {
			t.Errorf("%s, then %s: Claim = %v, %v; want a claim of a run not done", c.done, c.fix, done, err)
		}
		if err := lg.MarkDone(ctx, "nightly", "night-1", 5); err != nil {
			t.Errorf("%s, then %s: MarkDone = %v", c.done, c.fix, err)
		}
		if done, err := lg.Claim(ctx, "nightly", "night-1", 6); !done || err != nil {
			t.Errorf("%s, then %s: Claim after the record = %v, %v; want done", c.done, c.fix, done, err)
		}
	}
}

// Bad arguments are refused before any I/O: through a closed pool, every
// statement would fail otherwise.
func TestLedgerRefusesBadArgumentsFirst(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	pool, err := pgxpool.New(context.Background(), e.URL)
	if err != nil {
		t.Fatal(err)
	}
	pool.Close()
	lg, err := sqlguard.NewLedger(pool, e.Schema, "runs")
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	for _, c := range []struct {
		job, key string
		token    fence.Token
		want     error
	}{
		{"j", "", 5, fence.ErrInvalidArgument},
		{"", "k", 5, fence.ErrInvalidArgument},
		{"j", "k", 0, fence.ErrInvalidToken},
		{"j", "k", 1 << 63, fence.ErrInvalidToken},
	} {
		var none *sqlguard.Ledger // a failed NewLedger's
		if _, err := none.Claim(ctx, c.job, c.key, c.token); !errors.Is(err, fence.ErrInvalidArgument) {
			t.Errorf("a nil Ledger's Claim = %v, want ErrInvalid", err)
		}
		if err := none.MarkDone(ctx, c.job, c.key, c.token); !errors.Is(err, fence.ErrInvalidArgument) {
			t.Errorf("a nil Ledger's MarkDone = %v, want ErrInvalid", err)
		}
		if _, err := lg.Claim(ctx, c.job, c.key, c.token); !errors.Is(err, c.want) {
			t.Errorf("Claim(%q, %q, %d) = %v, want %v", c.job, c.key, c.token, err, c.want)
		}
		if err := lg.MarkDone(ctx, c.job, c.key, c.token); !errors.Is(err, c.want) {
			t.Errorf("MarkDone(%q, %q, %d) = %v, want %v", c.job, c.key, c.token, err, c.want)
		}
	}
	if err := lg.MarkDoneTx(ctx, nil, "j", "k", 5); !errors.Is(err, fence.ErrInvalidArgument) {
		t.Errorf("MarkDoneTx with a nil transaction = %v, want ErrInvalid (never the Ledger's own database)", err)
	}
}

// The ledger passes the ledger suite on PostgreSQL, each check with a
// schema of its own; the done mark commits with the job's transaction.
func TestLedgerConformance(t *testing.T) {
	t.Parallel()
	guardtest.RunLedger(t, guardtest.LedgerConfig{
		NewLedger: func(t *testing.T) guardtest.Ledger {
			e := newEnv(t)
			lg, err := sqlguard.NewLedger(e.Pool, "", sqlguard.LedgerTable)
			if err != nil {
				t.Fatal(err)
			}
			return ledgerIn{lg, e}
		},
		MarkDoneWithJob: func(t *testing.T, ctx context.Context, l guardtest.Ledger, job, key string, token fence.Token, fail bool) error {
			in := l.(ledgerIn)
			in.e.exec(t, `CREATE TABLE IF NOT EXISTS job_effects (run text PRIMARY KEY)`)
			return pgx.BeginFunc(ctx, in.e.Pool, func(tx pgx.Tx) error {
				if _, err := tx.Exec(ctx, `INSERT INTO job_effects VALUES ($1)`, key+"/"+fmt.Sprint(fail)); err != nil {
					return err
				}
				if err := in.MarkDoneTx(ctx, tx, job, key, token); err != nil {
					return err
				}
				if fail {
					return errors.New("the job failed after its record")
				}
				return nil
			})
		},
	})
}

// ledgerIn is a ledger with the env it writes to.
type ledgerIn struct {
	*sqlguard.Ledger
	e *env
}
