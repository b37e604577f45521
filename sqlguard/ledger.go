package sqlguard

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/fencekit/fencekit/fence"
)

// Ledger columns: a run's key, when it was marked done (NULL until then),
// and the fence.
const (
	LedgerKeyColumn  = "run_key"
	LedgerDoneColumn = "done_at"
)

// Ledger records the runs of a once-per-period job (lease.Manager.RunOnce)
// in a table of yours, through fenced writes: it is a lease.Ledger. The
// table needs three columns:
//
//	CREATE TABLE job_runs (
//		run_key      text PRIMARY KEY,
//		done_at      timestamptz,
//		lock_version bigint NOT NULL DEFAULT 0
//	);
//
// Keep it in the database the job writes to, so that the job's last
// transaction can record the run done with MarkDoneTx: then the job's
// effect and its record commit together or not at all.
//
// A Ledger is safe for concurrent use.
type Ledger struct {
	db    DBTX
	table *Table
	done  string // SELECT done_at IS NOT NULL ... WHERE run_key = $1
}

// NewLedger returns a Ledger over the table name in schema (empty: found
// through the search_path), written through db (a pool, usually). It does
// no I/O. Errors: as NewTable's, and ErrInvalid when db is nil.
func NewLedger(db DBTX, schema, name string) (*Ledger, error) {
	t, err := NewTable(schema, name, LedgerKeyColumn)
	if db == nil {
		err = errors.Join(err, fmt.Errorf("%w: ledger: nil database", ErrInvalid))
	}
	if err != nil {
		return nil, err
	}
	return &Ledger{db: db, table: t,
		done: "SELECT " + pgx.Identifier{LedgerDoneColumn}.Sanitize() + " IS NOT NULL FROM " + t.ident +
			" WHERE " + pgx.Identifier{LedgerKeyColumn}.Sanitize() + " = $1"}, nil
}

// Claim implements lease.Ledger: a fenced upsert of key's row with token
// (one statement: Table.Upsert), then a read of whether the run is done
// (a second). It returns a *fence.StaleError when a newer token has
// claimed key, and the errors of Table.Upsert; ctx bounds both
// statements.
func (lg *Ledger) Claim(ctx context.Context, key string, token fence.Token) (bool, error) {
	if err := lg.table.Upsert(ctx, lg.db, token, []any{key}); err != nil {
		return false, err
	}
	var done bool
	if err := lg.db.QueryRow(ctx, lg.done, key).Scan(&done); err != nil {
		return false, fmt.Errorf("sqlguard: ledger %s: read %q: %w", lg.table.name, key, err)
	}
	return done, nil
}

// MarkDone implements lease.Ledger: a fenced update setting done_at (one
// statement: Table.Update). It returns nil when the run is recorded done
// by token (again, if it already was); a *fence.StaleError when a newer
// token has claimed key; ErrNotFound when key was never claimed; the other
// errors of Table.Update. ctx bounds the statement.
func (lg *Ledger) MarkDone(ctx context.Context, key string, token fence.Token) error {
	return lg.MarkDoneTx(ctx, lg.db, key, token)
}

// MarkDoneTx is MarkDone through db: pass the job's own transaction, so
// that its writes and the record of the run commit together.
func (lg *Ledger) MarkDoneTx(ctx context.Context, db DBTX, key string, token fence.Token) error {
	return lg.table.Update(ctx, db, token, []any{key}, Col(LedgerDoneColumn, time.Now().UTC()))
}
