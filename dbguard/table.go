package dbguard

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"

	"github.com/fencekit/fencekit/fence"
)

// Column is one column of a row and the value to write to it. Value is
// passed to the driver as a bind parameter, never formatted into SQL.
type Column struct {
	Name  string
	Value any
}

// Col returns Column{Name: name, Value: value}.
func Col(name string, value any) Column { return Column{Name: name, Value: value} }

// Table is a user table fenced row by row. It must have a column
//
//	lock_version BIGINT UNSIGNED NOT NULL DEFAULT 0   -- MySQL, MariaDB
//	lock_version INTEGER NOT NULL DEFAULT 0           -- SQLite
//
// (package migrations adds it), and key columns that identify one row: the
// primary key or a unique key (Insert and Upsert need a unique index on
// exactly those columns). Each write writes only if the row's
// lock_version is <= the presented token and then sets lock_version to the
// token: one statement when it succeeds; a short transaction that locks
// the row and says why when it does not (see the package doc).
//
// A Table holds names, its dialect, the statements it built and what it
// learned about the table at its first write; it is safe for concurrent
// use.
type Table struct {
	d        Dialect
	name     string // for messages: db.table or table
	database string
	table    string
	ident    string // quoted, qualified
	keys     []string
	where    string    // `k1` = ? AND `k2` = ?
	ops      [4]string // "update `t`" and so on, for errors

	// checked is what the first successful check of the table found.
	checked atomic.Pointer[tableInfo]
	// last holds, per write kind, the statements built for the most
	// recent list of columns.
	last [4]atomic.Pointer[statements]
}

// tableInfo is what the guard learned about the table at its first write.
type tableInfo struct {
	// unique: a unique index (or the primary key) has exactly the key
	// columns, so a key reaches one row at most.
	unique bool
}

// statements are the statements of one write kind and column list.
type statements struct {
	cols  []string
	write string // the conditional write (Update, Upsert, Delete) or the INSERT
	sel   string // reads the row's lock_version (locking it on MySQL)
}

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

