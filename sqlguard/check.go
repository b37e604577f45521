package sqlguard

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5"

	"github.com/fencekit/fencekit/fence"
	"github.com/fencekit/fencekit/internal/lockversion"
	"github.com/fencekit/fencekit/internal/pgident"
	"github.com/fencekit/fencekit/internal/rowguard"
)

// The start-up checks (Guard.Check, Table.Check, Ledger.Check) are what
// lease.Manager.Check is for a lease backend: run them once when the
// program starts, and a database not set up for the guard shows then, with
// its fix, rather than at the first write (at night, when the job runs).
// Each reads the catalog only; nothing is written. Each returns nil, or
// every problem it found as a *fence.SetupError naming its fix (joined
// with errors.Join: errors.Is(err, fence.ErrSetup), and so
// lease.ErrSetup, holds), or the database's error when the catalog could
// not be read.

// versionTable is the table where `fencekit migrate` (package migrations)
// records the migrations it applied.
const versionTable = "fencekit_goose_version"

// serverSQL reads whether the server takes writes: not a standby, and not
// read-only by default.
const serverSQL = `SELECT pg_catalog.pg_is_in_recovery(), pg_catalog.current_setting('default_transaction_read_only') = 'on'`

// checkServer reports a server that cannot take the guard's writes.
func checkServer(ctx context.Context, db DBTX) error {
	var standby, readOnly bool
	if err := db.QueryRow(ctx, serverSQL).Scan(&standby, &readOnly); err != nil {
		return wrapDBErr("check the server", err)
	}
	switch {
	case standby:
		return fence.Setup("connect to the primary: the guard writes", "sqlguard: check: the server is a standby (in recovery): it takes no writes")
	case readOnly:
		return fence.Setup("connect as a role whose default_transaction_read_only is off, or to a database that takes writes",
			"sqlguard: check: default_transaction_read_only is on: the guard's writes would be refused")
	}
	return nil
}

// privilegeProblem says which of the privileges (privilege name -> held)
// are missing on what, as a *fence.SetupError naming the GRANT, or nil.
func privilegeProblem(what, grantOn string, held map[string]bool, order ...string) error {
	var missing []string
	for _, p := range order {
		if !held[p] {
			missing = append(missing, p)
		}
	}
	if len(missing) == 0 {
		return nil
	}
	return fence.Setup("GRANT "+strings.Join(missing, ", ")+" ON "+grantOn+" TO the connection's role",
		"sqlguard: check: the connection's role lacks %s on %s", strings.Join(missing, ", "), what)
}

// migrationProblem reports, when the schema holds fencekit's version table
// (the toolkit was migrated with `fencekit migrate`) and the connection's
// role may read it, that migration
// version is not among those it applied. schema is where to look ("":
// the search_path), cmd the command that applies it.
func migrationProblem(ctx context.Context, db DBTX, schema string, version int, what, cmd string) error {
	vt := pgx.Identifier{versionTable}.Sanitize()
	if schema != "" {
		vt = pgx.Identifier{schema, versionTable}.Sanitize()
	}
	var readable bool
	if err := db.QueryRow(ctx, `SELECT coalesce(pg_catalog.has_table_privilege(pg_catalog.to_regclass($1), 'SELECT'), false)`, vt).Scan(&readable); err != nil {
		return wrapDBErr("check the migrations", err)
	}
	if !readable {
		// Objects made by other means, or a role that may not read what
		// `fencekit migrate` recorded: their shape was checked.
		return nil
	}
	var applied bool
	if err := db.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM `+vt+` WHERE version_id = $1)`, version).Scan(&applied); err != nil {
		return wrapDBErr("check the migrations", err)
	}
	if applied {
		return nil
	}
	return fence.Setup("run `"+cmd+"` (or migrations.Up)", "sqlguard: check: %w: migration %05d (%s) is not applied", fence.ErrNotMigrated, version, what)
}

// guardCheckSQL reads, for the resource table $1 and the advance function
// $2 (each quoted, the function with its argument types): whether each
// exists, the type of the table's token column, and the privileges the
// guard uses on each.
const guardCheckSQL = `SELECT t.oid IS NOT NULL, f.oid IS NOT NULL,
	coalesce((SELECT pg_catalog.format_type(a.atttypid, NULL) FROM pg_catalog.pg_attribute a
		WHERE a.attrelid = t.oid AND a.attname = 'token' AND NOT a.attisdropped), ''),
	t.oid IS NULL OR pg_catalog.has_table_privilege(t.oid, 'SELECT'),
	t.oid IS NULL OR pg_catalog.has_table_privilege(t.oid, 'INSERT'),
	t.oid IS NULL OR pg_catalog.has_table_privilege(t.oid, 'UPDATE'),
	f.oid IS NULL OR pg_catalog.has_function_privilege(f.oid, 'EXECUTE')
