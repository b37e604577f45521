package sqlguard

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/fencekit/fencekit/fence"
	"github.com/fencekit/fencekit/internal/lockversion"
)

// Column is one column of a row and the value to write to it. Value is
// passed to pgx as a query argument, never formatted into SQL.
type Column struct {
	Name  string
	Value any
}

// Col returns Column{Name: name, Value: value}.
func Col(name string, value any) Column { return Column{Name: name, Value: value} }

// Table is a user table fenced row by row. It must have a column
//
//	lock_version BIGINT NOT NULL DEFAULT 0 CHECK (lock_version >= 0)
//
// (package migrations adds it), and key columns that identify one row: the
// primary key or a unique key (Insert and Upsert need a unique index on
// exactly those columns, as ON CONFLICT does). Each write runs one
// statement that writes only if the row's lock_version is <= the presented
// token and then sets lock_version to the token.
//
// A Table holds only names; it is safe for concurrent use, and one Table
// can be used with any number of pools, connections and transactions.
type Table struct {
	name      string // for messages: schema.table or table
	ident     string // quoted, qualified
	keys      []string
	keyIdents []string
	keyList   string // "k1", "k2"
	where     string // "k1" = $1 AND "k2" = $2
}

// CTE names used in the statements; an unqualified table with one of these
// names would be shadowed by them, so NewTable refuses it.
const (
	cteCur     = "fencekit_cur"
	cteWritten = "fencekit_w"
)

// NewTable describes the table name in schema (empty schema: found through
// the connection's search_path) with the given key columns, in the order
// in which key values are passed to the writes. Names are used exactly as
// given (case-sensitive; PostgreSQL folds unquoted names in SQL to lower
// case, so a table created as Orders is named "orders"). It does no I/O: a
// table or column that does not exist is reported by the first write.
//
// NewTable returns an error wrapping ErrInvalid, listing every problem,
// when a name is empty, longer than 63 bytes, not UTF-8 or contains a NUL
// byte, when there is no key column, when a key column repeats or is
// lock_version.
func NewTable(schema, name string, keyColumns ...string) (*Table, error) {
	var errs []error
	if schema != "" {
		errs = append(errs, checkIdent("schema", schema))
	}
	errs = append(errs, checkIdent("table", name))
	if schema == "" && (name == cteCur || name == cteWritten) {
		errs = append(errs, fmt.Errorf("%w: table name %q is reserved by sqlguard unless schema-qualified", ErrInvalid, name))
	}
	if len(keyColumns) == 0 {
		errs = append(errs, fmt.Errorf("%w: no key columns", ErrInvalid))
	}
	seen := make(map[string]bool, len(keyColumns))
	for _, k := range keyColumns {
		if err := checkIdent("key column", k); err != nil {
			errs = append(errs, err)
			continue
		}
		if k == LockVersionColumn {
			errs = append(errs, fmt.Errorf("%w: %s cannot be a key column", ErrInvalid, LockVersionColumn))
		}
		if seen[k] {
			errs = append(errs, fmt.Errorf("%w: key column %q given twice", ErrInvalid, k))
		}
		seen[k] = true
	}
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}

	t := &Table{name: name, keys: append([]string(nil), keyColumns...)}
	if schema != "" {
		t.name = schema + "." + name
		t.ident = pgx.Identifier{schema, name}.Sanitize()
	} else {
		t.ident = pgx.Identifier{name}.Sanitize()
	}
	conds := make([]string, len(keyColumns))
	for i, k := range keyColumns {
		id := pgx.Identifier{k}.Sanitize()
		t.keyIdents = append(t.keyIdents, id)
		conds[i] = id + " = $" + strconv.Itoa(i+1)
	}
	t.keyList = strings.Join(t.keyIdents, ", ")
	t.where = strings.Join(conds, " AND ")
	return t, nil
}

// Name returns the table's name as given to NewTable (schema.table or
// table), unquoted.
func (t *Table) Name() string { return t.name }

// KeyColumns returns a copy of the key column names.
func (t *Table) KeyColumns() []string { return append([]string(nil), t.keys...) }

type writeKind int

const (
	kindUpdate writeKind = iota
	kindInsert
	kindUpsert
	kindDelete
)

func (k writeKind) String() string {
	return [...]string{"update", "insert", "upsert", "delete"}[k]
}

