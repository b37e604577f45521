package dbguard

import (
	"cmp"
	"context"
	"database/sql"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"

	"github.com/fencekit/fencekit/fence"
	"github.com/fencekit/fencekit/internal/rowguard"
)

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
// A Table holds names, its dialect, the statements it built and what its
// first write's check found (a setup check: each write's statement checks
// the row it reaches itself); it is safe for concurrent use, and on
// several databases.
type Table struct {
	d        Dialect
	spec     *rowguard.Spec // the name for messages (db.table or table) and the key columns
	database string
	table    string
	ident    string    // quoted, qualified
	where    string    // `k1` = ? AND `k2` = ?
	ops      [4]string // "update `t`" and so on, for errors
	obs      fence.WriteObserver

	// checked is what the first successful check of the table found
	// (shared by the copies WithObserver makes).
	checked *atomic.Pointer[tableInfo]
	// stmts holds the statements built for the most recent list of
	// columns of each write kind.
	stmts *rowguard.Statements[*statements]
}

// tableInfo is what a check of the table's catalog found.
type tableInfo struct {
	// unique: a unique index (or the primary key) has exactly the key
	// columns.
	unique bool
}

// statements are the statements of one write kind and column list.
type statements struct {
	// write is the conditional write (Update, Upsert, Delete) or the
	// INSERT, in each form (see writeSQL).
	write [3]string
	sel   string // reads the row's lock_version (locking it on MySQL)
}

// form is where a write's statement runs: each place has a form of the
// statement of its own (see writeSQL).
type form int

const (
	// onItsOwn: the success path through a *sql.DB or *sql.Conn, where
	// the statement must commit as it returns.
	onItsOwn form = iota
	// inCallersTx: the success path in the caller's transaction.
	inCallersTx
	// afterLock: the rejection path's write, in a transaction that holds
	// the row (its locked read) and has read the table's catalog.
	afterLock
)

// NewTable describes the table name in database (MySQL: a database; SQLite:
// an attached schema such as "main"; empty: the connection's current
// database, or SQLite's main) with the given key columns, in the order in
// which key values are passed to the writes. Names are used exactly as
// given and always quoted (backquotes on MySQL, double quotes on SQLite).
// It does no I/O: a table or column that does not exist is reported by the
// first write.
//
// NewTable returns an error wrapping fence.ErrInvalidArgument, listing every problem,
// when the dialect is unknown, a name is empty, not UTF-8, contains a NUL
// byte or is too long (MySQL: more than 64 characters, or ends with a
// space), when there is no key column, or when a key column repeats or is
// lock_version.
func NewTable(d Dialect, database, name string, keyColumns ...string) (*Table, error) {
	if !d.valid() {
		return nil, fmt.Errorf("%w: unknown dialect %v (use dbguard.MySQL or dbguard.SQLite)", fence.ErrInvalidArgument, d)
	}
	spec, err := rowguard.NewSpec("dbguard", d.checkIdent, database, name, keyColumns)
	if err != nil {
		return nil, err
	}
	t := &Table{d: d, spec: spec, database: database, table: name, ident: d.qualified(database, name),
		checked: &atomic.Pointer[tableInfo]{}, stmts: &rowguard.Statements[*statements]{}}
	conds := make([]string, len(keyColumns))
	for i, k := range keyColumns {
		conds[i] = d.quote(k) + " = ?"
	}
	t.where = strings.Join(conds, " AND ")
	for k := range t.ops {
		t.ops[k] = rowguard.Kind(k).String() + " " + t.ident
	}
	return t, nil
}

// Name returns the table's name as given to NewTable (database.table or
// table), unquoted.
func (t *Table) Name() string { return t.spec.Name }

// KeyColumns returns a copy of the key column names.
func (t *Table) KeyColumns() []string { return slices.Clone(t.spec.Keys) }

// WithObserver returns a Table like t whose writes report a
// fence.WriteEvent to o (Guard "dbguard", Class the table's Name, Op
// "update", "insert", "upsert" or "delete"), after each write's outcome is
// known. t itself is unchanged. o nil: no events.
func (t *Table) WithObserver(o fence.WriteObserver) *Table {
	c := *t
	c.obs = o
	return &c
}

// Dialect returns the table's dialect.
func (t *Table) Dialect() Dialect { return t.d }

