package dbguard

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/fencekit/fencekit/fence"
	"github.com/fencekit/fencekit/internal/probeonce"
	"github.com/fencekit/fencekit/internal/rowguard"
)

// LedgerTable is the toolkit's ledger table, created by `fencekit migrate
// up --dialect mysql|sqlite` (migrations.Up with migrations.WithDialect,
// migration 00002 of each) beside fencekit_resource_tokens, with the
// columns job, run_key, done_at and lock_version (see Ledger).
const LedgerTable = "fencekit_job_runs"

// The columns of a ledger's table.
const (
	jobColumn  = rowguard.JobColumn
	keyColumn  = rowguard.KeyColumn
	doneColumn = rowguard.DoneColumn
)

// ledgerMigration is the version of the MySQL and SQLite migration that
// creates LedgerTable (migrations.LedgerMigrationFor).
const ledgerMigration = 2

// Ledger records the runs of once-per-period jobs
// (lease.Manager.RunOnce) through fenced writes on MySQL, MariaDB or
// SQLite: it is a lease.Ledger, sqlguard.Ledger's counterpart. Each run
// is one row, keyed by its job (the lease name RunOnce runs under, or
// lease.ForJob's name) and its run key, with a lock_version of its own,
// so that two jobs that share the table and a key ("2026-12-01") each run
// once, and tokens of two lease names are never compared. The toolkit's
// table, LedgerTable, is created by `fencekit migrate up --dialect
// mysql|sqlite`:
//
//	-- MySQL, MariaDB
//	CREATE TABLE fencekit_job_runs (
//		job          VARBINARY(512)  NOT NULL,
//		run_key      VARBINARY(512)  NOT NULL,
//		done_at      DATETIME(6)     NULL,
//		lock_version BIGINT UNSIGNED NOT NULL DEFAULT 0,
//		PRIMARY KEY (job, run_key)
//	);
//	-- SQLite
//	CREATE TABLE fencekit_job_runs (
//		job          TEXT    NOT NULL,
//		run_key      TEXT    NOT NULL,
//		done_at      TEXT,
//		lock_version INTEGER NOT NULL DEFAULT 0,
//		PRIMARY KEY (job, run_key)
//	);
//
// A table of your own needs the same columns and key. One keyed by the run
// key alone, or with another unique key without the job, would let a job
// find another job's run done and never run: a Ledger refuses it at its
// first use, before anything is written (a *fence.SetupError matching
// fence.ErrLedgerTable that names the migration to run, or the change).
//
// Keep it in the database the job writes to, so that the job's last
// transaction can record the run done with MarkDoneTx: then the job's
// effect and its record commit together or not at all.
//
// A Ledger is safe for concurrent use.
type Ledger struct {
	d        Dialect
	db       DBTX
	table    *Table
	database string // as given to NewLedger
	tname    string // the table's name, as given to NewLedger
	done     string // SELECT done_at IS NOT NULL ... WHERE job = ? AND run_key = ?
	shape    probeonce.Gate
}

// NewLedger returns a Ledger for dialect d over the table name in
// database (empty: the connection's current database, SQLite's main),
// written through db (a *sql.DB, usually): name is LedgerTable unless you
// keep runs in a table of your own of the same shape. It does no I/O.
// Errors: as NewTable's, and fence.ErrInvalidArgument when db is nil.
func NewLedger(d Dialect, db DBTX, database, name string) (*Ledger, error) {
	t, err := NewTable(d, database, name, jobColumn, keyColumn)
	if rowguard.IsNil(db) {
		err = errors.Join(err, fmt.Errorf("%w: ledger: nil database", fence.ErrInvalidArgument))
	}
	if err != nil {
		return nil, err
	}
	return &Ledger{d: d, db: db, table: t, database: database, tname: name,
		done: "SELECT " + d.quote(doneColumn) + " IS NOT NULL FROM " + t.ident +
			" WHERE " + d.quote(jobColumn) + " = ? AND " + d.quote(keyColumn) + " = ?"}, nil
}

