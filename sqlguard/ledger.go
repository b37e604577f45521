package sqlguard

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/fencekit/fencekit/fence"
	"github.com/fencekit/fencekit/internal/pgident"
	"github.com/fencekit/fencekit/internal/probeonce"
	"github.com/fencekit/fencekit/internal/rowguard"
)

// The toolkit's ledger table and the columns of a ledger table: the job,
// the run's key, when it was marked done (NULL until then), and the fence.
const (
	// LedgerTable is the toolkit's ledger table, created by
	// `fencekit migrate up` (migrations.Up, migration 00006) beside
	// fencekit_resource_tokens.
	LedgerTable      = "fencekit_job_runs"
	LedgerJobColumn  = "job"
	LedgerKeyColumn  = "run_key"
	LedgerDoneColumn = "done_at"
)

// Ledger records the runs of once-per-period jobs (lease.Manager.RunOnce)
// through fenced writes: it is a lease.Ledger. Each run is one row, keyed
// by its job (the lease name RunOnce runs under, or lease.ForJob's name)
// and its run key, with a lock_version of its own, so that two jobs that
// share the table and a key ("2026-12-01") each run once, and tokens of
// two lease names are never compared. The toolkit's table, LedgerTable,
// is created by `fencekit migrate up`:
//
//	CREATE TABLE fencekit_job_runs (
//		job          text NOT NULL,
//		run_key      text NOT NULL,
//		done_at      timestamptz,
//		lock_version bigint NOT NULL DEFAULT 0 CHECK (lock_version >= 0),
//		PRIMARY KEY (job, run_key)
//	);
//
// A table of your own needs the same columns and key. One keyed by the run
// key alone (the shape this package asked for before) would let a job
// find another job's run done and never run: a Ledger refuses it at its
// first use, before anything is written (fence.ErrLedgerTable, which names the
// migration to run).
//
// Keep it in the database the job writes to, so that the job's last
// transaction can record the run done with MarkDoneTx: then the job's
// effect and its record commit together or not at all.
//
// A Ledger is safe for concurrent use.
type Ledger struct {
	db     DBTX
	table  *Table
	schema string // as given to NewLedger
	tname  string // the table's name, as given to NewLedger
	done   string // SELECT done_at IS NOT NULL ... WHERE job = $1 AND run_key = $2
	shape  probeonce.Gate
}

// ledgerShapeSQL reads, for the table named $1 (quoted), the done_at
// column $2, the job column $3 and the run key column $4: whether the
// table exists, whether done_at does, its type, whether it has a default
// (or is generated) or is NOT NULL; whether the job column exists; whether
// a unique index (no predicate) is on exactly (job, run_key); and the
// definitions of the unique indexes without the job column.
const ledgerShapeSQL = `SELECT r.oid IS NOT NULL, a.attname IS NOT NULL,
	coalesce(pg_catalog.format_type(a.atttypid, NULL), ''), coalesce(a.atthasdef, false), coalesce(a.attnotnull, false),
	j.attnum IS NOT NULL,
	EXISTS (SELECT 1 FROM pg_catalog.pg_index i WHERE i.indrelid = r.oid AND i.indisunique AND i.indpred IS NULL
		AND i.indnkeyatts = 2 AND j.attnum IN (i.indkey[0], i.indkey[1]) AND k.attnum IN (i.indkey[0], i.indkey[1])),
	coalesce((SELECT string_agg(pg_catalog.pg_get_indexdef(i.indexrelid), '; ' ORDER BY i.indexrelid)
		FROM pg_catalog.pg_index i WHERE i.indrelid = r.oid AND i.indisunique
		AND (j.attnum IS NULL OR NOT j.attnum = ANY (i.indkey))), '')
FROM (SELECT pg_catalog.to_regclass($1) AS oid) AS r
LEFT JOIN pg_catalog.pg_attribute a ON a.attrelid = r.oid AND a.attname = $2 AND a.attnum > 0 AND NOT a.attisdropped
LEFT JOIN pg_catalog.pg_attribute j ON j.attrelid = r.oid AND j.attname = $3 AND j.attnum > 0 AND NOT j.attisdropped
LEFT JOIN pg_catalog.pg_attribute k ON k.attrelid = r.oid AND k.attname = $4 AND k.attnum > 0 AND NOT k.attisdropped`

