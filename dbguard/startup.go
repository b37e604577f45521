package dbguard

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/fencekit/fencekit/fence"
	"github.com/fencekit/fencekit/internal/rowguard"
)

// The start-up checks (Guard.Check, Table.Check, Ledger.Check) are what
// lease.Manager.Check is for a lease backend: run them once when the
// program starts, and a database not set up for the guard shows then,
// with its fix, rather than at the first write. Each reads the catalog,
// and checks the privileges the guard uses by running its statements in a
// form that changes nothing (UPDATE ... WHERE 1 = 0: MySQL and SQLite
// check privileges, and refuse a read-only server or file, whatever rows
// match; neither has statement-level triggers, so nothing runs). Each
// returns nil, or every problem it found as a *fence.SetupError naming
// its fix (joined with errors.Join: errors.Is(err, fence.ErrSetup), and
// so lease.ErrSetup, holds), or the database's error when the catalog
// could not be read.

// versionTable is the table where `fencekit migrate` (package migrations)
// records the migrations it applied.
const versionTable = "fencekit_goose_version"

// column is one column of a table, as the catalog says.
type column struct {
	typ        string // declared type (MySQL: COLUMN_TYPE)
	notNull    bool
	hasDefault bool // a default other than NULL, or a generated column
}

// columns reads the columns of table in database (""; the connection's
// current database, SQLite's main), keyed by name (MySQL: lower-cased, as
// it compares column names). No column: the table does not exist.
func (d Dialect) columns(ctx context.Context, db DBTX, database, table string) (map[string]column, error) {
	// MariaDB shows a default of NULL as the text 'NULL'.
	q := `SELECT COLUMN_NAME, COLUMN_TYPE, IS_NULLABLE = 'NO',
		(COLUMN_DEFAULT IS NOT NULL AND COLUMN_DEFAULT <> 'NULL') OR EXTRA LIKE '%GENERATED%'
		FROM information_schema.COLUMNS WHERE ` + mysqlSchema
	args := []any{database, table}
	if d == SQLite {
		if database == "" {
			database = "main"
		}
		// hidden: 1 a virtual table's hidden column, 2 and 3 generated.
		q, args = `SELECT name, type, "notnull", dflt_value IS NOT NULL OR hidden IN (2, 3)
			FROM pragma_table_xinfo(?, ?) WHERE hidden <> 1`, []any{table, database}
	}
	rows, err := db.QueryContext(ctx, q, args...)
	if err != nil {
		return nil, d.wrapDBErr("check "+table, err)
	}
	cols := map[string]column{}
	for rows.Next() {
		var name string
		var c column
		if err := rows.Scan(&name, &c.typ, &c.notNull, &c.hasDefault); err != nil {
			rows.Close()
			return nil, fmt.Errorf("dbguard: check %s: %w", table, err)
		}
		if d == MySQL {
			name = strings.ToLower(name)
		}
		cols[name] = c
	}
	if err := errors.Join(rows.Err(), rows.Close()); err != nil {
		return nil, d.wrapDBErr("check "+table, err)
	}
	return cols, nil
}

// uniqueIndexes returns the columns of each unique index of table (the
// primary key among them), in index order; partial indexes (SQLite) are
// left out.
func (d Dialect) uniqueIndexes(ctx context.Context, db DBTX, database, table string) ([][]string, error) {
	q := `SELECT INDEX_NAME, COLUMN_NAME FROM information_schema.STATISTICS WHERE ` + mysqlSchema +
		` AND NON_UNIQUE = 0 ORDER BY INDEX_NAME, SEQ_IN_INDEX`
	args := []any{database, table}
	if d == SQLite {
		if database == "" {
			database = "main"
		}
		q = `SELECT '', name FROM pragma_table_info(?1, ?2) WHERE pk > 0
			UNION ALL SELECT * FROM (SELECT 'i' || il.name, ii.name FROM pragma_index_list(?1, ?2) AS il, pragma_index_info(il.name, ?2) AS ii
				WHERE il."unique" = 1 AND il.partial = 0 AND il.origin <> 'pk' ORDER BY il.name, ii.seqno)`
		args = []any{table, database}
	}
	rows, err := db.QueryContext(ctx, q, args...)
	if err != nil {
		return nil, d.wrapDBErr("check the indexes of "+table, err)
	}
	var idx [][]string
	last := "\x00"
	for rows.Next() {
		var name, col string
		if err := rows.Scan(&name, &col); err != nil {
			rows.Close()
			return nil, fmt.Errorf("dbguard: check the indexes of %s: %w", table, err)
		}
		if name != last {
			idx = append(idx, nil)
			last = name
		}
		idx[len(idx)-1] = append(idx[len(idx)-1], col)
	}
	if err := errors.Join(rows.Err(), rows.Close()); err != nil {
		return nil, d.wrapDBErr("check the indexes of "+table, err)
	}
	return idx, nil
}