// Claim implements lease.Ledger: a fenced upsert of the row of job's run
// key with token (Table.Upsert), then a read of whether the run is done.
// Before its first use, a Ledger checks its table (a catalog read, until
// the table is found fit). It returns a *fence.StaleError when a newer
// token has claimed the run; a *fence.SetupError matching
// fence.ErrLedgerTable when the table cannot keep jobs apart or done_at
// is unfit (nothing written); the errors of Table.Upsert; before any I/O,
// fence.ErrInvalidArgument for an empty job or key and
// fence.ErrInvalidToken for token 0 (or above 2^63-1 on SQLite). ctx
// bounds every statement.
func (lg *Ledger) Claim(ctx context.Context, job, key string, token fence.Token) (bool, error) {
	if err := lg.ready(ctx, "claim", job, key, token); err != nil {
		return false, err
	}
	if err := lg.table.Upsert(ctx, lg.db, []any{job, key}, token); err != nil {
		return false, err
	}
	var done bool
	if err := lg.db.QueryRowContext(ctx, lg.done, job, key).Scan(&done); err != nil {
		return false, lg.d.wrapDBErr(fmt.Sprintf("ledger %s: read %q of job %q", lg.table.spec.Name, key, job), err)
	}
	return done, nil
}

// MarkDone implements lease.Ledger: a fenced update setting done_at
// (Table.Update). It returns nil when the run is recorded done by token
// (again, if it already was); a *fence.StaleError when a newer token has
// claimed the run; fence.ErrNotFound when it was never claimed; the
// table's errors as Claim returns them; the other errors of Table.Update.
func (lg *Ledger) MarkDone(ctx context.Context, job, key string, token fence.Token) error {
	if lg == nil {
		return lg.ready(ctx, "mark done", job, key, token)
	}
	return lg.MarkDoneTx(ctx, lg.db, job, key, token)
}

// MarkDoneTx is MarkDone through db: pass the job's own *sql.Tx, so that
// its writes and the record of the run commit together. job is the job
// as RunOnce names it: the lease name (l.Name()), or lease.ForJob's. A
// nil db is refused (fence.ErrInvalidArgument), never replaced by the
// Ledger's own database: the record would commit without the job's
// writes.
func (lg *Ledger) MarkDoneTx(ctx context.Context, db DBTX, job, key string, token fence.Token) error {
	if err := lg.ready(ctx, "mark done", job, key, token); err != nil {
		return err
	}
	if rowguard.IsNil(db) {
		return fmt.Errorf("dbguard: ledger %s: mark done %q of job %q: %w: nil transaction", lg.table.spec.Name, key, job, fence.ErrInvalidArgument)
	}
	done := time.Now().UTC().Format("2006-01-02 15:04:05.000000")
	return lg.table.Update(ctx, db, []any{job, key}, token, Col(doneColumn, done))
}

// ready checks a call's arguments before any I/O, then the table's shape
// at the first use.
func (lg *Ledger) ready(ctx context.Context, op, job, key string, token fence.Token) error {
	if lg == nil {
		return fmt.Errorf("dbguard: ledger: %s %q of job %q: %w: nil *Ledger (from a failed NewLedger?)", op, key, job, fence.ErrInvalidArgument)
	}
	_, tokErr := lg.d.tokenArg(token)
	if err := rowguard.CheckRun(tokErr, job, key); err != nil {
		return fmt.Errorf("dbguard: ledger %s: %s %q of job %q: %w", lg.table.spec.Name, op, key, job, err)
	}
	return lg.shape.Ensure(ctx, lg.checkShape)
}