// checkShape checks the table (one catalog read): that it keeps jobs
// apart, and that its done_at column can record runs. A table that is fit
// is remembered as such; a table that is not is asked about again at the
// next use, so that a table fixed meanwhile is used.
func (lg *Ledger) checkShape(ctx context.Context) (verdict bool, err error) {
	var (
		table, column, hasDefault, notNull, job, keyed bool
		typ, unjobbed                                  string
	)
	if err := lg.db.QueryRow(ctx, ledgerShapeSQL, lg.table.ident, LedgerDoneColumn, LedgerJobColumn, LedgerKeyColumn).
		Scan(&table, &column, &typ, &hasDefault, &notNull, &job, &keyed, &unjobbed); err != nil {
		return false, fmt.Errorf("sqlguard: ledger %s: check the table: %w", lg.table.spec.Name, err)
	}
	if !table {
		return false, lg.setupErr(ledgerMissing)
	}
	var why []string
	if !job {
		why = append(why, "it has no "+LedgerJobColumn+" column")
	}
	if unjobbed != "" {
		why = append(why, "unique keys without "+LedgerJobColumn+" make one job's run collide with another's: "+unjobbed)
	}
	if job && !keyed {
		why = append(why, "no unique key (without a WHERE clause) on exactly ("+LedgerJobColumn+", "+LedgerKeyColumn+")")
	}
	if len(why) > 0 {
		return false, lg.setupErr(strings.Join(why, "; "))
	}
	switch {
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
		return false, &fence.SetupError{
			Err: fmt.Errorf("sqlguard: ledger: %w: %s.%s cannot record runs: %s", fence.ErrLedgerTable, lg.table.spec.Name, LedgerDoneColumn, strings.Join(why, "; ")),
			Fix: "make " + LedgerDoneColumn + " a nullable timestamptz without a default, or use " + LedgerTable + " (`fencekit migrate up`)",
		}
	}
	return true, nil
}

// setupErr is the error for a ledger table that is missing or cannot keep
// jobs apart: a *fence.SetupError matching fence.ErrLedgerTable (and
// fence.ErrNotMigrated for a missing LedgerTable) that names the
// migration to run.
func (lg *Ledger) setupErr(problem string) error {
	cmd := "fencekit migrate up"
	if lg.schema != "" {
		cmd += " --schema " + pgident.ShellWord(lg.schema)
	}
	migrate := fmt.Sprintf("run `%s`: migration %05d creates %s, keyed by %s and %s",
		cmd, ledgerMigration, LedgerTable, LedgerJobColumn, LedgerKeyColumn)
	err := fmt.Errorf("sqlguard: ledger: %w: %s: %s", fence.ErrLedgerTable, lg.table.spec.Name, problem)
	if lg.tname == LedgerTable {
		if problem == ledgerMissing {
			err = fmt.Errorf("sqlguard: ledger: %w: %s: %s (%w)", fence.ErrLedgerTable, lg.table.spec.Name, problem, fence.ErrNotMigrated)
		}
		return &fence.SetupError{Err: err, Fix: migrate}
	}
	return &fence.SetupError{Err: err, Fix: migrate + "; pass sqlguard.LedgerTable to NewLedger. Or give " + lg.table.spec.Name +
		" a " + LedgerJobColumn + " text NOT NULL column, set on each row to the job (lease name) that wrote it, and make " +
		LedgerJobColumn + ", " + LedgerKeyColumn + " its primary key, with no unique key without " + LedgerJobColumn}
}

// ledgerMissing is the problem of a ledger table that does not exist.
const ledgerMissing = "the table does not exist"

// ledgerMigration is the version of the migration that creates
// LedgerTable (migrations.LedgerMigration).
const ledgerMigration = 6

// NewLedger returns a Ledger over the table name in schema (empty: found
// through the search_path), written through db (a pool, usually): name is
// LedgerTable unless you keep runs in a table of your own of the same
// shape. It does no I/O. Errors: as NewTable's, and fence.ErrInvalidArgument when db is
// nil.
func NewLedger(db DBTX, schema, name string) (*Ledger, error) {
	t, err := NewTable(schema, name, LedgerJobColumn, LedgerKeyColumn)
	if rowguard.IsNil(db) {
		err = errors.Join(err, fmt.Errorf("%w: ledger: nil database", fence.ErrInvalidArgument))
	}
	if err != nil {
		return nil, err
	}
	return &Ledger{db: db, table: t, schema: schema, tname: name,
		done: "SELECT " + pgx.Identifier{LedgerDoneColumn}.Sanitize() + " IS NOT NULL FROM " + t.ident +
			" WHERE " + pgx.Identifier{LedgerJobColumn}.Sanitize() + " = $1 AND " + pgx.Identifier{LedgerKeyColumn}.Sanitize() + " = $2"}, nil
}

