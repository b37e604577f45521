package dbguard

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/fencekit/fencekit/fence"
)

// info returns what the table's first check found, checking it now if no
// check has succeeded yet: that the table exists, that its lock_version
// column can hold every token, and whether a unique index has exactly the
// key columns. One catalog read at the table's first write on MySQL, one
// or two on SQLite (and again after a failed check); nothing of the write
// is sent before.
//
// It is a setup check, kept by the Table, and nothing safe rests on it: a
// Table may be used on several databases, and a table may be altered
// after its first write. Each write's statement checks, itself, what its
// tokens need of the row it reaches (see writeSQL), and the rejection
// path reads the catalog again (readCatalog) in its transaction.
func (t *Table) info(ctx context.Context, op string, db DBTX) (*tableInfo, error) {
	if ti := t.checked.Load(); ti != nil {
		return ti, nil
	}
	ti, err := t.readCatalog(ctx, op, db)
	if err != nil {
		return nil, err
	}
	t.checked.Store(ti)
	return ti, nil
}

// readCatalog reads the catalog of the table that db reaches now: fence.ErrNoTable,
// fence.ErrNoLockVersion or fence.ErrLockVersionType when it is not fit, and whether a
// unique index has exactly the key columns.
func (t *Table) readCatalog(ctx context.Context, op string, db DBTX) (*tableInfo, error) {
	if t.d == MySQL {
		return t.checkMySQL(ctx, op, db)
	}
	return t.checkSQLite(ctx, op, db)
}

// mysqlSchema is the database of an information_schema query: the
// Table's, or the connection's current one.
const mysqlSchema = "TABLE_SCHEMA = COALESCE(NULLIF(?, ''), DATABASE()) AND TABLE_NAME = ?"

// checkMySQL is one catalog read: the table's columns, lock_version's
// type, and whether a unique index has exactly the key columns (compared
// by the catalog, as MySQL compares column names: without case).
func (t *Table) checkMySQL(ctx context.Context, op string, db DBTX) (*tableInfo, error) {
	keys := strings.TrimSuffix(strings.Repeat("?, ", len(t.spec.Keys)), ", ")
	args := []any{t.database, t.table, len(t.spec.Keys)}
	for _, k := range t.spec.Keys {
		args = append(args, k)
	}
	args = append(args, len(t.spec.Keys), t.database, t.table)
	var ncols int
	var dataType, colType string
	var unique bool
	err := db.QueryRowContext(ctx, `SELECT COUNT(*),
		COALESCE(MAX(CASE WHEN COLUMN_NAME = 'lock_version' THEN DATA_TYPE END), ''),
		COALESCE(MAX(CASE WHEN COLUMN_NAME = 'lock_version' THEN COLUMN_TYPE END), ''),
		EXISTS (SELECT 1 FROM information_schema.STATISTICS WHERE `+mysqlSchema+` AND NON_UNIQUE = 0
			GROUP BY INDEX_NAME HAVING COUNT(*) = ? AND SUM(COLUMN_NAME IN (`+keys+`)) = ?)
		FROM information_schema.COLUMNS WHERE `+mysqlSchema, args...).Scan(&ncols, &dataType, &colType, &unique)
	if err != nil {
		return nil, t.d.wrapDBErr(op+": check the table", err)
	}
	if colType == "" {
		if err := t.d.hidden(ctx, db, t.ident, LockVersionColumn); err != nil {
			return nil, err
		}
	}
	if err := t.checkColumn(op, ncols, colType, strings.EqualFold(dataType, "bigint") && strings.Contains(strings.ToLower(colType), "unsigned"), "BIGINT UNSIGNED"); err != nil {
		return nil, err
	}
	return &tableInfo{unique: unique}, nil
}

func (t *Table) checkSQLite(ctx context.Context, op string, db DBTX) (*tableInfo, error) {
	schema := t.database
	if schema == "" {
		schema = "main"
	}
	rows, err := db.QueryContext(ctx, `SELECT name, type, pk FROM pragma_table_info(?, ?)`, t.table, schema)
	if err != nil {
		return nil, t.d.wrapDBErr(op+": check the table", err)
	}
	var (
		ncols  int
		lvType string
		hasLV  bool
		pk     []string
	)
	for rows.Next() {
		var name, typ string
		var pkPos int
		if err := rows.Scan(&name, &typ, &pkPos); err != nil {
			rows.Close()
			return nil, fmt.Errorf("dbguard: %s: check the table: %w", op, err)
		}
		ncols++
		if name == LockVersionColumn {
			lvType, hasLV = typ, true
		}
		if pkPos > 0 {
			pk = append(pk, name)
		}
	}
	if err := errors.Join(rows.Err(), rows.Close()); err != nil {
		return nil, t.d.wrapDBErr(op+": check the table", err)
	}
	if !hasLV {
		lvType = ""
	} else if lvType == "" {
		lvType = "(no declared type)"
	}
	// SQLite's type affinity rule: a declared type containing "INT" has
	// INTEGER affinity (https://sqlite.org/datatype3.html, 3.1).
	if err := t.checkColumn(op, ncols, lvType, strings.Contains(strings.ToUpper(lvType), "INT"), "INTEGER"); err != nil {
		return nil, err
	}
	if sameSet(pk, t.spec.Keys) {
		return &tableInfo{unique: true}, nil
	}
	rows, err = db.QueryContext(ctx, `SELECT il.name, ii.name FROM pragma_index_list(?, ?) AS il, pragma_index_info(il.name, ?) AS ii
		WHERE il."unique" = 1 AND il.partial = 0 ORDER BY il.name, ii.seqno`, t.table, schema, schema)
	if err != nil {
		return nil, t.d.wrapDBErr(op+": check the table's indexes", err)
	}
	return t.uniqueFrom(op, rows)
}