// Update sets the given columns of the row whose key columns equal key (in
// NewTable's order; none may be NULL), and sets its lock_version to token,
// if and only if the row's lock_version is <= token. set may be empty: the
// write then only claims the row for token.
//
// It returns nil when the row was written; a *fence.StaleError (matching
// fence.ErrStaleToken) carrying the row's lock_version when that is newer
// than token; fence.ErrNotFound when no row has the key; fence.ErrAmbiguousKey when
// several rows do; fence.ErrLockVersionType when the table's lock_version cannot
// hold every token (nothing written); fence.ErrNoLockVersion when the table has
// no lock_version column; fence.ErrNoTable when there is no such table; an error
// matching fence.ErrRetryable for a deadlock, lock wait timeout or busy
// database; an error matching fence.ErrOutcomeUnknown, joined with its
// cause, when ctx ended or the connection broke after the write was sent
// (it may have been applied: read the row again); any other database error
// wrapped (errors.As finds the driver's error). Bad arguments are reported
// before any I/O: a token that is 0, or above 2^63-1 on SQLite
// (fence.ErrInvalidToken), or an fence.ErrInvalidArgument (among them a NULL key value).
// ctx bounds the whole write.
//
// db may be a *sql.DB or *sql.Conn (the write commits on its own, with
// autocommit off too: see the package doc) or a *sql.Tx (the row stays locked, and the write can still be rolled back,
// until the transaction ends). Any other DBTX is taken to be a
// transaction.
func (t *Table) Update(ctx context.Context, db DBTX, key []any, token fence.Token, set ...Column) error {
	return t.write(ctx, db, &rowWrite{t: t, kind: rowguard.Update, key: key, token: token, cols: set})
}

// Insert inserts a row with the key columns set to key, the given columns,
// and lock_version = token.
//
// It returns nil when the row was inserted; a *fence.StaleError when a row
// with the key exists and its lock_version is newer than token; an error
// matching fence.ErrExists when it exists with a lock_version <= token; an error
// matching fence.ErrRetryable when a row with the key was created by another
// transaction while this one looked for it (try again to learn which case
// it is), or on a deadlock or busy database; the database's error (not
// retryable), naming the index, when the row collides with another on a
// unique index other than the key's; other errors as for Update.
// The table needs a unique index on exactly the key columns
// (fence.ErrAmbiguousKey otherwise). ctx bounds the whole write.
func (t *Table) Insert(ctx context.Context, db DBTX, key []any, token fence.Token, cols ...Column) error {
	return t.write(ctx, db, &rowWrite{t: t, kind: rowguard.Insert, key: key, token: token, cols: cols})
}

// Upsert inserts the row, or, when a row with the key exists and its
// lock_version is <= token, updates the given columns; either way the row
// ends with lock_version = token. An existing row is written with one
// statement; a new one needs the short transaction of the rejection path.
//
// It returns nil when the row was inserted or updated; a *fence.StaleError
// when the row's lock_version is newer than token; an error matching
// fence.ErrRetryable when another transaction created the row while this one
// looked for it, or on a deadlock or busy database; the database's error,
// naming the index, when a new row collides with another on a unique
// index other than the key's; other errors as for Update. The table needs a unique index on exactly the key columns.
func (t *Table) Upsert(ctx context.Context, db DBTX, key []any, token fence.Token, cols ...Column) error {
	return t.write(ctx, db, &rowWrite{t: t, kind: rowguard.Upsert, key: key, token: token, cols: cols})
}

// Delete deletes the row whose key columns equal key if its lock_version
// is <= token. Errors as for Update.
//
// A deleted row takes its lock_version with it: a later Insert of the
// same key with any token succeeds, including a stale holder's. Where
// keys can be created again, fence the resource with a Guard as well, or
// mark rows deleted (a fenced Update) instead of deleting them.
func (t *Table) Delete(ctx context.Context, db DBTX, key []any, token fence.Token) error {
	return t.write(ctx, db, &rowWrite{t: t, kind: rowguard.Delete, key: key, token: token})
}

// write checks w (a write's kind, key, token and columns) and runs it
// through db, reporting it to the Table's observer.
func (t *Table) write(ctx context.Context, db DBTX, w *rowWrite) error {
	if t.obs == nil {
		return t.writeRow(ctx, db, w)
	}
	e := fence.WriteEvent{Ctx: ctx, Guard: "dbguard", Class: t.spec.Name, Op: w.kind.String(), Resource: t.spec.Resource(w.key), Token: w.token}
	return fence.Observe(t.obs, e, func() error { return t.writeRow(ctx, db, w) })
}

