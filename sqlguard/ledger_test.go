package sqlguard_test

import (
	"context"
	"errors"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/fencekit/fencekit/fence"
	"github.com/fencekit/fencekit/sqlguard"
)

// The ledger's claim and record are fenced: a newer claim refuses an older
// holder's record, a record by the claimant is seen by the next claim, and
// a record commits with the job's own transaction or not at all.
func TestLedger(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := context.Background()
	e.exec(t, `CREATE TABLE runs (run_key text PRIMARY KEY, done_at timestamptz, lock_version bigint NOT NULL DEFAULT 0)`)
	lg, err := sqlguard.NewLedger(e.pool, "", "runs")
	if err != nil {
		t.Fatal(err)
	}
	if err := lg.MarkDone(ctx, "night-1", 5); !errors.Is(err, sqlguard.ErrNotFound) {
		t.Fatalf("MarkDone of an unclaimed run = %v, want ErrNotFound", err)
	}
	if done, err := lg.Claim(ctx, "night-1", 5); done || err != nil {
		t.Fatalf("first claim: done %v, err %v", done, err)
	}
	if done, err := lg.Claim(ctx, "night-1", 7); done || err != nil {
		t.Fatalf("newer claim: done %v, err %v", done, err)
	}
	err = lg.MarkDone(ctx, "night-1", 5)
	if se, ok := fence.AsStale(err); !ok || se.Presented != 5 || se.Current != 7 {
		t.Fatalf("the older holder's record = %v, want stale (5 < 7)", err)
	}
	if _, err := lg.Claim(ctx, "night-1", 6); !errors.Is(err, fence.ErrStaleToken) {
		t.Fatalf("an older claim = %v, want stale", err)
	}
	// The record rolls back with the job's transaction.
	rollback := errors.New("job failed")
	err = pgx.BeginFunc(ctx, e.pool, func(tx pgx.Tx) error {
		if err := lg.MarkDoneTx(ctx, tx, "night-1", 7); err != nil {
			return err
		}
		return rollback
	})
	if !errors.Is(err, rollback) {
		t.Fatal(err)
	}
	if done, err := lg.Claim(ctx, "night-1", 7); done || err != nil {
		t.Fatalf("after a rolled-back record: done %v, err %v; want not done", done, err)
	}
	if err := pgx.BeginFunc(ctx, e.pool, func(tx pgx.Tx) error { return lg.MarkDoneTx(ctx, tx, "night-1", 7) }); err != nil {
		t.Fatal(err)
	}
	if err := lg.MarkDone(ctx, "night-1", 7); err != nil {
		t.Fatalf("recording again with the same token = %v, want nil", err)
	}
	if done, err := lg.Claim(ctx, "night-1", 8); !done || err != nil {
		t.Fatalf("claim after the record: done %v, err %v; want done", done, err)
	}
	if _, err := sqlguard.NewLedger(nil, "", "bad;name"); !errors.Is(err, sqlguard.ErrInvalid) {
		t.Fatalf("NewLedger(nil, bad name) = %v, want ErrInvalid", err)
	}
}