// Update sets the given columns of the row whose key columns equal key (in
// NewTable's order; none may be NULL), and sets its lock_version to token,
// if and only if the row's lock_version is <= token. set may be empty: the
// write then only claims the row for token. It runs one statement (one
// round trip).
//
// It returns nil when the row was written; a *fence.StaleError (matching
// fence.ErrStaleToken) carrying the row's lock_version when that is newer
// than token; ErrNotFound when no row has the key; ErrAmbiguousKey when
// several rows do; ErrLockVersionType when the table's lock_version is not
// bigint (nothing written); an error matching ErrRetryable for a
// serialization failure or deadlock; an error matching
// fence.ErrOutcomeUnknown, joined with its cause, when ctx ended or the
// connection broke after the statement was sent (the write may have been
// applied, or may still be: see the package doc); any other database
// error wrapped (errors.As finds the *pgconn.PgError). Bad arguments are
// reported before any I/O: a token that is 0 or above the int64 range
// (fence.ErrInvalidToken), or an ErrInvalid (among them a NULL key
// value). ctx bounds the statement.
//
// db may be a pool or connection (the write commits on its own) or a
// pgx.Tx (the row stays locked, and the write can still be rolled back,
// until the transaction ends).
func (t *Table) Update(ctx context.Context, db DBTX, token fence.Token, key []any, set ...Column) error {
	return t.write(ctx, kindUpdate, db, token, key, set)
}

// Insert inserts a row with the key columns set to key, the given columns,
// and lock_version = token. It runs one statement (one round trip).
//
// It returns nil when the row was inserted; a *fence.StaleError when a row
// with the key exists and its lock_version is newer than token; an error
// matching ErrExists when it exists with a lock_version <= token; an error
// matching ErrRetryable when a row with the key was committed by another
// transaction after this statement's snapshot (try again to learn which
// case it is), or on a serialization failure or deadlock; other errors as
// for Update. The table needs a unique index on exactly the key columns.
// ctx bounds the statement.
func (t *Table) Insert(ctx context.Context, db DBTX, token fence.Token, key []any, cols ...Column) error {
	return t.write(ctx, kindInsert, db, token, key, cols)
}

// Upsert inserts the row, or, when a row with the key exists and its
// lock_version is <= token, updates the given columns; either way the row
// ends with lock_version = token. It runs one statement
// (INSERT ... ON CONFLICT DO UPDATE, one round trip).
//
// It returns nil when the row was inserted or updated; a *fence.StaleError
// when the row's lock_version is newer than token; an error matching
// ErrRetryable when a row with a newer lock_version was committed by
// another transaction after this statement's snapshot (nothing was
// written; try again to get the stale error with its version), or on a
// serialization failure or deadlock; other errors as for Update. The table
// needs a unique index on exactly the key columns. ctx bounds the
// statement.
func (t *Table) Upsert(ctx context.Context, db DBTX, token fence.Token, key []any, cols ...Column) error {
	return t.write(ctx, kindUpsert, db, token, key, cols)
}

// Delete deletes the row with the key if its lock_version is <= token. It
// runs one statement (one round trip) and returns what Update returns.
//
// A deleted row takes its lock_version with it: a stale holder's later
// Insert or Upsert of the same key is not rejected. Where a key can be
// re-created, fence the whole resource with a Guard as well, or mark rows
// deleted (a fenced Update) instead of deleting them.
func (t *Table) Delete(ctx context.Context, db DBTX, token fence.Token, key []any) error {
	return t.write(ctx, kindDelete, db, token, key, nil)
}