func (t *Table) writeRow(ctx context.Context, db DBTX, w *rowWrite) error {
	w.op = t.ops[w.kind]
	var tokErr, colErr error
	w.tok, tokErr = t.d.tokenArg(w.token)
	w.st, colErr = t.statementsFor(w.kind, w.cols)
	if err := errors.Join(tokErr, t.spec.CheckWrite(db, w.key), colErr); err != nil {
		return fmt.Errorf("dbguard: %s: %w", w.op, err)
	}
	if err := ctx.Err(); err != nil {
		// Nothing sent: a plain failure, even inside a transaction.
		return fmt.Errorf("dbguard: %s: %w", w.op, err)
	}
	op := w.op
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
	kind  rowguard.Kind
	op    string
	st    *statements
	token fence.Token
	tok   any
	key   []any
	cols  []Column
}

// writeArgs are the arguments of st.write.
func (w *rowWrite) writeArgs() []any {
	args := make([]any, 0, 2*len(w.key)+len(w.cols)+2)
	switch w.kind {
	case rowguard.Insert:
		args = append(args, w.key...)
		for _, c := range w.cols {
			args = append(args, c.Value)
		}
		return append(args, w.tok)
	case rowguard.Delete:
		// The key, the token, and the key again for the row count.
		args = append(append(args, w.key...), w.tok)
		return append(args, w.key...)
	}
	for _, c := range w.cols {
		args = append(args, c.Value)
	}
	args = append(args, w.tok)
	args = append(args, w.key...)
	args = append(args, w.tok)
	return append(args, w.key...)
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
// token" in its condition and the checks of the row it reaches (an
// Insert: the INSERT; see writeSQL). When it writes nothing, which says
// nothing about why, the exact path follows: in a transaction (the
// caller's, or a short one of its own), it locks the row, reads it and the
// table's catalog, and writes or says exactly why not.
func (w *rowWrite) run(ctx context.Context, db DBTX, conn *sql.Conn) error {
	info, err := w.t.info(ctx, w.op, db)
	if err != nil {
		return err
	}
	if !info.unique && w.kind.Creates() {
		return w.t.spec.NoUniqueKey(w.op, w.kind)
	}
	if err := ctx.Err(); err != nil {
		// Nothing is sent: a plain failure (sentErr would not know).
		return fmt.Errorf("dbguard: %s: %w", w.op, err)
	}
	f := inCallersTx
	if conn != nil {
		f = onItsOwn
	}
	res, err := db.ExecContext(ctx, w.st.write[f], w.writeArgs()...)
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
			// The statement writes only where fewer than two rows have
			// the key; at READ COMMITTED a row that the database matches
			// with the key can be inserted between its count and its write.
			return fmt.Errorf("dbguard: %s: %w: %s matched and wrote %d rows: a row the key matches was inserted while the statement ran",
				w.op, fence.ErrAmbiguousKey, w.resource(), n)
		}
	case w.kind == rowguard.Insert && w.t.d.dupKey(err):
		// A row with the key exists, or the row collides with another on
		// another unique index: the exact path says which.
	default:
		if e := w.t.schemaErr(w.op, err); e != nil {
			return e
		}
		return w.t.d.sentErr(ctx, w.op, err, conn)
	}
	return w.exact(ctx, db, conn)
}

