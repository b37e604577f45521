package sqlguard

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/fencekit/fencekit/fence"
	"github.com/fencekit/fencekit/internal/lockversion"
	"github.com/fencekit/fencekit/internal/pgident"
	"github.com/fencekit/fencekit/internal/rowguard"
)

// Column is one column of a row and the value to write to it: Name, and
// Value, passed to pgx as a query argument, never formatted into SQL. It is
// the same type as dbguard.Column.
type Column = rowguard.Column

// Col returns Column{Name: name, Value: value}.
func Col(name string, value any) Column { return Column{Name: name, Value: value} }

// Table is a user table fenced row by row. It must have a column
//
//	lock_version BIGINT NOT NULL DEFAULT 0 CHECK (lock_version >= 0)
//
// (package migrations adds it), and key columns that identify one row: the
// primary key or a unique key (Insert and Upsert need a unique index on
// exactly those columns, as ON CONFLICT does). Each write writes only if
// the row's lock_version is <= the presented token and then sets
// lock_version to the token: one statement, one round trip, when it
// succeeds; a second statement says why when it does not (see the package
// doc).
//
// A Table holds names and the statements it built from them; it is safe
// for concurrent use, and one Table can be used with any number of pools,
// connections and transactions (each connection checks the table once,
// at its first write to it).
type Table struct {
	spec      *rowguard.Spec // the name for messages (schema.table or table) and the key columns
	cliName   string         // as fencekit migrate add-lock-version --table takes it
	ident     string         // quoted, qualified
	keyIdents []string
	keyList   string    // "k1", "k2"
	where     string    // "k1" = $1 AND "k2" = $2
	probeKey  string    // where a connection records its first-use check (pgconn.CustomData)
	ops       [4]string // "update \"t\"" and so on, for errors
	obs       fence.WriteObserver

	// stmts holds the statements built for the most recent list of
	// columns of each write kind.
	stmts *rowguard.Statements[*statements]
}

