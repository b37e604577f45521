package integration

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/fencekit/fencekit/fence"
	"github.com/fencekit/fencekit/internal/testkit/testenv"
	"github.com/fencekit/fencekit/lease"
	"github.com/fencekit/fencekit/lease/driver"
	"github.com/fencekit/fencekit/lease/pglease"
	"github.com/fencekit/fencekit/sqlguard"
)

var _ lease.Ledger = (*sqlguard.Ledger)(nil)

// deadRenewals is a lease store whose renewals fail once the holder is
// "killed": its process is gone, so nothing keeps its lease alive.
type deadRenewals struct {
	lease.Backend
	dead atomic.Bool
}

var errHolderGone = errors.New("the holder's process is gone")

func (d *deadRenewals) Renew(ctx context.Context, g driver.Grant) error {
	if d.dead.Load() {
		return errHolderGone
	}
	return d.Backend.Renew(ctx, g)
}

// TestRunOnceOnThreeReplicas: a nightly job on three replicas, with
// PostgreSQL leases and its record in a sqlguard.Ledger beside its own
// table. The first replica to lead is killed mid-job (its renewals stop
// and its work stalls); a second takes over after the TTL, runs the job
// and records it in one transaction; the third finds the night done. When
// the stalled replica wakes, its write and its record are refused as
// stale. The job's effect is written once, by the replica that recorded
// it, and the record says so.
func TestRunOnceOnThreeReplicas(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	schema := leaseSchema(t)
	pool, err := pgxpool.New(ctx, testenv.PostgresURL())
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	qs := func(name string) string { return pgx.Identifier{schema, name}.Sanitize() }
	for _, ddl := range []string{
		`CREATE TABLE ` + qs("report") + ` (night text PRIMARY KEY, made_by text NOT NULL, lock_version bigint NOT NULL DEFAULT 0)`,
	} {
		if _, err := pool.Exec(ctx, ddl); err != nil {
			t.Fatal(err)
		}
	}
	ledger, err := sqlguard.NewLedger(pool, schema, sqlguard.LedgerTable) // migrated by leaseSchema
	if err != nil {
		t.Fatal(err)
	}
	report, err := sqlguard.NewTable(schema, "report", "night")
	if err != nil {
		t.Fatal(err)
	}
	const night, name = "2026-12-01", "nightly-report"
	const ttl = time.Second

	var completed atomic.Int32 // jobs whose transaction committed
	job := func(who string, stall <-chan struct{}) func(context.Context, *lease.Lease) error {
		return func(ctx context.Context, l *lease.Lease) error {
			if stall != nil {
				<-stall // killed mid-job: nothing more until the test wakes it
			}
			// The job's writes and its record commit together. The
			// transaction runs on a fresh context so that a holder woken
			// after its lease ended still reaches the store, as a paused
			// process would.
			wctx := context.WithoutCancel(ctx)
			err := pgx.BeginFunc(wctx, pool, func(tx pgx.Tx) error {
				if err := report.Upsert(wctx, tx, []any{night}, l.Token(), sqlguard.Col("made_by", who)); err != nil {
					return err
				}
				return ledger.MarkDoneTx(wctx, tx, name, night, l.Token())
			})
			if err == nil {
				completed.Add(1)
			}
			return err
		}
	}
	replica := func(who string) (*lease.Manager, *deadRenewals) {
		b, err := pglease.New(pool, pglease.WithSchema(schema))
		if err != nil {
			t.Fatal(err)
		}
		d := &deadRenewals{Backend: b}
		m, err := lease.NewManager(d, ttl, lease.WithIdentity(who), lease.WithPollInterval(50*time.Millisecond))
		if err != nil {
			t.Fatal(err)
		}
		return m, d
	}

	type result struct {
		who string
		ran bool
		err error
	}
	results := make(chan result, 3)
	// Replica a leads first and is killed mid-job.
	ma, da := replica("a")
	stall := make(chan struct{})
	leading := make(chan fence.Token, 1)
	go func() {
		ran, err := ma.RunOnce(ctx, name, night, ledger, func(ctx context.Context, l *lease.Lease) error {
			leading <- l.Token()
			da.dead.Store(true)
			return job("a", stall)(ctx, l)
		})
		results <- result{"a", ran, err}
	}()
	tokA := <-leading
	var wg sync.WaitGroup
	for _, who := range []string{"b", "c"} {
		m, _ := replica(who)
		wg.Add(1)
		go func() {
			defer wg.Done()
			ran, err := m.RunOnce(ctx, name, night, ledger, job(who, nil))
			results <- result{who, ran, err}
		}()
	}
	wg.Wait() // b and c are done: one ran the job, one found it done
	close(stall)
	got := map[string]result{}
	for range 3 {
		r := <-results
		got[r.who] = r
	}

	if r := got["a"]; !r.ran || !errors.Is(r.err, fence.ErrStaleToken) {
		t.Fatalf("the woken replica: ran %v, err %v; want ran and a stale-token error", r.ran, r.err)
	}
	var doer, skipper string
	for _, who := range []string{"b", "c"} {
		r := got[who]
		switch {
		case r.err != nil:
			t.Fatalf("replica %s: %v", who, r.err)
		case r.ran:
			doer = who
		default:
			skipper = who
		}
	}
	if doer == "" || skipper == "" {
		t.Fatalf("b and c: %+v; want one to run the job and one to find it done", got)
	}
	if n := completed.Load(); n != 1 {
		t.Fatalf("the job committed %d times, want once", n)
	}
	var madeBy string
	var reportVersion, ledgerVersion int64
	var done bool
	if err := pool.QueryRow(ctx, `SELECT made_by, lock_version FROM `+qs("report")+` WHERE night = $1`, night).Scan(&madeBy, &reportVersion); err != nil {
		t.Fatal(err)
	}
	if err := pool.QueryRow(ctx, `SELECT done_at IS NOT NULL, lock_version FROM `+qs(sqlguard.LedgerTable)+` WHERE job = $1 AND run_key = $2`, name, night).Scan(&done, &ledgerVersion); err != nil {
		t.Fatal(err)
	}
	// The ledger's token is the last claim's: the doer's, or the skipper's
	// if it claimed after.
	if madeBy != doer || !done || ledgerVersion < reportVersion || fence.Token(reportVersion) <= tokA {
		t.Fatalf("report made by %s (token %d), ledger done %v (token %d), a's token %d; want made by %s, done, the report's token newer than a's",
			madeBy, reportVersion, done, ledgerVersion, tokA, doer)
	}
	var rows int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM `+qs(sqlguard.LedgerTable)).Scan(&rows); err != nil || rows != 1 {
		t.Fatalf("ledger rows %d (%v), want 1", rows, err)
	}
}