func (t *Table) write(ctx context.Context, kind writeKind, db DBTX, token fence.Token, key []any, cols []Column) error {
	op := kind.String() + " " + t.ident
	tok, err := tokenArg(token)
	if err != nil {
		return fmt.Errorf("sqlguard: %s: %w", op, err)
	}
	if err := t.check(db, key, cols); err != nil {
		return fmt.Errorf("sqlguard: %s: %w", op, err)
	}
	args := make([]any, 0, len(key)+len(cols)+1)
	args = append(args, key...)
	for _, c := range cols {
		args = append(args, c.Value)
	}
	args = append(args, tok)

	var (
		n, written int64
		current    *int64
		badType    *string
	)
	sql := t.statement(kind, cols)
	if p, ok := db.(*pgxpool.Pool); ok {
		// Acquire here rather than in p.QueryRow, so that a failure to get
		// a connection (nothing sent) is told apart from one in flight.
		c, err := p.Acquire(ctx)
		if err != nil {
			return fmt.Errorf("sqlguard: %s: acquire connection: %w", op, err)
		}
		err = c.QueryRow(ctx, sql, args...).Scan(&n, &current, &written, &badType)
		if err != nil {
			err = sentErr(op, err, c.Conn())
		}
		c.Release()
		if err != nil {
			return err
		}
	} else if err := db.QueryRow(ctx, sql, args...).Scan(&n, &current, &written, &badType); err != nil {
		return sentErr(op, err, connOf(db))
	}
	res := t.resource(key)
	switch {
	case badType != nil:
		return fmt.Errorf("sqlguard: %s: %w: %s.%s is %s, want %s", op, ErrLockVersionType, t.name, LockVersionColumn, *badType, lockversion.Type)
	case n > 1:
		return fmt.Errorf("sqlguard: %s: %w: %s matches %d rows", op, ErrAmbiguousKey, res, n)
	case written > 0:
		return nil
	case n == 0 && (kind == kindUpdate || kind == kindDelete):
		return fmt.Errorf("sqlguard: %s: %w: %s", op, ErrNotFound, res)
	case n == 0:
		return &RetryableError{Op: op, Err: fmt.Errorf("a row %s was committed concurrently, after this statement's snapshot", res)}
	case current == nil:
		return fmt.Errorf("sqlguard: %s: %s has a NULL lock_version (the column must be NOT NULL)", op, res)
	case *current > tok:
		return fence.Stale(res, token, fence.Token(*current))
	case kind == kindInsert:
		return fmt.Errorf("sqlguard: %s: %w: %s (lock_version %d)", op, ErrExists, res, *current)
	default:
		// The row was locked with lock_version <= token and still not
		// written: it changed in a way the statement could not follow.
		return &RetryableError{Op: op, Err: fmt.Errorf("%s changed concurrently", res)}
	}
}

// check validates a write's arguments, reporting every problem at once.
func (t *Table) check(db DBTX, key []any, cols []Column) error {
	var errs []error
	if isNil(db) {
		errs = append(errs, fmt.Errorf("%w: nil database", ErrInvalid))
	}
	if len(key) != len(t.keys) {
		errs = append(errs, fmt.Errorf("%w: %d key values for %d key columns", ErrInvalid, len(key), len(t.keys)))
	}
	for i, v := range key[:min(len(key), len(t.keys))] {
		if isNull(v) {
			errs = append(errs, fmt.Errorf("%w: key column %q is NULL (a NULL key matches no row and conflicts with none)", ErrInvalid, t.keys[i]))
		}
	}
	seen := make(map[string]bool, len(cols))
	for _, c := range cols {
		if err := checkIdent("column", c.Name); err != nil {
			errs = append(errs, err)
			continue
		}
		switch {
		case c.Name == LockVersionColumn:
			errs = append(errs, fmt.Errorf("%w: column %s is written by the guard only", ErrInvalid, LockVersionColumn))
		case t.isKey(c.Name):
			errs = append(errs, fmt.Errorf("%w: column %q is a key column; pass its value in key", ErrInvalid, c.Name))
		case seen[c.Name]:
			errs = append(errs, fmt.Errorf("%w: column %q given twice", ErrInvalid, c.Name))
		}
		seen[c.Name] = true
	}
	return errors.Join(errs...)
}

func (t *Table) isKey(name string) bool {
	for _, k := range t.keys {
		if k == name {
			return true
		}
	}
	return false
}

// resource describes one row for errors: schema.table(k1=v1, k2=v2).
func (t *Table) resource(key []any) string {
	var b strings.Builder
	b.WriteString(t.name)
	b.WriteByte('(')
	for i, k := range t.keys {
		if i > 0 {
			b.WriteString(", ")
		}
		fmt.Fprintf(&b, "%s=%v", k, key[i])
	}
	b.WriteByte(')')
	return b.String()
}