// statements are the two statements of one write kind and column list.
type statements struct {
	fast string // the success path: writes, or changes nothing
	full string // the exact statement: locks the row, reports why not
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
// NewTable returns an error wrapping fence.ErrInvalidArgument, listing every problem,
// when a name is empty, longer than 63 bytes, not UTF-8 or contains a NUL
// byte, when there is no key column, when a key column repeats or is
// lock_version.
func NewTable(schema, name string, keyColumns ...string) (*Table, error) {
	spec, err := rowguard.NewSpec("sqlguard", checkIdent, schema, name, keyColumns)
	if schema == "" && (name == cteCur || name == cteWritten) {
		err = errors.Join(err, fmt.Errorf("%w: table name %q is reserved by sqlguard unless schema-qualified", fence.ErrInvalidArgument, name))
	}
	if err != nil {
		return nil, err
	}

	t := &Table{spec: spec, stmts: &rowguard.Statements[*statements]{}}
	if schema != "" {
		t.ident = pgx.Identifier{schema, name}.Sanitize()
		t.cliName = cliIdent(schema) + "." + cliIdent(name)
	} else {
		t.ident = pgx.Identifier{name}.Sanitize()
		t.cliName = cliIdent(name)
	}
	conds := make([]string, len(keyColumns))
	for i, k := range keyColumns {
		id := pgx.Identifier{k}.Sanitize()
		t.keyIdents = append(t.keyIdents, id)
		conds[i] = id + " = $" + strconv.Itoa(i+1)
	}
	t.keyList = strings.Join(t.keyIdents, ", ")
	t.where = strings.Join(conds, " AND ")
	t.probeKey = "fencekit/sqlguard: fast path for " + t.ident + " (" + t.keyList + ")"
	for k := range t.ops {
		t.ops[k] = rowguard.Kind(k).String() + " " + t.ident
	}
	return t, nil
}

// cliIdent spells one identifier the way `fencekit migrate` reads table
// names (SQL's rules): as is when SQL would not fold or misread it
// (lower-case letters, digits, underscores, not starting with a digit),
// double-quoted otherwise.
func cliIdent(s string) string {
	plain := s != ""
	for i, r := range s {
		if !(r == '_' || ('a' <= r && r <= 'z') || (i > 0 && '0' <= r && r <= '9')) {
			plain = false
			break
		}
	}
	if plain {
		return s
	}
	return `"` + strings.ReplaceAll(s, `"`, `""`) + `"`
}

// Name returns the table's name as given to NewTable (schema.table or
// table), unquoted.
func (t *Table) Name() string { return t.spec.Name }

// WithObserver returns a Table like t whose writes report a
// fence.WriteEvent to o (Guard "sqlguard", Class the table's Name, Op
// "update", "insert", "upsert" or "delete"), after each write's outcome is
// known. t itself is unchanged. o nil: no events.
func (t *Table) WithObserver(o fence.WriteObserver) *Table {
	c := *t
	c.obs = o
	return &c
}

// KeyColumns returns a copy of the key column names.
func (t *Table) KeyColumns() []string { return slices.Clone(t.spec.Keys) }

// Update sets the given columns of the row whose key columns equal key (in
// NewTable's order; none may be NULL), and sets its lock_version to token,
// if and only if the row's lock_version is <= token. set may be empty: the
// write then only claims the row for token. It runs one statement (one
// round trip).
//
// It returns nil when the row was written; a *fence.StaleError (matching
// fence.ErrStaleToken) carrying the row's lock_version when that is newer
// than token; fence.ErrNotFound when no row has the key; fence.ErrAmbiguousKey when
// several rows do; fence.ErrLockVersionType when the table's lock_version is not
// bigint (nothing written); fence.ErrNoLockVersion, naming the command that adds
// it, when the table has no lock_version column; an error matching fence.ErrRetryable for a
// serialization failure or deadlock; an error matching
// fence.ErrOutcomeUnknown, joined with its cause, when ctx ended or the
// connection broke after the statement was sent (the write may have been
// applied, or may still be: see the package doc); any other database
// error wrapped (errors.As finds the *pgconn.PgError). Bad arguments are
// reported before any I/O: a token that is 0 or above the int64 range
// (fence.ErrInvalidToken), or an fence.ErrInvalidArgument (among them a NULL key
// value). ctx bounds the statement.
//
// db may be a pool or connection (the write commits on its own) or a
// pgx.Tx (the row stays locked, and the write can still be rolled back,
// until the transaction ends).
func (t *Table) Update(ctx context.Context, db DBTX, key []any, token fence.Token, set ...Column) error {
	return t.write(ctx, rowguard.Update, db, token, key, set)
}

// Insert inserts a row with the key columns set to key, the given columns,
// and lock_version = token. It runs one statement (one round trip).
//
// It returns nil when the row was inserted; a *fence.StaleError when a row
// with the key exists and its lock_version is newer than token; an error
// matching fence.ErrExists when it exists with a lock_version <= token; an error
// matching fence.ErrRetryable when a row with the key was committed by another
// transaction after this statement's snapshot (try again to learn which
// case it is), or on a serialization failure or deadlock; other errors as
// for Update. The table needs a unique index on exactly the key columns.
// ctx bounds the statement.
func (t *Table) Insert(ctx context.Context, db DBTX, key []any, token fence.Token, cols ...Column) error {
	return t.write(ctx, rowguard.Insert, db, token, key, cols)
}

// Upsert inserts the row, or, when a row with the key exists and its
// lock_version is <= token, updates the given columns; either way the row
// ends with lock_version = token. It runs one statement
// (INSERT ... ON CONFLICT DO UPDATE, one round trip).
//
// It returns nil when the row was inserted or updated; a *fence.StaleError
// when the row's lock_version is newer than token; an error matching
// fence.ErrRetryable when a row with a newer lock_version was committed by
// another transaction after this statement's snapshot (nothing was
// written; try again to get the stale error with its version), or on a
// serialization failure or deadlock; other errors as for Update. The table
// needs a unique index on exactly the key columns. ctx bounds the
// statement.
func (t *Table) Upsert(ctx context.Context, db DBTX, key []any, token fence.Token, cols ...Column) error {
	return t.write(ctx, rowguard.Upsert, db, token, key, cols)
}

// Delete deletes the row with the key if its lock_version is <= token. It
// runs one statement (one round trip) and returns what Update returns.
//
// A deleted row takes its lock_version with it: a stale holder's later
// Insert or Upsert of the same key is not rejected. Where a key can be
// re-created, fence the whole resource with a Guard as well, or mark rows
// deleted (a fenced Update) instead of deleting them.
func (t *Table) Delete(ctx context.Context, db DBTX, key []any, token fence.Token) error {
	return t.write(ctx, rowguard.Delete, db, token, key, nil)
}

func (t *Table) write(ctx context.Context, kind rowguard.Kind, db DBTX, token fence.Token, key []any, cols []Column) error {
	if t.obs == nil {
		return t.writeRow(ctx, kind, db, token, key, cols)
	}
	e := fence.WriteEvent{Ctx: ctx, Guard: "sqlguard", Class: t.spec.Name, Op: kind.String(), Resource: t.spec.Resource(key), Token: token}
	return fence.Observe(t.obs, e, func() error { return t.writeRow(ctx, kind, db, token, key, cols) })
}

func (t *Table) writeRow(ctx context.Context, kind rowguard.Kind, db DBTX, token fence.Token, key []any, cols []Column) error {
	op := t.ops[kind]
	tok, err := tokenArg(token)
	if err != nil {
		return fmt.Errorf("sqlguard: %s: %w", op, err)
	}
	st, colErr := t.statementsFor(kind, cols)
	if err := errors.Join(t.spec.CheckWrite(db, key), colErr); err != nil {
		return fmt.Errorf("sqlguard: %s: %w", op, err)
	}
	args := make([]any, 0, len(key)+len(cols)+1)
	args = append(args, key...)
	for _, c := range cols {
		args = append(args, c.Value)
	}
	args = append(args, tok)

	p, ok := db.(*pgxpool.Pool)
	if !ok {
		return t.run(ctx, kind, op, db, connOf(db), st, args, token, key)
	}
	// Acquire here rather than in the pool's own Exec, so that a failure
	// to get a connection (nothing sent) is told apart from one in flight,
	// and so that the connection's first-use check can be read.
	c, err := p.Acquire(ctx)
	if err != nil {
		return fmt.Errorf("sqlguard: %s: acquire connection: %w", op, err)
	}
	defer c.Release()
	return t.run(ctx, kind, op, c, c.Conn(), st, args, token, key)
}

// run writes through db, whose connection is conn (nil when unknown).
//
// The success path is one plain statement: the write with "lock_version
// <= token" in its condition, as cheap as the unfenced write. It is taken
// on a connection that has checked, at its first write to the table, that
// lock_version is bigint and that a unique index covers exactly the key
// columns (so the write cannot reach two rows). When it writes nothing,
// the exact statement runs (a second round trip, on the rejection path
// only): it locks the row, writes if it now may, or says exactly why not.
// Without a known connection, or without those properties, the exact
// statement runs alone.
func (t *Table) run(ctx context.Context, kind rowguard.Kind, op string, db DBTX, conn *pgx.Conn, st *statements, args []any, token fence.Token, key []any) error {
	if conn != nil {
		fast, err := t.fastPath(ctx, op, db, conn)
		if err != nil {
			return err
		}
		if fast {
			tag, err := db.Exec(ctx, st.fast, args...)
			if err != nil {
				if serr := t.schemaErr(op, st.fast, err); serr != nil {
					return serr // dropped since this connection's first write
				}
				return sentErr(op, err, conn)
			}
			switch n := tag.RowsAffected(); {
			case n == 1:
				return nil
			case n > 1:
				return fmt.Errorf("sqlguard: %s: %w: %s matched and wrote %d rows: the unique index on the key columns that this connection found at its first write is gone",
					op, fence.ErrAmbiguousKey, t.spec.Resource(key), n)
			}
		}
	}
	var (
		n, written int64
		current    *int64
		badType    *string
	)
	if err := db.QueryRow(ctx, st.full, args...).Scan(&n, &current, &written, &badType); err != nil {
		if serr := t.schemaErr(op, st.full, err); serr != nil {
			return serr
		}
		return sentErr(op, err, conn)
	}
	if badType != nil {
		return t.lockVersionType(op, *badType)
	}
	f := rowguard.Found{Rows: int(n), HasCurrent: current != nil}
	if current != nil {
		f.Current = uint64(*current) // the CHECK keeps it >= 0
	}
	switch v := rowguard.Judge(kind, f, token); {
	case v == rowguard.Ambiguous:
		return t.spec.Refusal(v, op, key, token, f)
	case written > 0:
		return nil
	case v == rowguard.Create:
		return &fence.RetryableError{Op: "sqlguard: " + op, Err: fmt.Errorf("a row %s was committed concurrently, after this statement's snapshot", t.spec.Resource(key))}
	case v == rowguard.Write:
		// The row was locked with lock_version <= token and still not
		// written: it changed in a way the statement could not follow.
		return t.spec.Changed(op, key)
	default:
		return t.spec.Refusal(v, op, key, token, f)
	}
}

// schemaErr returns the *fence.SetupError that a statement's failure err
// says, or nil: the table has no lock_version (fence.ErrNoLockVersion), or
// it (or its schema) does not exist (fence.ErrNoTable).
func (t *Table) schemaErr(op, stmt string, err error) error {
	if nlv := noLockVersion(op, pgident.ShellWord(t.cliName), stmt, err); nlv != nil {
		return nlv
	}
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && (pgErr.Code == codeUndefinedTable || pgErr.Code == codeInvalidSchemaName) {
		return t.noTable(op, err)
	}
	return nil
}

// noTable is the error for a table that does not exist: err is the
// database's, or nil when a check found it.
func (t *Table) noTable(op string, err error) error {
	what := fmt.Errorf("sqlguard: %s: %w: %s", op, fence.ErrNoTable, t.spec.Name)
	if err != nil {
		what = fmt.Errorf("%w: %w", what, err)
	}
	return &fence.SetupError{Err: what, Fix: "create the table, or give NewTable its schema and name as the database spells them (unquoted names fold to lower case)"}
}

// lockVersionType is the error for a lock_version column of type typ.
func (t *Table) lockVersionType(op, typ string) error {
	return &fence.SetupError{
		Err: fmt.Errorf("sqlguard: %s: %w: %s.%s is %s, want %s", op, fence.ErrLockVersionType, t.spec.Name, LockVersionColumn, typ, lockversion.Type),
		Fix: "change the column to bigint NOT NULL (migrations.ApplyLockVersion refuses to adopt a column of another type)",
	}
}

// probeSQL reads, in the catalog and without failing for a missing table
// or column, whether the table named $1 (quoted) has a bigint lock_version
// and a unique index (valid, not deferrable, not partial, on columns only)
// whose key columns are exactly the names in $2.
var probeSQL = `SELECT ` + lockversion.InCatalog("r.oid") + ` AND ` + uniqueOnKeysSQL + `
FROM (SELECT pg_catalog.to_regclass($1) AS oid) AS r`

// uniqueOnKeysSQL is true when the relation r.oid has a unique index
// (valid, not deferrable, not partial, on columns only) whose key columns
// are exactly the names in $2.
const uniqueOnKeysSQL = `EXISTS (
	SELECT 1 FROM pg_catalog.pg_index i
	WHERE i.indrelid = r.oid AND i.indisunique AND i.indimmediate AND i.indisvalid
	  AND i.indpred IS NULL AND i.indexprs IS NULL AND i.indnkeyatts = pg_catalog.cardinality($2::text[])
	  AND (SELECT pg_catalog.array_agg(a.attname::text ORDER BY a.attname::text)
	       FROM pg_catalog.unnest(i.indkey::int2[]) WITH ORDINALITY AS k(attnum, n)
	       JOIN pg_catalog.pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = k.attnum
	       WHERE k.n <= i.indnkeyatts)
	    = (SELECT pg_catalog.array_agg(c ORDER BY c) FROM pg_catalog.unnest($2::text[]) AS c))`

// fastPath reports whether conn may take the success path for t. It asks
// the database once per connection and table (one round trip, at the
// first write), and records the answer in the connection's CustomData,
// which lives and dies with the connection; a connection is used by one
// goroutine at a time, so the map needs no lock.
func (t *Table) fastPath(ctx context.Context, op string, db DBTX, conn *pgx.Conn) (bool, error) {
	data := conn.PgConn().CustomData()
	if ok, found := data[t.probeKey].(bool); found {
		return ok, nil
	}
	var ok bool
	if err := db.QueryRow(ctx, probeSQL, t.ident, t.spec.Keys).Scan(&ok); err != nil {
		// Nothing of the write was sent.
		return false, wrapDBErr(op+": check the table", err)
	}
	data[t.probeKey] = ok
	return ok, nil
}

// statementsFor returns the statements of a write of kind with cols, or an
// error wrapping fence.ErrInvalidArgument when the columns cannot be
// written. Columns are checked when their statements are built: the same
// names again find those statements, already checked.
func (t *Table) statementsFor(kind rowguard.Kind, cols []Column) (*statements, error) {
	return t.stmts.For(kind, cols, func() (*statements, error) {
		if err := t.spec.CheckColumns(checkIdent, cols); err != nil {
			return nil, err
		}
		return &statements{fast: t.fastStatement(kind, cols), full: t.statement(kind, cols)}, nil
	})
}

// fastStatement builds the success path's statement, with the parameters
// of statement: the plain write, conditional on the row's lock_version
// being <= the token. It changes nothing when the condition fails, and then
// says nothing about why (the row may be missing or newer): the exact
// statement is asked next. RowTypeIsBigint re-checks, at no cost, the
// type checked at the connection's first write, so that a column altered
// since then is not trusted.
func (t *Table) fastStatement(kind rowguard.Kind, cols []Column) string {
	nk := len(t.spec.Keys)
	tokParam := "$" + strconv.Itoa(nk+len(cols)+1)
	lv := pgx.Identifier{LockVersionColumn}.Sanitize()
	isBigint := lockversion.RowTypeIsBigint(t.ident)
	var b strings.Builder
	switch kind {
	case rowguard.Update:
		b.WriteString("UPDATE " + t.ident + " SET ")
		for i, c := range cols {
			b.WriteString(pgx.Identifier{c.Name}.Sanitize() + " = $" + strconv.Itoa(nk+i+1) + ", ")
		}
		b.WriteString(lv + " = " + tokParam + " WHERE " + t.where + " AND " + lv + " <= " + tokParam + " AND " + isBigint)
	case rowguard.Delete:
		b.WriteString("DELETE FROM " + t.ident + " WHERE " + t.where + " AND " + lv + " <= " + tokParam + " AND " + isBigint)
	case rowguard.Insert, rowguard.Upsert:
		targets := append([]string(nil), t.keyIdents...)
		params := make([]string, 0, nk+len(cols)+1)
		for i := 1; i <= nk+len(cols)+1; i++ {
			params = append(params, "$"+strconv.Itoa(i))
		}
		for _, c := range cols {
			targets = append(targets, pgx.Identifier{c.Name}.Sanitize())
		}
		targets = append(targets, lv)
		b.WriteString("INSERT INTO " + t.ident + " AS fencekit_t (" + strings.Join(targets, ", ") + ") SELECT " +
			strings.Join(params, ", ") + " WHERE " + isBigint + " ON CONFLICT (" + t.keyList + ") DO ")
		if kind == rowguard.Insert {
			b.WriteString("NOTHING")
		} else {
			b.WriteString("UPDATE SET ")
			for _, id := range targets[nk : len(targets)-1] {
				b.WriteString(id + " = EXCLUDED." + id + ", ")
			}
			b.WriteString(lv + " = EXCLUDED." + lv + " WHERE fencekit_t." + lv + " <= EXCLUDED." + lv)
		}
	}
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
func (t *Table) statement(kind rowguard.Kind, cols []Column) string {
	nk := len(t.spec.Keys)
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
	if kind == rowguard.Delete {
		lock = " FOR UPDATE"
	}
	var b strings.Builder
	b.WriteString("WITH " + cteCur + " AS (SELECT CASE WHEN " + isBigint + " THEN " + lv + "::text::bigint END AS fencekit_v FROM " +
		t.ident + " WHERE " + t.where + lock + "), ")
	b.WriteString(cteWritten + " AS (")
	switch kind {
	case rowguard.Update:
		b.WriteString("UPDATE " + t.ident + " SET ")
		for i := range cols {
			b.WriteString(colIdents[i] + " = " + colParams[i] + ", ")
		}
		b.WriteString(lv + " = " + tokValue + " WHERE " + t.where + " AND " + guard)
	case rowguard.Delete:
		b.WriteString("DELETE FROM " + t.ident + " WHERE " + t.where + " AND " + guard)
	case rowguard.Insert, rowguard.Upsert:
		targets := append(append(append([]string(nil), t.keyIdents...), colIdents...), lv)
		params := make([]string, 0, len(targets))
		for i := 1; i <= nk; i++ {
			params = append(params, "$"+strconv.Itoa(i))
		}
		params = append(append(params, colParams...), tokValue)
		b.WriteString("INSERT INTO " + t.ident + " AS fencekit_t (" + strings.Join(targets, ", ") + ") ")
		b.WriteString("SELECT " + strings.Join(params, ", ") + " WHERE " + isBigint)
		if kind == rowguard.Insert {
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