// col returns the column name of cols, found as the dialect compares
// names.
func (d Dialect) col(cols map[string]column, name string) (column, bool) {
	if d == MySQL {
		name = strings.ToLower(name)
	}
	c, ok := cols[name]
	return c, ok
}

// privileges runs each of stmts (a privilege, and a statement that needs
// it and changes nothing) and returns the problems: the privileges
// refused, as one *fence.SetupError naming the GRANT on what (quoted), and
// a server or file that takes no writes.
func (d Dialect) privileges(ctx context.Context, db DBTX, what string, stmts [][2]string) error {
	var missing []string
	for _, ps := range stmts {
		_, err := db.ExecContext(ctx, ps[1])
		switch {
		case err == nil:
		case d.refused(err):
			missing = append(missing, ps[0])
		default:
			return d.wrapDBErr("check "+what, err)
		}
	}
	if len(missing) == 0 {
		return nil
	}
	return fence.Setup("GRANT "+strings.Join(missing, ", ")+" ON "+what+" TO the database user",
		"dbguard: check: the database user lacks %s on %s", strings.Join(missing, ", "), what)
}

// hidden returns the server's refusal when the user may not read column
// of table (quoted) at all: MySQL's catalog then shows neither, so that a
// table or column that looks missing may only be out of the user's sight.
// It returns nil otherwise (SQLite has no privileges).
func (d Dialect) hidden(ctx context.Context, db DBTX, table, column string) error {
	if d != MySQL {
		return nil
	}
	if _, err := db.ExecContext(ctx, "SELECT "+d.quote(column)+" FROM "+table+" WHERE 1 = 0"); d.refused(err) {
		return d.wrapDBErr("check "+table, err)
	}
	return nil
}

// refused reports whether err is a privilege the server refused.
func (d Dialect) refused(err error) bool {
	n, ok := mysqlNumber(err)
	return ok && d == MySQL && (n == myTableDenied || n == myColumnDenied || n == myDBAccessDenied)
}

// migrationProblem reports, when database holds fencekit's version table
// (the toolkit was migrated with `fencekit migrate`) and the user may read
// it, that migration version is not among those it applied.
func (d Dialect) migrationProblem(ctx context.Context, db DBTX, database string, version int, what string) error {
	cols, err := d.columns(ctx, db, database, versionTable)
	if err != nil || len(cols) == 0 {
		return err
	}
	var n int
	err = db.QueryRowContext(ctx, `SELECT COUNT(*) FROM `+d.qualified(database, versionTable)+` WHERE version_id = ?`, version).Scan(&n)
	switch {
	case d.refused(err):
		return nil // a user that may not read it: the shapes were checked
	case err != nil:
		return d.wrapDBErr("check the migrations", err)
	case n > 0:
		return nil
	}
	return fence.Setup("run `fencekit migrate up --dialect "+d.String()+"` (or migrations.Up with migrations.WithDialect)",
		"dbguard: check: %w: migration %05d (%s) is not applied", fence.ErrNotMigrated, version, what)
}

// resourceMigration is the migration that creates the resource table.
const resourceMigration = 1

// Check checks, through db, that the database is set up for the Guard:
// the toolkit's table fencekit_resource_tokens is where the Guard looks
// (Options.Database), its token column holds every token (BIGINT
// UNSIGNED on MySQL, INTEGER on SQLite); the database user may SELECT,
// INSERT and UPDATE it; the migration that creates it is applied (when
// the database holds `fencekit migrate`'s version table); and the server
// or file takes writes. See "start-up checks" above for what it returns.
// ctx bounds the statements.
func (g *Guard) Check(ctx context.Context, db DBTX) error {
	if rowguard.IsNil(db) {
		return fmt.Errorf("dbguard: check: %w: nil database", fence.ErrInvalidArgument)
	}
	cols, err := g.d.columns(ctx, db, g.opts.Database, ResourceTable)
	if err != nil {
		return err
	}
	t := g.table
	privileges := func() error {
		return g.d.privileges(ctx, db, t, [][2]string{
			{"SELECT", "SELECT " + g.d.quote("token") + " FROM " + t + " WHERE 1 = 0"},
			{"INSERT", "INSERT INTO " + t + " (" + g.d.quote("resource") + ", " + g.d.quote("token") + ") SELECT " + g.d.quote("resource") + ", " + g.d.quote("token") + " FROM " + t + " WHERE 1 = 0"},
			{"UPDATE", "UPDATE " + t + " SET " + g.d.quote("token") + " = " + g.d.quote("token") + " WHERE 1 = 0"},
		})
	}
	tok, ok := g.d.col(cols, "token")
	if !ok {
		if err := g.d.hidden(ctx, db, t, "token"); err != nil {
			return cmp.Or(privileges(), err)
		}
	}
	if len(cols) == 0 {
		return g.notMigrated("check", nil)
	}
	var errs []error
	if want, fit := g.d.tokenType(tok.typ); !ok || !fit {
		errs = append(errs, fence.Setup("run `fencekit migrate up --dialect "+g.d.String()+"` on a database without a table of that name, or drop the table first",
			"dbguard: check: %w: %s.token is %q, want %s", fence.ErrNotMigrated, ResourceTable, tok.typ, want))
	}
	errs = append(errs, privileges())
	errs = append(errs, g.d.migrationProblem(ctx, db, g.opts.Database, resourceMigration, ResourceTable))
	return errors.Join(errs...)
}