// NewTable describes the table name in database (MySQL: a database; SQLite:
// an attached schema such as "main"; empty: the connection's current
// database, or SQLite's main) with the given key columns, in the order in
// which key values are passed to the writes. Names are used exactly as
// given and always quoted (backquotes on MySQL, double quotes on SQLite).
// It does no I/O: a table or column that does not exist is reported by the
// first write.
//
// NewTable returns an error wrapping ErrInvalid, listing every problem,
// when the dialect is unknown, a name is empty, not UTF-8, contains a NUL
// byte or is too long (MySQL: more than 64 characters, or ends with a
// space), when there is no key column, or when a key column repeats or is
// lock_version.
func NewTable(d Dialect, database, name string, keyColumns ...string) (*Table, error) {
	if !d.valid() {
		return nil, fmt.Errorf("%w: unknown dialect %v (use dbguard.MySQL or dbguard.SQLite)", ErrInvalid, d)
	}
	var errs []error
	if database != "" {
		errs = append(errs, d.checkIdent("database", database))
	}
	errs = append(errs, d.checkIdent("table", name))
	if len(keyColumns) == 0 {
		errs = append(errs, fmt.Errorf("%w: no key columns", ErrInvalid))
	}
	seen := make(map[string]bool, len(keyColumns))
	for _, k := range keyColumns {
		if err := d.checkIdent("key column", k); err != nil {
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
	t := &Table{d: d, name: name, database: database, table: name, ident: d.qualified(database, name), keys: slices.Clone(keyColumns)}
	if database != "" {
		t.name = database + "." + name
	}
	conds := make([]string, len(keyColumns))
	for i, k := range keyColumns {
		conds[i] = d.quote(k) + " = ?"
	}
	t.where = strings.Join(conds, " AND ")
	for k := range t.ops {
		t.ops[k] = writeKind(k).String() + " " + t.ident
	}
	return t, nil
}

// Name returns the table's name as given to NewTable (database.table or
// table), unquoted.
func (t *Table) Name() string { return t.name }

// Dialect returns the table's dialect.
func (t *Table) Dialect() Dialect { return t.d }

// KeyColumns returns a copy of the key column names.
func (t *Table) KeyColumns() []string { return slices.Clone(t.keys) }

// Update sets the given columns of the row whose key columns equal key (in
// NewTable's order; none may be NULL), and sets its lock_version to token,
// if and only if the row's lock_version is <= token. set may be empty: the
// write then only claims the row for token.
//
// It returns nil when the row was written; a *fence.StaleError (matching
// fence.ErrStaleToken) carrying the row's lock_version when that is newer
// than token; ErrNotFound when no row has the key; ErrAmbiguousKey when
// several rows do; ErrLockVersionType when the table's lock_version cannot
// hold every token (nothing written); ErrNoLockVersion when the table has
// no lock_version column; ErrNoTable when there is no such table; an error
// matching ErrRetryable for a deadlock, lock wait timeout or busy
// database; an error matching fence.ErrOutcomeUnknown, joined with its
// cause, when ctx ended or the connection broke after the write was sent
// (it may have been applied: read the row again); any other database error
// wrapped (errors.As finds the driver's error). Bad arguments are reported
// before any I/O: a token that is 0, or above 2^63-1 on SQLite
// (fence.ErrInvalidToken), or an ErrInvalid (among them a NULL key value).
// ctx bounds the whole write.
//
// db may be a *sql.DB or *sql.Conn (the write commits on its own) or a
// *sql.Tx (the row stays locked, and the write can still be rolled back,
// until the transaction ends). Any other DBTX is taken to be a
// transaction.
func (t *Table) Update(ctx context.Context, db DBTX, token fence.Token, key []any, set ...Column) error {
	return t.write(ctx, kindUpdate, db, token, key, set)
}

// Insert inserts a row with the key columns set to key, the given columns,
// and lock_version = token.
//
// It returns nil when the row was inserted; a *fence.StaleError when a row
// with the key exists and its lock_version is newer than token; an error
// matching ErrExists when it exists with a lock_version <= token; an error
// matching ErrRetryable when a row with the key was created by another
// transaction while this one looked for it (try again to learn which case
// it is), or on a deadlock or busy database; other errors as for Update.
// The table needs a unique index on exactly the key columns
// (ErrAmbiguousKey otherwise). ctx bounds the whole write.
func (t *Table) Insert(ctx context.Context, db DBTX, token fence.Token, key []any, cols ...Column) error {
	return t.write(ctx, kindInsert, db, token, key, cols)
}

// Upsert inserts the row, or, when a row with the key exists and its
// lock_version is <= token, updates the given columns; either way the row
// ends with lock_version = token. An existing row is written with one
// statement; a new one needs the short transaction of the rejection path.
//
// It returns nil when the row was inserted or updated; a *fence.StaleError
// when the row's lock_version is newer than token; an error matching
// ErrRetryable when another transaction created the row while this one
// looked for it, or on a deadlock or busy database; other errors as for
// Update. The table needs a unique index on exactly the key columns.
func (t *Table) Upsert(ctx context.Context, db DBTX, token fence.Token, key []any, cols ...Column) error {
	return t.write(ctx, kindUpsert, db, token, key, cols)
}

// Delete deletes the row whose key columns equal key if its lock_version
// is <= token. Errors as for Update.
//
// A deleted row takes its lock_version with it: a later Insert of the
// same key with any token succeeds, including a stale holder's. Where
// keys can be created again, fence the resource with a Guard as well, or
// mark rows deleted (a fenced Update) instead of deleting them.
func (t *Table) Delete(ctx context.Context, db DBTX, token fence.Token, key []any) error {
	return t.write(ctx, kindDelete, db, token, key, nil)
}

func (t *Table) write(ctx context.Context, kind writeKind, db DBTX, token fence.Token, key []any, cols []Column) error {
	op := t.ops[kind]
	tok, tokErr := t.d.tokenArg(token)
	st, colErr := t.statementsFor(kind, cols)
	if err := errors.Join(tokErr, t.check(db, key), colErr); err != nil {
		return fmt.Errorf("dbguard: %s: %w", op, err)
	}
	if err := ctx.Err(); err != nil {
		// Nothing sent: a plain failure, even inside a transaction.
		return fmt.Errorf("dbguard: %s: %w", op, err)
	}
	w := &rowWrite{t: t, kind: kind, op: op, st: st, token: token, tok: tok, key: key, cols: cols}
	switch d := db.(type) {
	case *sql.DB:
		// A connection of its own, so that a failure to get one (nothing
		// sent) is told apart from one in flight.
		conn, err := d.Conn(ctx)
		if err != nil {
			return fmt.Errorf("dbguard: %s: get a connection: %w", op, err)
		}
		defer conn.Close()
		return w.run(ctx, conn, conn)
	case *sql.Conn:
		return w.run(ctx, d, d)
	default:
		return w.run(ctx, db, nil)
	}
}

// rowWrite is one call of a Table write.
type rowWrite struct {
	t     *Table
	kind  writeKind
	op    string
	st    *statements
	token fence.Token
	tok   any
	key   []any
	cols  []Column
}

// writeArgs are the arguments of st.write.
func (w *rowWrite) writeArgs() []any {
	args := make([]any, 0, len(w.key)+len(w.cols)+2)
	switch w.kind {
	case kindInsert:
		args = append(args, w.key...)
		for _, c := range w.cols {
			args = append(args, c.Value)
		}
		return append(args, w.tok)
	case kindDelete:
		return append(append(args, w.key...), w.tok)
	}
	for _, c := range w.cols {
		args = append(args, c.Value)
	}
	args = append(args, w.tok)
	args = append(args, w.key...)
	return append(args, w.tok)
}

// insertArgs are the arguments of the INSERT of an Upsert of a new row.
func (w *rowWrite) insertArgs() []any {
	args := slices.Clone(w.key)
	for _, c := range w.cols {
		args = append(args, c.Value)
	}
	return append(args, w.tok)
}

// run writes through db; conn is its connection when db is not in a
// transaction (nil when it is: a *sql.Tx or another DBTX).
//
// The success path is one statement: the write with "lock_version <=
// token" in its condition (an Insert: the plain INSERT), taken when the
// table's first check found a unique index on the key columns. When it
// writes nothing, which says nothing about why, the exact path follows:
// in a transaction (the caller's, or a short one of its own), it locks the
// row, reads its lock_version, and writes or says exactly why not.
func (w *rowWrite) run(ctx context.Context, db DBTX, conn *sql.Conn) error {
	info, err := w.t.info(ctx, w.op, db)
	if err != nil {
		return err
	}
	if !info.unique && (w.kind == kindInsert || w.kind == kindUpsert) {
		return fmt.Errorf("dbguard: %s: %w: %s has no unique index on exactly (%s), which %s needs",
			w.op, ErrAmbiguousKey, w.t.name, strings.Join(w.t.keys, ", "), w.kind)
	}
	if info.unique {
		if err := ctx.Err(); err != nil {
			// Nothing is sent: a plain failure (sentErr would not know).
			return fmt.Errorf("dbguard: %s: %w", w.op, err)
		}
		res, err := db.ExecContext(ctx, w.st.write, w.writeArgs()...)
		switch {
		case err == nil:
			n, err := res.RowsAffected()
			if err != nil {
				return fmt.Errorf("dbguard: %s: rows affected: %w", w.op, err)
			}
			if n == 1 {
				return nil
			}
			if n > 1 {
				return fmt.Errorf("dbguard: %s: %w: %s matched and wrote %d rows: the unique index on the key columns found at the table's first write is gone",
					w.op, ErrAmbiguousKey, w.resource(), n)
			}
		case w.kind == kindInsert && w.t.d.dupKey(err):
			// A row with the key exists: the exact path says why.
		default:
			if e := w.t.noLockVersion(w.op, err); e != nil {
				return e
			}
			return w.t.d.sentErr(ctx, w.op, err, conn)
		}
	}
	return w.exact(ctx, db, conn)
}

// exact is the rejection path (and the only path without a unique index):
// it decides in a transaction that holds the row's lock.
func (w *rowWrite) exact(ctx context.Context, db DBTX, conn *sql.Conn) error {
	run := db
	var tx *sql.Tx
	if conn != nil {
		var opts *sql.TxOptions
		if w.t.d == MySQL {
			// READ COMMITTED: a locking read of a missing key takes no
			// gap lock (under REPEATABLE READ two writers of one new key
			// would deadlock), and reads the newest committed row.
			opts = &sql.TxOptions{Isolation: sql.LevelReadCommitted}
		}
		var err error
		if tx, err = conn.BeginTx(ctx, opts); err != nil {
			return w.t.d.wrapDBErr(w.op+": begin", err)
		}
		defer tx.Rollback() //nolint:errcheck // a no-op after Commit
		run = tx
	}
	if err := w.decide(ctx, run, tx != nil); err != nil {
		return err
	}
	if tx == nil {
		return nil
	}
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("dbguard: %s: before commit: %w", w.op, err)
	}
	if err := tx.Commit(); err != nil {
		return w.t.d.sentErr(ctx, w.op+": commit", err, conn)
	}
	return nil
}

// decide locks the row, reads it and writes or says why not. own is true
// when the transaction is the guard's own: a statement that fails in
// flight then commits nothing, and is a plain failure.
func (w *rowWrite) decide(ctx context.Context, db DBTX, own bool) error {
	d := w.t.d
	stmtErr := func(op string, err error) error {
		if e := w.t.noLockVersion(op, err); e != nil {
			return e
		}
		if own {
			return d.wrapDBErr(op, err)
		}
		return d.sentErr(ctx, op, err, nil)
	}
	if d == SQLite {
		// SQLite: write first, so that this transaction takes the
		// database's write lock before it reads (a deferred transaction
		// that reads and then writes gets SQLITE_BUSY at once when
		// another writer committed in between). The write is the
		// conditional one, and it is the whole answer when it succeeds.
		res, err := db.ExecContext(ctx, w.st.write, w.writeArgs()...)
		switch {
		case err == nil:
			if n, _ := res.RowsAffected(); n == 1 {
				return nil
			} else if n > 1 {
				return fmt.Errorf("dbguard: %s: %w: %s matches %d rows (all written; roll back)", w.op, ErrAmbiguousKey, w.resource(), n)
			}
		case w.kind == kindInsert && d.dupKey(err):
		default:
			return stmtErr(w.op, err)
		}
	}
	rows, err := db.QueryContext(ctx, w.st.sel, w.key...)
	if err != nil {
		if e := w.t.noLockVersion(w.op, err); e != nil {
			return e
		}
		return d.wrapDBErr(w.op+": lock the row", err)
	}
	var (
		n       int
		lv      sql.NullString
		lvKind  sql.NullString
		badType bool
	)
	for rows.Next() {
		n++
		var v, k sql.NullString
		dest := []any{&v}
		if d == SQLite {
			dest = append(dest, &k)
		}
		if err := rows.Scan(dest...); err != nil {
			rows.Close()
			return fmt.Errorf("dbguard: %s: read lock_version: %w", w.op, err)
		}
		lv, lvKind = v, k
		if d == SQLite && k.Valid && k.String != "integer" {
			badType = true
		}
	}
	if err := errors.Join(rows.Err(), rows.Close()); err != nil {
		return d.wrapDBErr(w.op+": lock the row", err)
	}
	var current uint64
	if n == 1 && lv.Valid && !badType {
		if current, err = strconv.ParseUint(lv.String, 10, 64); err != nil {
			badType = true
		}
	}
	switch {
	case n > 1:
		return fmt.Errorf("dbguard: %s: %w: %s matches %d rows", w.op, ErrAmbiguousKey, w.resource(), n)
	case n == 0 && (w.kind == kindUpdate || w.kind == kindDelete):
		return fmt.Errorf("dbguard: %s: %w: %s", w.op, ErrNotFound, w.resource())
	case n == 0:
		// Insert (MySQL; SQLite's INSERT above failed only on a row
		// that exists) or Upsert of a new row.
		stmt, args := w.st.write, w.writeArgs()
		if w.kind == kindUpsert {
			stmt, args = w.t.insertSQL(w.cols), w.insertArgs()
		}
		if _, err := db.ExecContext(ctx, stmt, args...); err != nil {
			if d.dupKey(err) {
				return &RetryableError{Op: w.op, Err: fmt.Errorf("a row %s was created concurrently: %w", w.resource(), err)}
			}
			return stmtErr(w.op, err)
		}
		return nil
	case !lv.Valid:
		return fmt.Errorf("dbguard: %s: %s has a NULL lock_version (the column must be NOT NULL)", w.op, w.resource())
	case badType:
		return fmt.Errorf("dbguard: %s: %w: %s holds lock_version %q (stored as %s): want an integer",
			w.op, ErrLockVersionType, w.resource(), lv.String, cmp(lvKind.String, "a non-integer"))
	case current > uint64(w.token):
		return fence.Stale(w.resource(), w.token, fence.Token(current))
	case w.kind == kindInsert:
		return fmt.Errorf("dbguard: %s: %w: %s (lock_version %d)", w.op, ErrExists, w.resource(), current)
	}
	// The row is locked with lock_version <= token.
	res, err := db.ExecContext(ctx, w.st.write, w.writeArgs()...)
	if err != nil {
		return stmtErr(w.op, err)
	}
	if d == SQLite {
		// SQLite counts matched rows; the row is locked and may be
		// written, so anything but one row is a surprise.
		if n, _ := res.RowsAffected(); n != 1 {
			return &RetryableError{Op: w.op, Err: fmt.Errorf("%s changed concurrently", w.resource())}
		}
	}
	// MySQL counts changed rows unless the client asked for found rows:
	// an identical rewrite (same values, same token) reports 0, and the
	// row, locked by this transaction with lock_version <= token, was
	// written all the same.
	return nil
}

func cmp(s, alt string) string {
	if s == "" {
		return alt
	}
	return s
}

// resource describes one row for errors: db.table(k1=v1, k2=v2).
func (w *rowWrite) resource() string {
	var b strings.Builder
	b.WriteString(w.t.name)
	b.WriteByte('(')
	for i, k := range w.t.keys {
		if i > 0 {
			b.WriteString(", ")
		}
		fmt.Fprintf(&b, "%s=%v", k, w.key[i])
	}
	b.WriteByte(')')
	return b.String()
}

// check validates a write's database and key, reporting every problem at
// once. The columns are checked by statementsFor.
func (t *Table) check(db DBTX, key []any) error {
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
	return errors.Join(errs...)
}

// statementsFor returns the statements of a write of kind with cols, or an
// error wrapping ErrInvalid when the columns cannot be written.
func (t *Table) statementsFor(kind writeKind, cols []Column) (*statements, error) {
	if st := t.last[kind].Load(); st != nil && sameNames(st.cols, cols) {
		return st, nil
	}
	if err := t.checkColumns(cols); err != nil {
		return nil, err
	}
	st := &statements{cols: make([]string, len(cols)), write: t.writeSQL(kind, cols), sel: t.selectSQL()}
	for i, c := range cols {
		st.cols[i] = c.Name
	}
	t.last[kind].Store(st)
	return st, nil
}

func sameNames(names []string, cols []Column) bool {
	if len(names) != len(cols) {
		return false
	}
	for i, c := range cols {
		if names[i] != c.Name {
			return false
		}
	}
	return true
}

// checkColumns validates the columns of a write, reporting every problem
// at once.
func (t *Table) checkColumns(cols []Column) error {
	var errs []error
	for i, c := range cols {
		if err := t.d.checkIdent("column", c.Name); err != nil {
			errs = append(errs, err)
			continue
		}
		switch {
		case c.Name == LockVersionColumn:
			errs = append(errs, fmt.Errorf("%w: column %s is written by the guard only", ErrInvalid, LockVersionColumn))
		case slices.Contains(t.keys, c.Name):
			errs = append(errs, fmt.Errorf("%w: column %q is a key column; pass its value in key", ErrInvalid, c.Name))
		case slices.ContainsFunc(cols[:i], func(p Column) bool { return p.Name == c.Name }):
			errs = append(errs, fmt.Errorf("%w: column %q given twice", ErrInvalid, c.Name))
		}
	}
	return errors.Join(errs...)
}

// writeSQL builds the conditional write of kind: an UPDATE or DELETE with
// "lock_version <= ?" added to its condition (on SQLite also that the
// stored lock_version is an integer), or the plain INSERT. Its arguments
// are given by rowWrite.writeArgs.
func (t *Table) writeSQL(kind writeKind, cols []Column) string {
	if kind == kindInsert {
		return t.insertSQL(cols)
	}
	lv := t.d.quote(LockVersionColumn)
	cond := " WHERE " + t.where + " AND " + lv + " <= ?"
	if t.d == SQLite {
		cond += " AND typeof(" + lv + ") = 'integer'"
	}
	if kind == kindDelete {
		return "DELETE FROM " + t.ident + cond
	}
	var b strings.Builder
	b.WriteString("UPDATE " + t.ident + " SET ")
	for _, c := range cols {
		b.WriteString(t.d.quote(c.Name) + " = ?, ")
	}
	b.WriteString(lv + " = ?" + cond)
	return b.String()
}

// insertSQL builds INSERT INTO t (keys..., cols..., lock_version) VALUES (?, ...).
func (t *Table) insertSQL(cols []Column) string {
	names := make([]string, 0, len(t.keys)+len(cols)+1)
	for _, k := range t.keys {
		names = append(names, t.d.quote(k))
	}
	for _, c := range cols {
		names = append(names, t.d.quote(c.Name))
	}
	names = append(names, t.d.quote(LockVersionColumn))
	return "INSERT INTO " + t.ident + " (" + strings.Join(names, ", ") + ") VALUES (" +
		strings.TrimSuffix(strings.Repeat("?, ", len(names)), ", ") + ")"
}

// selectSQL reads the lock_version of the rows with the key (two at most):
// on MySQL with FOR UPDATE (a locking read sees the newest committed row
// and holds it until the transaction ends); on SQLite with its storage
// class, in a transaction that already holds the database's write lock.
func (t *Table) selectSQL() string {
	lv := t.d.quote(LockVersionColumn)
	if t.d == SQLite {
		return "SELECT " + lv + ", typeof(" + lv + ") FROM " + t.ident + " WHERE " + t.where + " LIMIT 2"
	}
	return "SELECT " + lv + " FROM " + t.ident + " WHERE " + t.where + " LIMIT 2 FOR UPDATE"
}