FROM (SELECT pg_catalog.to_regclass($1) AS oid) AS t, (SELECT pg_catalog.to_regprocedure($2) AS oid) AS f`

// guardMigration is the last migration the Guard relies on: 00002 made
// the stale message safe for any resource name.
const guardMigration = 2

// Check checks, through db, that the database is set up for the Guard:
// the toolkit's table (fencekit_resource_tokens, its token column bigint)
// and function (fencekit_advance_token) are in the schema it looks in;
// the connection's role may SELECT, INSERT and UPDATE the table and
// EXECUTE the function; the migrations the Guard relies on are applied
// (when the schema holds `fencekit migrate`'s version table); and the
// server takes writes. See "start-up checks" above for what it returns.
// ctx bounds the catalog reads.
func (g *Guard) Check(ctx context.Context, db DBTX) error {
	if rowguard.IsNil(db) {
		return fmt.Errorf("sqlguard: check: %w: nil database", fence.ErrInvalidArgument)
	}
	table := pgx.Identifier{ResourceTable}.Sanitize()
	fn := pgx.Identifier{AdvanceFunction}.Sanitize()
	if g.opts.Schema != "" {
		table = pgx.Identifier{g.opts.Schema, ResourceTable}.Sanitize()
		fn = pgx.Identifier{g.opts.Schema, AdvanceFunction}.Sanitize()
	}
	var (
		hasTable, hasFn, sel, ins, upd, exec bool
		tokenType                            string
	)
	if err := db.QueryRow(ctx, guardCheckSQL, table, fn+"(text,bigint)").Scan(&hasTable, &hasFn, &tokenType, &sel, &ins, &upd, &exec); err != nil {
		return wrapDBErr("check", err)
	}
	held := map[string]bool{"SELECT": sel, "INSERT": ins, "UPDATE": upd}
	if !hasTable || !hasFn {
		return g.notMigrated("check", nil)
	}
	cmd := "fencekit migrate up"
	if g.opts.Schema != "" {
		cmd += " --schema " + pgident.ShellWord(g.opts.Schema)
	}
	var errs []error
	if tokenType != "bigint" {
		errs = append(errs, fence.Setup("run `"+cmd+"` on a schema without a table of that name, or drop the table first",
			"sqlguard: check: %w: %s.token is %q, want bigint", fence.ErrNotMigrated, ResourceTable, tokenType))
	}
	errs = append(errs, privilegeProblem(ResourceTable, table, held, "SELECT", "INSERT", "UPDATE"))
	if !exec {
		errs = append(errs, fence.Setup("GRANT EXECUTE ON FUNCTION "+fn+"(text, bigint) TO the connection's role",
			"sqlguard: check: the connection's role may not execute %s", AdvanceFunction))
	}
	errs = append(errs, migrationProblem(ctx, db, g.opts.Schema, guardMigration, "the stale message of "+AdvanceFunction, cmd))
	errs = append(errs, checkServer(ctx, db))
	return errors.Join(errs...)
}

// tableCheckSQL reads, for the table $1 (quoted) and its key columns $2:
// whether it exists, lock_version's type ("" when missing) and NOT NULL,
// the key columns it lacks, whether a unique index has exactly the key
// columns, and the privileges every write uses (SELECT, and UPDATE: the
// exact path locks the row).
var tableCheckSQL = `SELECT r.oid IS NOT NULL,
	coalesce(pg_catalog.format_type(lv.atttypid, NULL), ''), coalesce(lv.attnotnull, false),
	coalesce((SELECT pg_catalog.array_agg(k ORDER BY n) FROM pg_catalog.unnest($2::text[]) WITH ORDINALITY AS u(k, n)
		WHERE NOT EXISTS (SELECT 1 FROM pg_catalog.pg_attribute a WHERE a.attrelid = r.oid AND a.attname = u.k AND a.attnum > 0 AND NOT a.attisdropped)),
		'{}'::text[]),
	` + uniqueOnKeysSQL + `,
	r.oid IS NULL OR pg_catalog.has_any_column_privilege(r.oid, 'SELECT'),
	r.oid IS NULL OR pg_catalog.has_any_column_privilege(r.oid, 'UPDATE')