// checkShape checks the table (catalog reads): that it keeps jobs apart,
// and that its done_at column can record runs. A table that is fit is
// remembered as such; one that is not is asked about again at the next
// use, so that a table fixed meanwhile is used.
func (lg *Ledger) checkShape(ctx context.Context) (bool, error) {
	d, t := lg.d, lg.table
	cols, err := d.columns(ctx, lg.db, t.database, t.table)
	if err != nil {
		return false, err
	}
	if len(cols) == 0 {
		if err := d.hidden(ctx, lg.db, t.ident, jobColumn); err != nil {
			return false, err
		}
		return false, lg.setupErr("the table does not exist")
	}
	unique, err := d.uniqueIndexes(ctx, lg.db, t.database, t.table)
	if err != nil {
		return false, err
	}
	same := func(a, b string) bool { return a == b || d == MySQL && strings.EqualFold(a, b) }
	hasJob := func(idx []string) bool {
		return slices.ContainsFunc(idx, func(c string) bool { return same(c, jobColumn) })
	}
	var why []string
	if _, ok := d.col(cols, jobColumn); !ok {
		why = append(why, "it has no "+jobColumn+" column")
	}
	keyed := false
	for _, idx := range unique {
		switch {
		case !hasJob(idx):
			why = append(why, "a unique key without "+jobColumn+" ("+strings.Join(idx, ", ")+") makes one job's run collide with another's")
		case len(idx) == 2 && slices.ContainsFunc(idx, func(c string) bool { return same(c, keyColumn) }):
			keyed = true
		}
	}
	if !keyed {
		why = append(why, "no unique key on exactly ("+jobColumn+", "+keyColumn+")")
	}
	if len(why) > 0 {
		return false, lg.setupErr(strings.Join(why, "; "))
	}
	switch c, ok := d.col(cols, doneColumn); {
	case !ok:
		why = append(why, "it is missing")
	case c.notNull:
		why = append(why, "it is NOT NULL (a run not yet done is NULL)")
	case c.hasDefault:
		why = append(why, "it has a default or is generated (a claim would insert a run already done)")
	}
	if len(why) > 0 {
		return false, fence.Setup("make "+doneColumn+" a nullable DATETIME(6) (SQLite: TEXT) without a default, or use "+LedgerTable+" (`fencekit migrate up --dialect "+d.String()+"`)",
			"dbguard: ledger: %w: %s.%s cannot record runs: %s", fence.ErrLedgerTable, t.spec.Name, doneColumn, strings.Join(why, "; "))
	}
	return true, nil
}

// setupErr is the error for a ledger table that is missing or cannot keep
// jobs apart: a *fence.SetupError matching fence.ErrLedgerTable (and
// fence.ErrNotMigrated for a missing LedgerTable) that names the
// migration to run.
func (lg *Ledger) setupErr(problem string) error {
	migrate := fmt.Sprintf("run `fencekit migrate up --dialect %s`: migration %05d creates %s, keyed by %s and %s",
		lg.d, ledgerMigration, LedgerTable, jobColumn, keyColumn)
	err := fmt.Errorf("dbguard: ledger: %w: %s: %s", fence.ErrLedgerTable, lg.table.spec.Name, problem)
	if lg.tname == LedgerTable {
		if lg.table.spec.Name == LedgerTable && strings.Contains(problem, "does not exist") {
			err = fmt.Errorf("%w (%w)", err, fence.ErrNotMigrated)
		}
		return &fence.SetupError{Err: err, Fix: migrate}
	}
	return &fence.SetupError{Err: err, Fix: migrate + "; pass dbguard.LedgerTable to NewLedger. Or give " + lg.table.spec.Name +
		" a " + jobColumn + " column, set on each row to the job (lease name) that wrote it, and make " +
		jobColumn + ", " + keyColumn + " its primary key, with no unique key without " + jobColumn}
}

// Check is the ledger's start-up check: its shape, as Claim checks it
// before its first use; the table's, as Table.Check checks it
// (lock_version, privileges); that the database user may INSERT (Claim
// creates a run's row); and that the migration that creates LedgerTable
// is applied, when the database holds `fencekit migrate`'s version table.
// It returns nil, or each problem as a *fence.SetupError naming its fix,
// or the database's error. ctx bounds the statements.
func (lg *Ledger) Check(ctx context.Context) error {
	if lg == nil {
		return fmt.Errorf("dbguard: ledger: check: %w: nil *Ledger (from a failed NewLedger?)", fence.ErrInvalidArgument)
	}
	if _, err := lg.checkShape(ctx); err != nil {
		return err
	}
	t := lg.table
	jq, kq := lg.d.quote(jobColumn), lg.d.quote(keyColumn)
	errs := []error{t.Check(ctx, lg.db), lg.d.privileges(ctx, lg.db, t.ident, [][2]string{
		{"INSERT", "INSERT INTO " + t.ident + " (" + jq + ", " + kq + ") SELECT " + jq + ", " + kq + " FROM " + t.ident + " WHERE 1 = 0"},
	})}
	if lg.tname == LedgerTable {
		errs = append(errs, lg.d.migrationProblem(ctx, lg.db, lg.database, ledgerMigration, LedgerTable))
	}
	return errors.Join(errs...)
}
