package dbguard

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync/atomic"

	"github.com/fencekit/fencekit/fence"
	"github.com/fencekit/fencekit/internal/options"
	"github.com/fencekit/fencekit/internal/rowguard"
)

// MaxResourceLen is the longest resource name a Guard accepts, in bytes
// (the resource table's key is VARBINARY(1024) on MySQL).
const MaxResourceLen = 1024

// Options configure a Guard. The zero value is valid.
type Options struct {
	// Database is the database (MySQL) or attached schema (SQLite)
	// holding the toolkit's table fencekit_resource_tokens, created there
	// by package migrations. Default "": the connection's current
	// database (SQLite: main).
	Database string

	// TxOptions are used by BeginFunc to begin its transaction. Default:
	// the zero value, the server's default isolation (REPEATABLE READ on
	// MySQL and MariaDB; SQLite's transactions are serializable). ReadOnly
	// is refused: the guard writes.
	TxOptions sql.TxOptions

	// Observer, when set, receives a fence.WriteEvent for every Advance
	// and BeginFunc (Guard "dbguard", Class "transaction", Op "advance"
	// or "transaction"), after its outcome is known. Default: none.
	// Table.WithObserver reports a Table's writes.
	Observer fence.WriteObserver
}

// Option changes Options.
type Option func(*Options)

// WithDatabase sets Options.Database.
func WithDatabase(name string) Option { return func(o *Options) { o.Database = name } }

// WithObserver sets Options.Observer.
func WithObserver(o fence.WriteObserver) Option { return func(opts *Options) { opts.Observer = o } }

// WithTxOptions sets Options.TxOptions.
func WithTxOptions(txOptions sql.TxOptions) Option {
	return func(o *Options) { o.TxOptions = txOptions }
}

// Guard fences whole resources: any SQL, on any tables, that runs in a
// transaction whose token for the resource has been advanced (by BeginFunc
// or Advance). It keeps one row per resource in the toolkit's table, and
// that row stays locked until the transaction ends. A Guard holds only its
// options; it is safe for concurrent use.
type Guard struct {
	d       Dialect
	opts    Options
	table   string // quoted, qualified fencekit_resource_tokens
	advance string
	insert  string // SQLite: the advance when advance changed no row
	read    string

	// prepared is the advance statement prepared on the last *sql.DB
	// BeginFunc was given: database/sql keeps it prepared on each of
	// the pool's connections, so an advance costs one round trip (no
	// prepare) once a connection has run it.
	prepared atomic.Pointer[preparedAdvance]
}

type preparedAdvance struct {
	db   *sql.DB
	stmt *sql.Stmt
}

// advanceStmt returns the advance statement prepared on db, preparing it
// at the first call for db (nil if that fails: the advance is then sent
// unprepared, and its error says why). Only the last db is kept.
func (g *Guard) advanceStmt(ctx context.Context, db *sql.DB) *sql.Stmt {
	if p := g.prepared.Load(); p != nil && p.db == db {
		return p.stmt
	}
	st, err := db.PrepareContext(ctx, g.advance)
	if err != nil {
		return nil
	}
	if !g.prepared.CompareAndSwap(g.prepared.Load(), &preparedAdvance{db: db, stmt: st}) {
		// Another call prepared one at the same time: use it, and let
		// database/sql close this one with db.
		if p := g.prepared.Load(); p != nil && p.db == db {
			_ = st.Close()
			return p.stmt
		}
	}
	return st
}