// statement builds the single statement for a write. Its parameters are the
// key values ($1..$n), the column values, then the token. It returns one
// row: how many rows have the key (locked, newest committed version), the
// greatest of their lock_versions, how many rows were written, and, when
// the lock_version column is not bigint, its type (NULL otherwise).
//
// Locking the row first and comparing against the locked version is what
// makes the reported version exact under READ COMMITTED: SELECT ... FOR
// [NO KEY] UPDATE waits for a concurrent writer and then returns the row's
// newest committed version, and the write's own WHERE (re-checked by
// PostgreSQL on that newest version) compares against the same value.
//
// Every write is conditional on the column's type being bigint
// (lockversion.IsBigint, no catalog read): with any other type nothing is
// written, and the column is read through a cast only when it is bigint, so
// the statement parses, the token is passed as a bigint and nothing fails
// before the check, whatever the type (real, numeric, integer, text...).
func (t *Table) statement(kind writeKind, cols []Column) string {
	nk := len(t.keys)
	tokParam := "$" + strconv.Itoa(nk+len(cols)+1) + "::bigint"
	// What is stored: a subquery, so that a custom plan cannot fold the
	// assignment cast to a column of another type (which would fail at
	// planning, before the type check, for a token out of its range).
	tokValue := "(SELECT " + tokParam + ")"
	colIdents := make([]string, len(cols))
	colParams := make([]string, len(cols))
	for i, c := range cols {
		colIdents[i] = pgx.Identifier{c.Name}.Sanitize()
		colParams[i] = "$" + strconv.Itoa(nk+i+1)
	}
	lv := pgx.Identifier{LockVersionColumn}.Sanitize()
	isBigint := lockversion.IsBigint(t.ident)
	guard := "(SELECT count(*) FROM " + cteCur + ") = 1 AND (SELECT max(fencekit_v) FROM " + cteCur + ") <= " + tokParam

	// The lock a plain UPDATE or DELETE of the row would take: FOR NO KEY
	// UPDATE does not block foreign-key checks of referencing rows.
	lock := " FOR NO KEY UPDATE"
	if kind == kindDelete {
		lock = " FOR UPDATE"
	}
	var b strings.Builder
	b.WriteString("WITH " + cteCur + " AS (SELECT CASE WHEN " + isBigint + " THEN " + lv + "::text::bigint END AS fencekit_v FROM " +
		t.ident + " WHERE " + t.where + lock + "), ")
	b.WriteString(cteWritten + " AS (")
	switch kind {
	case kindUpdate:
		b.WriteString("UPDATE " + t.ident + " SET ")
		for i := range cols {
			b.WriteString(colIdents[i] + " = " + colParams[i] + ", ")
		}
		b.WriteString(lv + " = " + tokValue + " WHERE " + t.where + " AND " + guard)
	case kindDelete:
		b.WriteString("DELETE FROM " + t.ident + " WHERE " + t.where + " AND " + guard)
	case kindInsert, kindUpsert:
		targets := append(append(append([]string(nil), t.keyIdents...), colIdents...), lv)
		params := make([]string, 0, len(targets))
		for i := 1; i <= nk; i++ {
			params = append(params, "$"+strconv.Itoa(i))
		}
		params = append(append(params, colParams...), tokValue)
		b.WriteString("INSERT INTO " + t.ident + " AS fencekit_t (" + strings.Join(targets, ", ") + ") ")
		b.WriteString("SELECT " + strings.Join(params, ", ") + " WHERE " + isBigint)
		if kind == kindInsert {
			b.WriteString(" AND NOT EXISTS (SELECT 1 FROM " + cteCur + ")")
			b.WriteString(" ON CONFLICT (" + t.keyList + ") DO NOTHING")
		} else {
			b.WriteString(" ON CONFLICT (" + t.keyList + ") DO UPDATE SET ")
			for _, id := range colIdents {
				b.WriteString(id + " = EXCLUDED." + id + ", ")
			}
			b.WriteString(lv + " = EXCLUDED." + lv + " WHERE fencekit_t." + lv + " <= EXCLUDED." + lv)
		}
	}
	b.WriteString(" RETURNING 1) SELECT (SELECT count(*) FROM " + cteCur + "), (SELECT max(fencekit_v) FROM " + cteCur + "), (SELECT count(*) FROM " +
		cteWritten + "), CASE WHEN " + isBigint + " THEN NULL ELSE pg_catalog.format_type(" + lockversion.TypeOf(t.ident) + ", NULL) END")
	return b.String()
}
