package sqlguard

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/fencekit/fencekit/fence"
	"github.com/fencekit/fencekit/internal/probeonce"
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
	shape probeonce.Gate
}

// ErrLedgerColumn is returned by Ledger.Claim, before anything is written,
// when the ledger table's done_at column cannot record runs faithfully:
// it is missing; its type is not timestamptz, timestamp or date (the
// record could not be written after the job ran, and the job would run
// again at every claim); or it is NOT NULL, has a default or is generated
// (a claim would insert a run already done, or none: the job would never
// run).
var ErrLedgerColumn = errors.New("sqlguard: ledger: the done_at column cannot record runs")

// ledgerShapeSQL reads, for the table named $1 (quoted) and the column
// named $2: whether the table exists, whether the column does, its type,
// and whether it has a default (or is generated) or is NOT NULL.
const ledgerShapeSQL = `SELECT r.oid IS NOT NULL, a.attname IS NOT NULL,
	coalesce(pg_catalog.format_type(a.atttypid, NULL), ''), coalesce(a.atthasdef, false), coalesce(a.attnotnull, false)
FROM (SELECT pg_catalog.to_regclass($1) AS oid) AS r
LEFT JOIN pg_catalog.pg_attribute a ON a.attrelid = r.oid AND a.attname = $2 AND a.attnum > 0 AND NOT a.attisdropped`

// checkShape checks the done_at column (one catalog read). A table that
// is fit is remembered as such; a table that is not, or not found (the
// claim's write reports that), is asked about again at the next Claim, so
// that a table fixed meanwhile is used.
func (lg *Ledger) checkShape(ctx context.Context) (verdict bool, err error) {
	var (
		table, column, hasDefault, notNull bool
		typ                                string
	)
	if err := lg.db.QueryRow(ctx, ledgerShapeSQL, lg.table.ident, LedgerDoneColumn).Scan(&table, &column, &typ, &hasDefault, &notNull); err != nil {
		return false, fmt.Errorf("sqlguard: ledger %s: check the table: %w", lg.table.name, err)
	}
	var why []string
	switch {
	case !table:
		return false, nil
	case !column:
		why = append(why, "it is missing")
	default:
		if typ != "timestamp with time zone" && typ != "timestamp without time zone" && typ != "date" {
			why = append(why, "its type is "+typ+", want timestamptz")
		}
		if hasDefault {
			why = append(why, "it has a default or is generated (a claim would insert a run already done)")
		}
		if notNull {
			why = append(why, "it is NOT NULL (a run not yet done is NULL)")
		}
	}
	if len(why) > 0 {
		return false, fmt.Errorf("%w: %s.%s: %s", ErrLedgerColumn, lg.table.name, LedgerDoneColumn, strings.Join(why, "; "))
	}
	return true, nil
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
// (a second). Before its first claim, a Ledger checks its table's done_at
// column (a catalog read, until the column is found fit). It returns a
// *fence.StaleError when a newer token has claimed key, an error matching
// ErrLedgerColumn when done_at is unfit (nothing written), and the errors
// of Table.Upsert; before any I/O, ErrInvalid for an empty key and
// fence.ErrInvalidToken for token 0 or one above 2^63-1. ctx bounds every
// statement.
func (lg *Ledger) Claim(ctx context.Context, key string, token fence.Token) (bool, error) {
	if err := lg.checkArgs("claim", key, token); err != nil {
		return false, err
	}
	if err := lg.shape.Ensure(ctx, lg.checkShape); err != nil {
		return false, err
	}
	if err := lg.table.Upsert(ctx, lg.db, token, []any{key}); err != nil {
		return false, err
	}
	var done bool
	if err := lg.db.QueryRow(ctx, lg.done, key).Scan(&done); err != nil {
		return false, fmt.Errorf("sqlguard: ledger %s: read %q: %w", lg.table.name, key, err)
	}
	return done, nil
}

// checkArgs reports, before any I/O, an empty run key (ErrInvalid) and a
// token that is 0 or above the bigint range (fence.ErrInvalidToken).
func (lg *Ledger) checkArgs(op, key string, token fence.Token) error {
	if lg == nil {
		return fmt.Errorf("sqlguard: ledger: %s %q: %w: nil *Ledger (from a failed NewLedger?)", op, key, ErrInvalid)
	}
	_, err := tokenArg(token)
	if key == "" {
		err = errors.Join(err, fmt.Errorf("%w: the run key is empty", ErrInvalid))
	}
	if err != nil {
		return fmt.Errorf("sqlguard: ledger %s: %s %q: %w", lg.table.name, op, key, err)
	}
	return nil
}

// MarkDone implements lease.Ledger: a fenced update setting done_at (one
// statement: Table.Update). It returns nil when the run is recorded done
// by token (again, if it already was); a *fence.StaleError when a newer
// token has claimed key; ErrNotFound when key was never claimed; the other
// errors of Table.Update. ctx bounds the statement.
func (lg *Ledger) MarkDone(ctx context.Context, key string, token fence.Token) error {
	if err := lg.checkArgs("mark done", key, token); err != nil {
		return err
	}
	return lg.MarkDoneTx(ctx, lg.db, key, token)
}

// MarkDoneTx is MarkDone through db: pass the job's own transaction, so
// that its writes and the record of the run commit together.
func (lg *Ledger) MarkDoneTx(ctx context.Context, db DBTX, key string, token fence.Token) error {
	if err := lg.checkArgs("mark done", key, token); err != nil {
		return err
	}
	return lg.table.Update(ctx, db, token, []any{key}, Col(LedgerDoneColumn, time.Now().UTC()))
}