// exact is the rejection path (and the only path without a unique index):
// it decides in a transaction that holds the row's lock.
func (w *rowWrite) exact(ctx context.Context, db DBTX, conn *sql.Conn) error {
	run := db
	var tx *sql.Tx
	if conn != nil {
		var err error
		if tx, err = w.begin(ctx, conn); err != nil {
			return err
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

// begin begins the rejection path's own transaction on conn. On MySQL it
// runs at READ COMMITTED: a locking read of a missing key takes no gap
// lock (under REPEATABLE READ two writers of one new key would deadlock),
// and reads the newest committed row.
//
// A session with autocommit off always has a transaction open (every
// statement opens one, the success path's too), and MySQL refuses to set
// the next transaction's isolation level then (1568): that transaction is
// committed first, as the START TRANSACTION that follows would commit it
// anyway. With autocommit on, the open transaction was begun with SQL on
// the caller's *sql.Conn: refused, with the fix.
func (w *rowWrite) begin(ctx context.Context, conn *sql.Conn) (*sql.Tx, error) {
	var opts *sql.TxOptions
	if w.t.d == MySQL {
		opts = &sql.TxOptions{Isolation: sql.LevelReadCommitted}
	}
	tx, err := conn.BeginTx(ctx, opts)
	if n, ok := mysqlNumber(err); ok && n == myTxInProgress {
		var autocommit bool
		if qerr := conn.QueryRowContext(ctx, "SELECT @@autocommit").Scan(&autocommit); qerr != nil {
			return nil, w.t.d.wrapDBErr(w.op+": begin", errors.Join(err, qerr))
		}
		if autocommit {
			return nil, fmt.Errorf("dbguard: %s: begin: the connection is in a transaction begun with SQL: write in a *sql.Tx from BeginTx instead, or end that transaction first: %w", w.op, err)
		}
		if _, err := conn.ExecContext(ctx, "COMMIT"); err != nil {
			return nil, w.t.d.wrapDBErr(w.op+": commit the transaction the session had open (autocommit is off)", err)
		}
		tx, err = conn.BeginTx(ctx, opts)
	}
	if err != nil {
		return nil, w.t.d.wrapDBErr(w.op+": begin", err)
	}
	return tx, nil
}

// decide locks the row, reads it and the table's catalog, and writes or
// says why not. own is true when the transaction is the guard's own: a
// statement that fails in flight then commits nothing, and is a plain
// failure.
func (w *rowWrite) decide(ctx context.Context, db DBTX, own bool) error {
	d := w.t.d
	stmtErr := func(op string, err error) error {
		if e := w.t.schemaErr(op, err); e != nil {
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
		res, err := db.ExecContext(ctx, w.st.write[afterLock], w.writeArgs()...)
		switch {
		case err == nil:
			if n, _ := res.RowsAffected(); n == 1 {
				return nil
			}
		case w.kind == rowguard.Insert && d.dupKey(err):
		default:
			return stmtErr(w.op, err)
		}
	}
	row, err := w.lockRow(ctx, db)
	if err != nil {
		return err
	}
	// The catalog of the table this transaction reached, read now: the
	// Table's first check may have been another database's, or the table
	// altered since. The locked read holds the table's definition until
	// the transaction ends (MySQL: its metadata lock; SQLite: the write
	// lock, taken above).
	info, err := w.t.readCatalog(ctx, w.op, db)
	if err != nil {
		return err
	}
	var current uint64
	badType := row.badType
	if row.n == 1 && row.lv.Valid && !badType {
		if current, err = strconv.ParseUint(row.lv.String, 10, 64); err != nil {
			badType = true
		}
	}
	f := rowguard.Found{Rows: row.n, Current: current, HasCurrent: row.lv.Valid}
	v := rowguard.Judge(w.kind, f, w.token)
	switch {
	case v == rowguard.Ambiguous:
		return w.t.spec.Refusal(v, w.op, w.key, w.token, f)
	case !info.unique && w.kind.Creates():
		return w.t.spec.NoUniqueKey(w.op, w.kind)
	case v == rowguard.Create:
		// Insert (MySQL; SQLite's INSERT above failed only on a unique
		// index) or Upsert of a new row.
		stmt, args := w.st.write[afterLock], w.writeArgs()
		if w.kind == rowguard.Upsert {
			stmt, args = w.t.insertSQL(w.cols), w.insertArgs()
		}
		if _, err := db.ExecContext(ctx, stmt, args...); err != nil {
			if d.dupKey(err) {
				return w.dupErr(ctx, db, err)
			}
			return stmtErr(w.op, err)
		}
		return nil
	case row.n == 1 && row.lv.Valid && badType:
		return w.t.lockVersionType(w.op, fmt.Sprintf("%s holds lock_version %q (stored as %s): want an integer",
			w.resource(), row.lv.String, cmp.Or(row.kind.String, "a non-integer")), nil)
	case v != rowguard.Write:
		return w.t.spec.Refusal(v, w.op, w.key, w.token, f)
	}
	// The row is locked with lock_version <= token.
	res, err := db.ExecContext(ctx, w.st.write[afterLock], w.writeArgs()...)
	if err != nil {
		return stmtErr(w.op, err)
	}
	if n, err := res.RowsAffected(); err == nil && n == 1 {
		return nil
	}
	return w.confirm(ctx, db)
}

// lockedRow is what the rejection path's locked read found: how many rows
// have the key (two at most), and the last one's lock_version (and, on
// SQLite, its storage class).
type lockedRow struct {
	n        int
	lv, kind sql.NullString
	badType  bool
}

// lockRow runs the locked read of the row's lock_version.
func (w *rowWrite) lockRow(ctx context.Context, db DBTX) (lockedRow, error) {
	d := w.t.d
	var r lockedRow
	rows, err := db.QueryContext(ctx, w.st.sel, w.key...)
	if err != nil {
		if e := w.t.schemaErr(w.op, err); e != nil {
			return r, e
		}
		return r, d.wrapDBErr(w.op+": lock the row", err)
	}
	for rows.Next() {
		r.n++
		dest := []any{&r.lv}
		if d == SQLite {
			dest = append(dest, &r.kind)
		}
		if err := rows.Scan(dest...); err != nil {
			rows.Close()
			return r, fmt.Errorf("dbguard: %s: read lock_version: %w", w.op, err)
		}
		if d == SQLite && r.kind.Valid && r.kind.String != "integer" {
			r.badType = true
		}
	}
	if err := errors.Join(rows.Err(), rows.Close()); err != nil {
		return r, d.wrapDBErr(w.op+": lock the row", err)
	}
	return r, nil
}

// confirm tells, once the rejection path's write reported no row written,
// whether the locked row holds the write: MySQL counts changed rows unless
// the client asked for found rows, so an identical rewrite (same values,
// same token) reports 0 and was written all the same. A key that the
// database now matches against a second row (inserted at READ COMMITTED
// after the locked read) made the statement write nothing.
func (w *rowWrite) confirm(ctx context.Context, db DBTX) error {
	row, err := w.lockRow(ctx, db)
	if err != nil {
		return err
	}
	switch {
	case row.n > 1:
		return w.t.spec.Refusal(rowguard.Ambiguous, w.op, w.key, w.token, rowguard.Found{Rows: row.n})
	case w.kind != rowguard.Delete && row.n == 1 && row.lv.Valid && row.lv.String == strconv.FormatUint(uint64(w.token), 10):
		return nil
	}
	return w.t.spec.Changed(w.op, w.key)
}

// dupErr reports a unique-constraint violation err of the INSERT of a row
// that the locked read found missing. When the key reads now, another
// transaction created the row in between: retryable (the next try learns
// whether its token is newer). Otherwise the row collides with another on
// a unique index other than the one the key is read by, which no retry
// clears: the database's error, naming the index (MySQL) or the
// constraint's columns (SQLite).
func (w *rowWrite) dupErr(ctx context.Context, db DBTX, err error) error {
	row, rerr := w.lockRow(ctx, db)
	if rerr != nil {
		return fmt.Errorf("%w (after %w)", rerr, err)
	}
	if row.n > 0 {
		return &fence.RetryableError{Op: "dbguard: " + w.op, Err: fmt.Errorf("a row %s was created concurrently: %w", w.resource(), err)}
	}
	return fmt.Errorf("dbguard: %s: %s collides with another row on %s: %w", w.op, w.resource(), w.t.d.uniqueName(err), err)
}

// resource describes the row for errors: db.table(k1=v1, k2=v2).
func (w *rowWrite) resource() string { return w.t.spec.Resource(w.key) }

// statementsFor returns the statements of a write of kind with cols, or an
// error wrapping fence.ErrInvalidArgument when the columns cannot be
// written.
func (t *Table) statementsFor(kind rowguard.Kind, cols []Column) (*statements, error) {
	return t.stmts.For(kind, cols, func() (*statements, error) {
		if err := t.spec.CheckColumns(t.d.checkIdent, cols); err != nil {
			return nil, err
		}
		st := &statements{sel: t.selectSQL()}
		for f := range st.write {
			st.write[f] = t.writeSQL(kind, cols, form(f))
		}
		return st, nil
	})
}

// Parts of the statements' own checks (see writeSQL).
const (
	// maxToken is the largest token, 2^64-1.
	maxToken = "18446744073709551615"
	// mysqlStrict holds in a session whose sql_mode has
	// STRICT_TRANS_TABLES or STRICT_ALL_TABLES: a value that a column
	// cannot hold fails the statement there instead of being clipped.
	mysqlStrict = "@@sql_mode LIKE '%STRICT%'"
	// mysqlAutocommit holds in a session with autocommit on, where a
	// statement outside a transaction commits as it returns.
	mysqlAutocommit = "@@autocommit = 1"
)

// writeSQL builds the statement of a write of kind in form f. Its
// arguments, the same in every form, are given by rowWrite.writeArgs.
//
// An UPDATE or DELETE has the key and "lock_version <= ?" in its
// condition, and the statement itself checks what its tokens need of the
// row it reaches. A check kept by the Table would not do: a Table may
// reach several databases, and a table may be altered after the Table's
// first write. Where a check fails, the statement writes nothing, and the
// rejection path, which reads the catalog in its transaction, says why:
//
//   - Fewer than two rows have the key (every form), so that a key the
//     database matches against several rows changes none of them: MySQL
//     compares a number with a VARCHAR key as numbers and a float with a
//     BIGINT key as doubles; SQLite compares with the key column's
//     collation, which may be coarser than the unique index's. MySQL's
//     count reads FOR UPDATE, taking the row's exclusive lock before the
//     write does (a shared lock first would let two writers of the row
//     deadlock), from a derived table (MySQL 8 refuses the target table
//     in a subquery of its own UPDATE otherwise).
//   - SQLite: the stored lock_version is an integer, so that tokens
//     compare as integers (every form).
//   - MySQL, outside the rejection path: lock_version is an exact number,
//     so that tokens compare exactly: CONCAT(lv + 0.0) = CONCAT(lv, '.0')
//     (a decimal added to an integer or DECIMAL gives a decimal, printed
//     with ".0"; added to a DOUBLE, FLOAT or text, a double, printed
//     without); the session is strict, so that a token the column cannot
//     hold fails the statement; and an UPDATE stores 2^64-1 before the
//     token (assignments run left to right), so that a column that cannot
//     hold every token (INT, a signed BIGINT) fails it (1264,
//     fence.ErrLockVersionType) whatever the token.
//   - MySQL, on its own: autocommit is on, so that the statement has
//     committed when it returns; with autocommit off it writes nothing,
//     and the rejection path's transaction commits the write.
//
// An INSERT has no row to check. On MySQL, outside the rejection path, it
// is an INSERT ... SELECT whose condition is the session's strictness and,
// on its own, autocommit. Elsewhere, it is the plain INSERT.
func (t *Table) writeSQL(kind rowguard.Kind, cols []Column, f form) string {
	mysql := t.d == MySQL
	checked := mysql && f != afterLock // the exact-number, strictness and range checks
	if kind == rowguard.Insert {
		into, values := t.insertParts(cols)
		if !checked {
			return into + " VALUES (" + values + ")"
		}
		cond := mysqlStrict
		if f == onItsOwn {
			cond += " AND " + mysqlAutocommit
		}
		return into + " SELECT " + values + " FROM DUAL WHERE " + cond
	}
	lv := t.d.quote(LockVersionColumn)
	cond := " WHERE " + t.where + " AND " + lv + " <= ?"
	if mysql {
		if checked {
			cond += " AND CONCAT(" + lv + " + 0.0) = CONCAT(" + lv + ", '.0') AND " + mysqlStrict
		}
		cond += " AND (SELECT COUNT(*) FROM (SELECT 1 FROM " + t.ident + " WHERE " + t.where + " LIMIT 2 FOR UPDATE) AS matched) < 2"
		if f == onItsOwn {
			cond += " AND " + mysqlAutocommit
		}
	} else {
		cond += " AND typeof(" + lv + ") = 'integer' AND NOT EXISTS (SELECT 1 FROM " + t.ident + " WHERE " + t.where + " LIMIT 1 OFFSET 1)"
	}
	if kind == rowguard.Delete {
		return "DELETE FROM " + t.ident + cond
	}
	var b strings.Builder
	b.WriteString("UPDATE " + t.ident + " SET ")
	if checked {
		b.WriteString(lv + " = " + maxToken + ", ")
	}
	for _, c := range cols {
		b.WriteString(t.d.quote(c.Name) + " = ?, ")
	}
	b.WriteString(lv + " = ?" + cond)
	return b.String()
}

// insertSQL builds INSERT INTO t (keys..., cols..., lock_version) VALUES (?, ...).
func (t *Table) insertSQL(cols []Column) string {
	into, values := t.insertParts(cols)
	return into + " VALUES (" + values + ")"
}

// insertParts returns "INSERT INTO t (keys..., cols..., lock_version)" and
// its placeholders, "?, ?, ...".
func (t *Table) insertParts(cols []Column) (into, values string) {
	names := make([]string, 0, len(t.spec.Keys)+len(cols)+1)
	for _, k := range t.spec.Keys {
		names = append(names, t.d.quote(k))
	}
	for _, c := range cols {
		names = append(names, t.d.quote(c.Name))
	}
	names = append(names, t.d.quote(LockVersionColumn))
	return "INSERT INTO " + t.ident + " (" + strings.Join(names, ", ") + ")",
		strings.TrimSuffix(strings.Repeat("?, ", len(names)), ", ")
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