// New returns a Guard for dialect d configured by opts. It does no I/O. It
// returns an error wrapping fence.ErrInvalidArgument, listing every problem, when the
// dialect is unknown, Database is not a valid identifier, or TxOptions is
// read-only or has an isolation level the dialect does not have (SQLite:
// only the default and serializable, which are the same there).
func New(d Dialect, opts ...Option) (*Guard, error) {
	if !d.valid() {
		return nil, fmt.Errorf("%w: unknown dialect %v (use dbguard.MySQL or dbguard.SQLite)", fence.ErrInvalidArgument, d)
	}
	o := options.Apply(opts)
	var errs []error
	if o.Database != "" {
		errs = append(errs, d.checkIdent("database", o.Database))
	}
	if o.TxOptions.ReadOnly {
		errs = append(errs, fmt.Errorf("%w: read-only transactions cannot advance a token", fence.ErrInvalidArgument))
	}
	switch iso := o.TxOptions.Isolation; {
	case iso == sql.LevelDefault, iso == sql.LevelSerializable:
	case d == MySQL && (iso == sql.LevelReadUncommitted || iso == sql.LevelReadCommitted || iso == sql.LevelRepeatableRead):
	default:
		// SQLite's transactions are serializable, and its drivers
		// ignore any other level: refuse it rather than pretend.
		errs = append(errs, fmt.Errorf("%w: isolation level %v is not one %s has", fence.ErrInvalidArgument, o.TxOptions.Isolation, d))
	}
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	g := &Guard{d: d, opts: o, table: d.qualified(o.Database, ResourceTable)}
	res, tok, adv := d.quote("resource"), d.quote("token"), d.quote("advances")
	if d == MySQL {
		// Assignments run left to right and later ones see the new
		// values: advances first, against the old token. advances
		// changes whenever the token is accepted (even an equal one), so
		// an accepted advance of an existing row always reports 2 rows
		// affected, whether or not the client asked for found rows.
		g.advance = "INSERT INTO " + g.table + " (" + res + ", " + tok + ", " + adv + ") VALUES (?, ?, 0) ON DUPLICATE KEY UPDATE " +
			adv + " = IF(" + tok + " <= ?, " + adv + " + 1, " + adv + "), " + tok + " = GREATEST(" + tok + ", ?)"
		g.read = "SELECT " + tok + " FROM " + g.table + " WHERE " + res + " = ? FOR UPDATE"
	} else {
		// The common case (the resource exists, the token is accepted)
		// is a plain UPDATE, which SQLite runs faster than the upsert; the
		// upsert follows only when it changed no row (a new resource, or a
		// newer token stored).
		g.advance = "UPDATE " + g.table + " SET " + tok + " = ? WHERE " + res + " = ? AND " + tok + " <= ?"
		g.insert = "INSERT INTO " + g.table + " (" + res + ", " + tok + ") VALUES (?, ?) ON CONFLICT (" + res + ") DO UPDATE SET " +
			tok + " = excluded." + tok + " WHERE " + tok + " <= excluded." + tok
		g.read = "SELECT " + tok + " FROM " + g.table + " WHERE " + res + " = ?"
	}
	return g, nil
}

// Options returns a copy of the Guard's options.
func (g *Guard) Options() Options { return g.opts }

// Dialect returns the Guard's dialect.
func (g *Guard) Dialect() Dialect { return g.d }

// Advance is the resource check for a transaction you manage yourself:
// call it first in tx, then write. It stores token as the resource's
// newest token if it is >= the stored one (or the resource has none yet),
// and the resource's row stays locked until tx ends (MySQL: an exclusive
// record lock; SQLite: the database's write lock, which this statement
// takes): a holder with a newer token waits at its own Advance until tx
// commits or rolls back, and then the stale one of the two is rejected.
// One statement when the resource exists and the token is accepted. On
// MySQL, a second (a read of the locked row) for a new resource and for a
// rejection; on SQLite, a second (an insert) for a new resource, and a
// third (the read) for a rejection.
//
// It returns nil when the token was accepted; a *fence.StaleError
// (matching fence.ErrStaleToken) with the stored token when that is newer
// (roll tx back); an error matching fence.ErrRetryable on a deadlock, lock wait
// timeout or busy database; fence.ErrNotMigrated when the toolkit's table is
// missing; other database errors wrapped. Bad arguments are reported
// before any I/O (fence.ErrInvalidToken, fence.ErrInvalidArgument). ctx bounds the
// statements. It never returns fence.ErrOutcomeUnknown: what it did counts
// only if tx commits.
func (g *Guard) Advance(ctx context.Context, tx *sql.Tx, resource string, token fence.Token) error {
	e := fence.WriteEvent{Ctx: ctx, Guard: "dbguard", Class: "transaction", Op: "advance", Resource: resource, Token: token}
	return fence.Observe(g.opts.Observer, e, func() error { return g.advanceTx(ctx, tx, resource, token) })
}

func (g *Guard) advanceTx(ctx context.Context, tx *sql.Tx, resource string, token fence.Token) error {
	op := opName{"advance", resource}
	tok, err := g.check(tx, resource, token, true)
	if err != nil {
		return fmt.Errorf("dbguard: %s: %w", op, err)
	}
	return g.advanceIn(ctx, tx, nil, op, resource, token, tok)
}