// Claim implements lease.Ledger: a fenced upsert of the row of job's run
// key with token (one statement: Table.Upsert), then a read of whether the
// run is done (a second). Before its first use, a Ledger checks its table
// (a catalog read, until the table is found fit). It returns a
// *fence.StaleError when a newer token has claimed the run; an error
// matching fence.ErrLedgerTable or fence.ErrLedgerTable, and lease.ErrSetup, when the
// table cannot keep jobs apart or done_at is unfit (nothing written); the
// errors of Table.Upsert; before any I/O, fence.ErrInvalidArgument for an empty job or
// key and fence.ErrInvalidToken for token 0 or one above 2^63-1. ctx
// bounds every statement.
func (lg *Ledger) Claim(ctx context.Context, job, key string, token fence.Token) (bool, error) {
	if err := lg.checkArgs("claim", job, key, token); err != nil {
		return false, err
	}
	if err := lg.shape.Ensure(ctx, lg.checkShape); err != nil {
		return false, err
	}
	if err := lg.table.Upsert(ctx, lg.db, []any{job, key}, token); err != nil {
		return false, err
	}
	var done bool
	if err := lg.db.QueryRow(ctx, lg.done, job, key).Scan(&done); err != nil {
		return false, fmt.Errorf("sqlguard: ledger %s: read %q of job %q: %w", lg.table.spec.Name, key, job, err)
	}
	return done, nil
}

// checkArgs reports, before any I/O, an empty job or run key (fence.ErrInvalidArgument)
// and a token that is 0 or above the bigint range (fence.ErrInvalidToken).
func (lg *Ledger) checkArgs(op, job, key string, token fence.Token) error {
	if lg == nil {
		return fmt.Errorf("sqlguard: ledger: %s %q of job %q: %w: nil *Ledger (from a failed NewLedger?)", op, key, job, fence.ErrInvalidArgument)
	}
	_, err := tokenArg(token)
	if err := rowguard.CheckRun(err, job, key); err != nil {
		return fmt.Errorf("sqlguard: ledger %s: %s %q of job %q: %w", lg.table.spec.Name, op, key, job, err)
	}
	return nil
}

// MarkDone implements lease.Ledger: a fenced update setting done_at (one
// statement: Table.Update). It returns nil when the run is recorded done
// by token (again, if it already was); a *fence.StaleError when a newer
// token has claimed the run; fence.ErrNotFound when it was never claimed; the
// table's errors as Claim returns them; the other errors of Table.Update.
// ctx bounds the statements (the table's check, before its first use,
// and the update).
func (lg *Ledger) MarkDone(ctx context.Context, job, key string, token fence.Token) error {
	if lg == nil {
		return lg.checkArgs("mark done", job, key, token)
	}
	return lg.markDone(ctx, lg.db, job, key, token)
}

// MarkDoneTx is MarkDone through db: pass the job's own transaction, so
// that its writes and the record of the run commit together. job is the
// job as RunOnce names it: the lease name (l.Name()), or lease.ForJob's. A nil db is
// refused (fence.ErrInvalidArgument), never replaced by the Ledger's own database: the
// record would commit without the job's writes.
func (lg *Ledger) MarkDoneTx(ctx context.Context, db DBTX, job, key string, token fence.Token) error {
	if rowguard.IsNil(db) {
		err := fmt.Errorf("%w: nil transaction", fence.ErrInvalidArgument)
		if cerr := lg.checkArgs("mark done", job, key, token); cerr != nil {
			return errors.Join(cerr, err)
		}
		return fmt.Errorf("sqlguard: ledger %s: mark done %q of job %q: %w", lg.table.spec.Name, key, job, err)
	}
	return lg.markDone(ctx, db, job, key, token)
}

func (lg *Ledger) markDone(ctx context.Context, db DBTX, job, key string, token fence.Token) error {
	if err := lg.checkArgs("mark done", job, key, token); err != nil {
		return err
	}
	if err := lg.shape.Ensure(ctx, lg.checkShape); err != nil {
		return err
	}
	return lg.table.Update(ctx, db, []any{job, key}, token, Col(LedgerDoneColumn, time.Now().UTC()))
}