// checkColumn reports a missing table or lock_version column, or a
// lock_version column of the wrong type.
func (t *Table) checkColumn(op string, ncols int, colType string, ok bool, want string) error {
	switch {
	case ncols == 0:
		return t.noTable(op, nil)
	case colType == "":
		return t.noLockVersion(op, nil)
	case !ok:
		return t.lockVersionType(op, fmt.Sprintf("%s.%s is %s, want %s", t.spec.Name, LockVersionColumn, colType, want), nil)
	}
	return nil
}

// noTable, noLockVersion and lockVersionType are the table's setup
// errors; err is the driver's error, or nil when a check found the
// problem.
func (t *Table) noTable(op string, err error) error {
	return &fence.SetupError{Err: withCause(fmt.Errorf("dbguard: %s: %w: %s", op, fence.ErrNoTable, t.spec.Name), err),
		Fix: "create the table, or give NewTable its database and name as the server spells them"}
}

func (t *Table) noLockVersion(op string, err error) error {
	return &fence.SetupError{Err: withCause(fmt.Errorf("dbguard: %s: %w: %s", op, fence.ErrNoLockVersion, t.spec.Name), err),
		Fix: fmt.Sprintf("add it with `fencekit migrate add-lock-version --dialect %s --table %s --apply` (or migrations.ApplyLockVersion with migrations.WithDialect)", t.d, t.spec.Name)}
}

func (t *Table) lockVersionType(op, what string, err error) error {
	want := "BIGINT UNSIGNED NOT NULL"
	if t.d == SQLite {
		want = "INTEGER NOT NULL, holding integers only"
	}
	return &fence.SetupError{Err: withCause(fmt.Errorf("dbguard: %s: %w: %s", op, fence.ErrLockVersionType, what), err),
		Fix: "make " + t.spec.Name + "." + LockVersionColumn + " " + want}
}

// withCause joins the driver's error err (if any) to what.
func withCause(what, err error) error {
	if err == nil {
		return what
	}
	return fmt.Errorf("%w: %w", what, err)
}

// uniqueFrom reads (index, column) rows of the table's unique indexes and
// reports whether one has exactly the key columns.
func (t *Table) uniqueFrom(op string, rows interface {
	Next() bool
	Scan(...any) error
	Err() error
	Close() error
}) (*tableInfo, error) {
	idx := map[string][]string{}
	for rows.Next() {
		var name, col string
		if err := rows.Scan(&name, &col); err != nil {
			rows.Close()
			return nil, fmt.Errorf("dbguard: %s: check the table's indexes: %w", op, err)
		}
		idx[name] = append(idx[name], col)
	}
	if err := errors.Join(rows.Err(), rows.Close()); err != nil {
		return nil, t.d.wrapDBErr(op+": check the table's indexes", err)
	}
	for _, cols := range idx {
		if sameSet(cols, t.spec.Keys) {
			return &tableInfo{unique: true}, nil
		}
	}
	return &tableInfo{unique: false}, nil
}

func sameSet(a, b []string) bool {
	if len(a) != len(b) || len(a) == 0 {
		return false
	}
	a, b = slices.Clone(a), slices.Clone(b)
	slices.Sort(a)
	slices.Sort(b)
	return slices.Equal(a, b)
}

// schemaErr returns the error of the Table's setup that a statement's
// failure err says, or nil: the table is missing (fence.ErrNoTable), or its
// lock_version column (fence.ErrNoLockVersion: dropped after the table's first
// check, or never there in the database this statement reached), or the
// column cannot hold the token (fence.ErrLockVersionType: MySQL's "out of range"
// in strict mode; nothing was written). What the first check learned is
// dropped when the table or column is missing, so that the next write
// checks again.
func (t *Table) schemaErr(op string, err error) error {
	var noTable, noColumn, outOfRange bool
	if n, ok := mysqlNumber(err); ok && t.d == MySQL {
		noTable = n == myNoSuchTable
		noColumn = n == myBadField && strings.Contains(err.Error(), "'"+LockVersionColumn+"'")
		outOfRange = n == myOutOfRange && strings.Contains(err.Error(), "'"+LockVersionColumn+"'")
	}
	if c, ok := sqliteCode(err); ok && t.d == SQLite && c&0xff == sqliteError {
		noTable = strings.Contains(err.Error(), "no such table")
		noColumn = strings.Contains(err.Error(), "no such column: "+LockVersionColumn)
	}
	switch {
	case noTable:
		t.checked.Store(nil)
		return t.noTable(op, err)
	case noColumn:
		t.checked.Store(nil)
		return t.noLockVersion(op, err)
	case outOfRange:
		return t.lockVersionType(op, fmt.Sprintf("%s.%s cannot hold the token", t.spec.Name, LockVersionColumn), err)
	}
	return nil
}