// advanceIn advances the resource in tx, through st (the advance
// statement prepared on tx's database) when it is not nil.
func (g *Guard) advanceIn(ctx context.Context, tx *sql.Tx, st *sql.Stmt, op opName, resource string, token fence.Token, tok any) error {
	var run interface {
		ExecContext(ctx context.Context, args ...any) (sql.Result, error)
	}
	if st != nil {
		run = tx.StmtContext(ctx, st)
	} else {
		run = unprepared{tx: tx, query: g.advance}
	}
	if g.d == MySQL {
		res, err := run.ExecContext(ctx, []byte(resource), tok, tok, tok)
		if err != nil {
			return g.advanceErr(op.String(), err)
		}
		if n, err := res.RowsAffected(); err == nil && n == 2 {
			return nil
		}
		// 1: inserted, or (with found rows) left as it was; 0: left as
		// it was. The row is locked by this transaction now.
		return g.readBack(ctx, tx, op.String(), resource, []byte(resource), token)
	}
	// SQLite: this transaction holds the database's write lock from the
	// UPDATE on (a write statement takes it before it looks for rows, even
	// when it changes none), so nothing moves between the statements. The
	// UPDATE changes the row when it exists and token is accepted; else
	// the upsert inserts a new resource's row, and counts 0 when the
	// conflict's WHERE failed: a newer token is stored.
	res, err := run.ExecContext(ctx, tok, resource, tok)
	if err != nil {
		return g.advanceErr(op.String(), err)
	}
	if n, err := res.RowsAffected(); err == nil && n == 1 {
		return nil
	}
	if res, err = tx.ExecContext(ctx, g.insert, resource, tok); err != nil {
		return g.advanceErr(op.String(), err)
	}
	if n, err := res.RowsAffected(); err == nil && n == 1 {
		return nil
	}
	return g.readBack(ctx, tx, op.String(), resource, resource, token)
}

// readBack reads the resource's token in tx, whose row is locked, and
// returns nil when it is token, or a *fence.StaleError.
func (g *Guard) readBack(ctx context.Context, tx *sql.Tx, op, resource string, arg any, token fence.Token) error {
	var s string
	if err := tx.QueryRowContext(ctx, g.read, arg).Scan(&s); err != nil {
		return g.advanceErr(op+": read the token", err)
	}
	cur, err := strconv.ParseUint(s, 10, 64)
	if err != nil {
		return fmt.Errorf("dbguard: %s: stored token %q unreadable: %w", op, s, err)
	}
	if cur > uint64(token) {
		return fence.Stale(resource, token, fence.Token(cur))
	}
	if cur != uint64(token) {
		return fmt.Errorf("dbguard: %s: the resource's token is %d after advancing it to %d: something other than the guard writes %s",
			op, cur, token, ResourceTable)
	}
	return nil
}

// BeginFunc runs fn in a transaction fenced for resource, in the manner of
// sqlguard.Guard.BeginFunc. It begins a transaction (with
// Options.TxOptions), advances the resource's token to token as Advance
// does, runs fn with the transaction, and commits it if fn returns nil;
// otherwise it rolls back and returns fn's error. If the token is stale,
// it rolls back and returns the *fence.StaleError before fn runs.
//
// The resource's row stays locked until the transaction ends, so a holder
// with a newer token blocks in its own BeginFunc until this one commits
// or rolls back, and once a newer holder has advanced the resource, this
// holder cannot commit anything: a BeginFunc that started earlier but
// reaches the advance later gets the stale error. Every write that must be
// fenced has to happen inside fn, with the tx it is given.
//
// On SQLite the advance is the transaction's first statement and a write,
// so the transaction takes the database's write lock at once (as BEGIN
// IMMEDIATE would), waiting up to the connection's busy timeout: open the
// database with one (modernc.org/sqlite: _pragma=busy_timeout(5000)), or a
// second writer gets SQLITE_BUSY at once (fence.ErrRetryable).
//
// Errors: a *fence.StaleError; an error matching fence.ErrRetryable for a
// deadlock, lock wait timeout or busy database while beginning, advancing
// or committing (retry the whole BeginFunc; IsRetryable also recognizes
// them in fn's own errors); fence.ErrNotMigrated; fn's error as returned; an
// error matching fence.ErrOutcomeUnknown, joined with its cause, when ctx
// ended or the connection broke after COMMIT was sent and before its
// answer came (the transaction may have committed); other database errors
// wrapped. A failure before COMMIT was sent commits nothing (the server
// rolls back the transaction of a closed connection) and is a plain
// error. Bad arguments are reported before any I/O. ctx bounds the whole
// transaction, including fn's statements if fn uses it.
func (g *Guard) BeginFunc(ctx context.Context, db TxBeginner, resource string, token fence.Token, fn func(*sql.Tx) error) error {
	e := fence.WriteEvent{Ctx: ctx, Guard: "dbguard", Class: "transaction", Op: "transaction", Resource: resource, Token: token}
	return fence.Observe(g.opts.Observer, e, func() error { return g.beginFunc(ctx, db, resource, token, fn) })
}