FROM (SELECT pg_catalog.to_regclass($1) AS oid) AS r
LEFT JOIN pg_catalog.pg_attribute lv ON lv.attrelid = r.oid AND lv.attname = '` + LockVersionColumn + `' AND NOT lv.attisdropped`

// Check checks, through db, that the table is set up for row-level
// fencing: it exists (as NewTable names it, through db's search_path when
// the schema is empty); it has a lock_version column of type bigint, NOT
// NULL, and the key columns; a unique index (valid, immediate, without a
// predicate) is on exactly the key columns, which Insert and Upsert need
// and which keeps a key to one row; the connection's role may SELECT and
// UPDATE it, which every write needs (the rejection path locks the row);
// and the server takes writes. INSERT and DELETE are not asked for: a
// table written only by Update needs neither. See "start-up checks"
// above for what it returns. ctx bounds the catalog reads.
func (t *Table) Check(ctx context.Context, db DBTX) error {
	if rowguard.IsNil(db) {
		return fmt.Errorf("sqlguard: check %s: %w: nil database", t.spec.Name, fence.ErrInvalidArgument)
	}
	var (
		exists, notNull, unique, sel, upd bool
		lvType                            string
		missingKeys                       []string
	)
	op := "check " + t.ident
	if err := db.QueryRow(ctx, tableCheckSQL, t.ident, t.spec.Keys).Scan(&exists, &lvType, &notNull, &missingKeys, &unique, &sel, &upd); err != nil {
		return wrapDBErr(op, err)
	}
	if !exists {
		return t.noTable(op, nil)
	}
	var errs []error
	switch {
	case lvType == "":
		errs = append(errs, noLockVersionErr(op, pgident.ShellWord(t.cliName), nil))
	case lvType != lockversion.Type:
		errs = append(errs, t.lockVersionType(op, lvType))
	case !notNull:
		errs = append(errs, fence.Setup("ALTER TABLE "+t.ident+" ALTER COLUMN "+LockVersionColumn+" SET NOT NULL (after setting its NULLs to 0)",
			"sqlguard: %s: %w: %s.%s is nullable: a NULL lock_version cannot be fenced", op, fence.ErrLockVersionType, t.spec.Name, LockVersionColumn))
	}
	if len(missingKeys) > 0 {
		errs = append(errs, fence.Setup("give NewTable the key columns as the table spells them",
			"sqlguard: %s: %w: %s has no column %s", op, fence.ErrNoTable, t.spec.Name, strings.Join(missingKeys, ", ")))
	} else if !unique {
		errs = append(errs, fence.Setup("CREATE UNIQUE INDEX ON "+t.ident+" ("+t.keyList+") (or make them the primary key)",
			"sqlguard: %s: %w: no unique index on exactly (%s): a key may match several rows, and Insert and Upsert cannot run",
			op, fence.ErrAmbiguousKey, strings.Join(t.spec.Keys, ", ")))
	}
	errs = append(errs, privilegeProblem(t.spec.Name, t.ident, map[string]bool{"SELECT": sel, "UPDATE": upd}, "SELECT", "UPDATE"))
	errs = append(errs, checkServer(ctx, db))
	return errors.Join(errs...)
}

// Check checks the ledger's table as Claim does before its first use (it
// exists, is keyed by exactly (job, run_key), and done_at can record runs)
// and as Table.Check does (lock_version, privileges), and that the
// migration that creates LedgerTable is applied when the schema holds
// `fencekit migrate`'s version table; the connection's role must also be
// able to INSERT (Claim creates a run's row). See "start-up checks" above
// for what it returns. ctx bounds the catalog reads.
func (lg *Ledger) Check(ctx context.Context) error {
	if lg == nil {
		return fmt.Errorf("sqlguard: ledger: check: %w: nil *Ledger (from a failed NewLedger?)", fence.ErrInvalidArgument)
	}
	if _, err := lg.checkShape(ctx); err != nil {
		return err
	}
	errs := []error{lg.table.Check(ctx, lg.db)}
	var ins bool
	if err := lg.db.QueryRow(ctx, `SELECT pg_catalog.has_table_privilege(pg_catalog.to_regclass($1), 'INSERT')`, lg.table.ident).Scan(&ins); err != nil {
		return wrapDBErr("ledger: check", err)
	}
	errs = append(errs, privilegeProblem(lg.table.spec.Name, lg.table.ident, map[string]bool{"INSERT": ins}, "INSERT"))
	if lg.tname == LedgerTable {
		cmd := "fencekit migrate up"
		if lg.schema != "" {
			cmd += " --schema " + pgident.ShellWord(lg.schema)
		}
		errs = append(errs, migrationProblem(ctx, lg.db, lg.schema, ledgerMigration, LedgerTable, cmd))
	}
	return errors.Join(errs...)
}