// tokenType returns the type a column holding tokens must have, and
// whether typ is it.
func (d Dialect) tokenType(typ string) (want string, fit bool) {
	t := strings.ToUpper(typ)
	if d == MySQL {
		return "BIGINT UNSIGNED", strings.HasPrefix(t, "BIGINT") && strings.Contains(t, "UNSIGNED")
	}
	// SQLite's type affinity rule: a declared type containing "INT" has
	// INTEGER affinity (https://sqlite.org/datatype3.html, 3.1).
	return "INTEGER", strings.Contains(t, "INT")
}

// Check checks, through db, that the table is set up for row-level
// fencing: it exists (as NewTable names it); it has a lock_version column
// that holds every token (BIGINT UNSIGNED on MySQL, INTEGER on SQLite),
// NOT NULL, and the key columns; a unique index (or the primary key) is
// on exactly the key columns, which Insert and Upsert need; the database
// user may SELECT and UPDATE it, which every write needs (the rejection
// path locks the row); and the server or file takes writes. INSERT and
// DELETE are not asked for: a table written only by Update needs
// neither. See "start-up checks" above for what it returns. ctx bounds
// the statements.
func (t *Table) Check(ctx context.Context, db DBTX) error {
	if rowguard.IsNil(db) {
		return fmt.Errorf("dbguard: check %s: %w: nil database", t.spec.Name, fence.ErrInvalidArgument)
	}
	op := "check " + t.ident
	cols, err := t.d.columns(ctx, db, t.database, t.table)
	if err != nil {
		return err
	}
	lvq := t.d.quote(LockVersionColumn)
	privileges := func() error {
		return t.d.privileges(ctx, db, t.ident, [][2]string{
			{"SELECT", "SELECT " + lvq + " FROM " + t.ident + " WHERE 1 = 0"},
			{"UPDATE", "UPDATE " + t.ident + " SET " + lvq + " = " + lvq + " WHERE 1 = 0"},
		})
	}
	lv, ok := t.d.col(cols, LockVersionColumn)
	if !ok {
		if err := t.d.hidden(ctx, db, t.ident, LockVersionColumn); err != nil {
			return cmp.Or(privileges(), err)
		}
	}
	if len(cols) == 0 {
		return t.noTable(op, nil)
	}
	var errs []error
	want, fit := t.d.tokenType(lv.typ)
	switch {
	case !ok:
		errs = append(errs, t.noLockVersion(op, nil))
	case !fit:
		errs = append(errs, t.lockVersionType(op, fmt.Sprintf("%s.%s is %s, want %s", t.spec.Name, LockVersionColumn, lv.typ, want), nil))
	case !lv.notNull:
		errs = append(errs, t.lockVersionType(op, fmt.Sprintf("%s.%s is nullable: a NULL lock_version cannot be fenced", t.spec.Name, LockVersionColumn), nil))
	}
	var missing []string
	for _, k := range t.spec.Keys {
		if _, ok := t.d.col(cols, k); !ok {
			missing = append(missing, k)
		}
	}
	if len(missing) > 0 {
		errs = append(errs, fence.Setup("give NewTable the key columns as the table spells them",
			"dbguard: %s: %w: %s has no column %s", op, fence.ErrNoTable, t.spec.Name, strings.Join(missing, ", ")))
	} else if info, err := t.readCatalog(ctx, op, db); err == nil && !info.unique {
		errs = append(errs, fence.Setup(t.uniqueFix(),
			"dbguard: %s: %w: no unique index on exactly (%s): a key may match several rows, and Insert and Upsert cannot run",
			op, fence.ErrAmbiguousKey, strings.Join(t.spec.Keys, ", ")))
	}
	errs = append(errs, privileges())
	return errors.Join(errs...)
}

// uniqueFix is the statement that gives the table a unique index on the
// key columns.
func (t *Table) uniqueFix() string {
	keys := make([]string, len(t.spec.Keys))
	for i, k := range t.spec.Keys {
		keys[i] = t.d.quote(k)
	}
	name := t.d.quote(t.table + "_fencekit_key")
	if t.d == SQLite && t.database != "" {
		name = t.d.quote(t.database) + "." + name
		return "CREATE UNIQUE INDEX " + name + " ON " + t.d.quote(t.table) + " (" + strings.Join(keys, ", ") + ") (or make them the primary key)"
	}
	return "CREATE UNIQUE INDEX " + name + " ON " + t.ident + " (" + strings.Join(keys, ", ") + ") (or make them the primary key)"
}