func (g *Guard) beginFunc(ctx context.Context, db TxBeginner, resource string, token fence.Token, fn func(*sql.Tx) error) error {
	op := opName{"fenced transaction", resource}
	tok, err := g.check(db, resource, token, fn != nil)
	if err != nil {
		return fmt.Errorf("dbguard: %s: %w", op, err)
	}
	var conn *sql.Conn
	var st *sql.Stmt
	switch d := db.(type) {
	case *sql.DB:
		// Prepared before this call takes a connection of its own, so
		// that a pool of one connection is not asked for a second.
		st = g.advanceStmt(ctx, d)
		if conn, err = d.Conn(ctx); err != nil {
			return fmt.Errorf("dbguard: %s: get a connection: %w", op, err)
		}
		defer conn.Close()
		db = conn
	case *sql.Conn:
		conn = d
	}
	txo := g.opts.TxOptions
	tx, err := db.BeginTx(ctx, &txo)
	if err != nil {
		return g.d.wrapDBErr(op.String()+": begin", err)
	}
	defer tx.Rollback() //nolint:errcheck // a no-op after Commit
	if err := g.advanceIn(ctx, tx, st, op, resource, token, tok); err != nil {
		return err
	}
	if err := fn(tx); err != nil {
		return err
	}
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("dbguard: %s: before commit: %w", op, err)
	}
	if err := tx.Commit(); err != nil {
		return g.d.sentErr(ctx, op.String()+": commit", err, conn)
	}
	return nil
}

// check validates the arguments of Advance and BeginFunc (fn: BeginFunc's
// function is not nil; true for Advance).
func (g *Guard) check(db any, resource string, token fence.Token, fn bool) (any, error) {
	tok, err := g.d.tokenArg(token)
	return tok, rowguard.CheckFenced(err, db, resource, MaxResourceLen, fn)
}

// advanceErr maps an error of the advance: a missing table is
// fence.ErrNotMigrated.
func (g *Guard) advanceErr(op string, err error) error {
	missing := false
	if n, ok := mysqlNumber(err); ok && g.d == MySQL {
		missing = n == myNoSuchTable
	}
	if c, ok := sqliteCode(err); ok && g.d == SQLite {
		missing = c&0xff == sqliteError && strings.Contains(err.Error(), "no such table")
	}
	if missing {
		return g.notMigrated(op, err)
	}
	return g.d.wrapDBErr(op, err)
}

// notMigrated is the error for a database without the toolkit's table:
// err is the driver's error, or nil when a check found it.
func (g *Guard) notMigrated(op string, err error) error {
	where := "the connection's current database"
	if g.d == SQLite {
		where = "schema main"
	}
	if g.opts.Database != "" {
		where = fmt.Sprintf("database %q (Options.Database)", g.opts.Database)
	}
	what := fmt.Errorf("dbguard: %s: %w: %s not found in %s", op, fence.ErrNotMigrated, ResourceTable, where)
	if err != nil {
		what = fmt.Errorf("%w: %w", what, err)
	}
	return &fence.SetupError{Err: what, Fix: "run `fencekit migrate up --dialect " + g.d.String() + "` there (or migrations.Up with migrations.WithDialect), or fix Options.Database"}
}

// opName names an operation on a resource in errors ("fenced transaction
// \"orders\""), built only when an error needs it: a transaction that
// succeeds never quotes the resource.
type opName struct{ verb, resource string }

func (o opName) String() string { return o.verb + " " + strconv.Quote(o.resource) }

// unprepared runs query in tx with the shape of a prepared *sql.Stmt.
type unprepared struct {
	tx    *sql.Tx
	query string
}

func (u unprepared) ExecContext(ctx context.Context, args ...any) (sql.Result, error) {
	return u.tx.ExecContext(ctx, u.query, args...)
}
