package dbguard

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
)

// info returns what the table's first check found, checking it now if no
// check has succeeded yet: that the table exists, that its lock_version
// column can hold every token, and whether a unique index has exactly the
// key columns. One or two catalog reads at the table's first write (and
// again after a failed check); nothing of the write is sent before.
//
// What the check learned is not read again: a lock_version column altered
// to another type afterwards is seen only by the rejection path (which
// reads the stored value and refuses one that is not an integer), and a
// unique index dropped afterwards only when a write reaches several rows.
func (t *Table) info(ctx context.Context, op string, db DBTX) (*tableInfo, error) {
	if ti := t.checked.Load(); ti != nil {
		return ti, nil
	}
	var (
		ti  *tableInfo
		err error
	)
	if t.d == MySQL {
		ti, err = t.checkMySQL(ctx, op, db)
	} else {
		ti, err = t.checkSQLite(ctx, op, db)
	}
	if err != nil {
		return nil, err
	}
	t.checked.Store(ti)
	return ti, nil
}

// mysqlSchema is the database of an information_schema query: the
// Table's, or the connection's current one.
const mysqlSchema = "TABLE_SCHEMA = COALESCE(NULLIF(?, ''), DATABASE()) AND TABLE_NAME = ?"

func (t *Table) checkMySQL(ctx context.Context, op string, db DBTX) (*tableInfo, error) {
	var ncols int
	var dataType, colType string
	err := db.QueryRowContext(ctx, `SELECT COUNT(*),
		COALESCE(MAX(CASE WHEN COLUMN_NAME = 'lock_version' THEN DATA_TYPE END), ''),
		COALESCE(MAX(CASE WHEN COLUMN_NAME = 'lock_version' THEN COLUMN_TYPE END), '')
		FROM information_schema.COLUMNS WHERE `+mysqlSchema, t.database, t.table).Scan(&ncols, &dataType, &colType)
	if err != nil {
		return nil, t.d.wrapDBErr(op+": check the table", err)
	}
	if err := t.checkColumn(op, ncols, colType, strings.EqualFold(dataType, "bigint") && strings.Contains(strings.ToLower(colType), "unsigned"), "BIGINT UNSIGNED"); err != nil {
		return nil, err
	}
	rows, err := db.QueryContext(ctx, `SELECT INDEX_NAME, COLUMN_NAME FROM information_schema.STATISTICS
		WHERE `+mysqlSchema+` AND NON_UNIQUE = 0 ORDER BY INDEX_NAME, SEQ_IN_INDEX`, t.database, t.table)
	if err != nil {
		return nil, t.d.wrapDBErr(op+": check the table's indexes", err)
	}
	return t.uniqueFrom(op, rows)
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
	if sameSet(pk, t.keys) {
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
		return fmt.Errorf("dbguard: %s: %w: %s", op, ErrNoTable, t.name)
	case colType == "":
		return fmt.Errorf("dbguard: %s: %w: add it to %s with `fencekit migrate add-lock-version --dialect %s --table %s --apply` (or migrations.ApplyLockVersionFor)",
			op, ErrNoLockVersion, t.name, t.d, t.name)
	case !ok:
		return fmt.Errorf("dbguard: %s: %w: %s.%s is %s, want %s", op, ErrLockVersionType, t.name, LockVersionColumn, colType, want)
	}
	return nil
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
		if sameSet(cols, t.keys) {
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

// noLockVersion returns an error matching ErrNoLockVersion when err says
// that the column lock_version does not exist (dropped after the table's
// first check), and nil otherwise.
func (t *Table) noLockVersion(op string, err error) error {
	missing := false
	if n, ok := mysqlNumber(err); ok && t.d == MySQL {
		missing = n == myBadField && strings.Contains(err.Error(), "'"+LockVersionColumn+"'")
	}
	if c, ok := sqliteCode(err); ok && t.d == SQLite {
		missing = c&0xff == sqliteError && strings.Contains(err.Error(), "no such column: "+LockVersionColumn)
	}
	if !missing {
		return nil
	}
	t.checked.Store(nil)
	return fmt.Errorf("dbguard: %s: %w: add it to %s with `fencekit migrate add-lock-version --dialect %s --table %s --apply`: %w",
		op, ErrNoLockVersion, t.name, t.d, t.name, err)
}
