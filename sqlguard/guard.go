package sqlguard

import (
	"context"
	"errors"
	"fmt"
	"strconv"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/fencekit/fencekit/fence"
	"github.com/fencekit/fencekit/internal/options"
	"github.com/fencekit/fencekit/internal/pgident"
	"github.com/fencekit/fencekit/internal/rowguard"
)

// MaxResourceLen is the longest resource name a Guard accepts, in bytes.
const MaxResourceLen = 1024

// Options configure a Guard. The zero value is valid.
type Options struct {
	// Schema is the schema holding the toolkit's table
	// (fencekit_resource_tokens) and function (fencekit_advance_token),
	// created there by package migrations. Default "": unqualified names,
	// found through the connection's search_path, which is where
	// migrations.Up puts them by default.
	Schema string

	// TxOptions are used by BeginFunc to begin its transaction, exactly as
	// pgx.BeginTxFunc uses them. Default: the zero value, which begins
	// with the server's default isolation level (READ COMMITTED unless
	// configured otherwise). AccessMode pgx.ReadOnly is refused: the guard
	// writes. A BeginQuery, if set, is sent as it is, as a statement of its
	// own; the guard never adds to it. CommitQuery, if set, ends the
	// transaction.
	TxOptions pgx.TxOptions

	// Observer, when set, receives a fence.WriteEvent for every Advance
	// and BeginFunc (Guard "sqlguard", Class "transaction", Op "advance"
	// or "transaction"), after its outcome is known. Default: none.
	Observer fence.WriteObserver
}

// Option changes Options.
type Option func(*Options)

// WithSchema sets Options.Schema.
func WithSchema(schema string) Option { return func(o *Options) { o.Schema = schema } }

// WithTxOptions sets Options.TxOptions.
func WithTxOptions(txOptions pgx.TxOptions) Option {
	return func(o *Options) { o.TxOptions = txOptions }
}

// WithObserver sets Options.Observer.
func WithObserver(o fence.WriteObserver) Option { return func(opts *Options) { opts.Observer = o } }

// Guard fences whole resources: any SQL, on any tables, that runs in a
// transaction whose token for the resource has been advanced (by BeginFunc
// or Advance). It keeps one row per resource in the toolkit's table. A
// Guard holds only its options; it is safe for concurrent use.
type Guard struct {
	opts    Options
	advance string // the advance statement: $1 the resource's UTF-8 bytes, $2 the token
}

// New returns a Guard configured by opts. It does no I/O. It returns an
// error wrapping fence.ErrInvalidArgument, listing every problem, when Schema is not a
// valid identifier or TxOptions has an unknown value or is read-only.
func New(opts ...Option) (*Guard, error) {
	o := options.Apply(opts)
	var errs []error
	if o.Schema != "" {
		errs = append(errs, checkIdent("schema", o.Schema))
	}
	txo := o.TxOptions
	switch txo.IsoLevel {
	case "", pgx.Serializable, pgx.RepeatableRead, pgx.ReadCommitted, pgx.ReadUncommitted:
	default:
		errs = append(errs, fmt.Errorf("%w: unknown isolation level %q", fence.ErrInvalidArgument, txo.IsoLevel))
	}
	switch txo.AccessMode {
	case "", pgx.ReadWrite:
	case pgx.ReadOnly:
		errs = append(errs, fmt.Errorf("%w: read-only transactions cannot advance a token", fence.ErrInvalidArgument))
	default:
		errs = append(errs, fmt.Errorf("%w: unknown access mode %q", fence.ErrInvalidArgument, txo.AccessMode))
	}
	switch txo.DeferrableMode {
	case "", pgx.Deferrable, pgx.NotDeferrable:
	default:
		errs = append(errs, fmt.Errorf("%w: unknown deferrable mode %q", fence.ErrInvalidArgument, txo.DeferrableMode))
	}
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}

	fn := pgx.Identifier{AdvanceFunction}.Sanitize()
	if o.Schema != "" {
		fn = pgx.Identifier{o.Schema, AdvanceFunction}.Sanitize()
	}
	// The resource name goes as bytes and is decoded by the server as
	// UTF-8, so that it arrives exactly whatever the session's
	// client_encoding (a text parameter would be decoded as that
	// encoding, turning one name into another).
	return &Guard{opts: o, advance: "SELECT " + fn + "(pg_catalog.convert_from($1::bytea, 'UTF8'), $2::bigint)"}, nil
}

// Options returns a copy of the Guard's options.
func (g *Guard) Options() Options { return g.opts }

// Advance is the resource check for a transaction you manage yourself: call
// it first in tx, then write. It stores token as the resource's newest
// token if it is >= the stored one (or the resource has none yet), and the
// resource's row stays locked until tx ends: a holder with a newer token
// waits at its own Advance until tx commits or rolls back, and then the
// stale one of the two is rejected. It runs one statement (one round trip).
// It takes a pgx.Tx because the fence is that lock: on a pool or a
// connection in autocommit it would be released at once and protect
// nothing.
//
// It returns nil when the token was accepted; a *fence.StaleError
// (matching fence.ErrStaleToken) with the stored token when that is newer,
// after which the transaction is aborted and must be rolled back; an error
// matching fence.ErrRetryable on a serialization failure (under REPEATABLE READ
// or SERIALIZABLE, when another transaction advanced the resource after
// this one's snapshot) or a deadlock; fence.ErrNotMigrated when the toolkit's
// function is missing; other database errors wrapped. Bad arguments are
// reported before any I/O (fence.ErrInvalidToken, fence.ErrInvalidArgument). ctx bounds
// the statement. If ctx ends or the connection breaks while the statement
// is at the server, the error is plain (never fence.ErrOutcomeUnknown):
// what the statement did counts only if tx commits, and an interrupted
// statement leaves tx unable to (pgx closes its connection, or the server
// aborts the transaction when a cancel request reaches it).
func (g *Guard) Advance(ctx context.Context, tx pgx.Tx, resource string, token fence.Token) error {
	e := fence.WriteEvent{Ctx: ctx, Guard: "sqlguard", Class: "transaction", Op: "advance", Resource: resource, Token: token}
	return fence.Observe(g.opts.Observer, e, func() error { return g.advanceTx(ctx, tx, resource, token) })
}

func (g *Guard) advanceTx(ctx context.Context, tx pgx.Tx, resource string, token fence.Token) error {
	op := "advance " + strconv.Quote(resource)
	tok, err := g.check(tx, resource, token, true)
	if err != nil {
		return fmt.Errorf("sqlguard: %s: %w", op, err)
	}
	_, err = tx.Exec(ctx, g.advance, []byte(resource), tok)
	return g.advanceErr(op, resource, token, err)
}

// BeginFunc runs fn in a transaction fenced for resource, in the manner of
// pgx.BeginTxFunc. It begins a transaction (with Options.TxOptions),
// advances the resource's token to token as Advance does, runs fn with the
// transaction, and commits it if fn returns nil; otherwise it rolls back
// and returns fn's error. If the token is stale, it rolls back and returns
// the *fence.StaleError before fn runs.
//
// Because the resource's row stays locked until the transaction ends, a
// holder with a newer token blocks in its own BeginFunc until this one
// commits or rolls back; and once a newer holder has advanced the
// resource, this holder cannot commit anything: a BeginFunc that started
// earlier but reaches the advance later gets the stale error. Every write
// that must be fenced has to happen inside fn, with the tx it is given.
//
// With a *pgxpool.Pool, a *pgxpool.Conn or a *pgx.Conn, the begin query
// and the advance are sent together as one batch (pgx.Batch.BeginTx), two
// statements with bind parameters in one round trip, so the fence costs
// no extra round trip: the transaction takes BEGIN+advance, fn's
// statements, COMMIT. With any other Beginner (a pgx.Tx, which makes a
// savepoint) they are two round trips. A stale token costs one more round
// trip (the ROLLBACK).
//
// Errors: a *fence.StaleError; an error matching fence.ErrRetryable for a
// serialization failure or deadlock while advancing or committing (retry
// the whole BeginFunc; IsRetryable also recognizes them in fn's own
// errors); fence.ErrNotMigrated; fn's error as returned; an error matching
// fence.ErrOutcomeUnknown, joined with its cause (such as
// context.DeadlineExceeded), when ctx ended or the connection broke after
// COMMIT was sent and before its answer came: the transaction may have
// committed, or may still commit (not for a savepoint, whose release
// commits nothing); other database errors wrapped. A failure
// before COMMIT was sent, even one in flight, commits nothing (PostgreSQL
// rolls back the transaction of a connection that pgx closed) and is a
// plain error. Bad arguments are reported before any I/O. ctx bounds the
// whole transaction, including fn's statements if fn uses it.
func (g *Guard) BeginFunc(ctx context.Context, db Beginner, resource string, token fence.Token, fn func(pgx.Tx) error) error {
	e := fence.WriteEvent{Ctx: ctx, Guard: "sqlguard", Class: "transaction", Op: "transaction", Resource: resource, Token: token}
	return fence.Observe(g.opts.Observer, e, func() error { return g.beginFunc(ctx, db, resource, token, fn) })
}

func (g *Guard) beginFunc(ctx context.Context, db Beginner, resource string, token fence.Token, fn func(pgx.Tx) error) error {
	op := "fenced transaction " + strconv.Quote(resource)
	tok, err := g.check(db, resource, token, fn != nil)
	if err != nil {
		return fmt.Errorf("sqlguard: %s: %w", op, err)
	}

	var tx pgx.Tx
	switch d := db.(type) {
	case *pgxpool.Pool:
		tx, err = g.beginBatch(ctx, d, op, resource, token, tok)
	case *pgxpool.Conn:
		tx, err = g.beginBatch(ctx, d, op, resource, token, tok)
	case *pgx.Conn:
		tx, err = g.beginBatch(ctx, d, op, resource, token, tok)
	default:
		tx, err = g.beginGeneric(ctx, db, op, resource, token, tok)
	}
	if err != nil {
		return err
	}
	// A no-op after Commit; rolls back when fn fails or panics.
	defer tx.Rollback(ctx) //nolint:errcheck

	if err := fn(tx); err != nil {
		return err
	}
	if err := tx.Commit(ctx); err != nil {
		if _, savepoint := db.(pgx.Tx); savepoint || errors.Is(err, pgx.ErrTxCommitRollback) {
			// A savepoint's release commits nothing: the outer
			// transaction, whose connection pgx closes on such a
			// failure, never can.
			return wrapDBErr(op+": commit", err)
		}
		return sentErr(op+": commit", err, nil)
	}
	return nil
}

// batchSender sends a pgx.Batch; *pgxpool.Pool, *pgxpool.Conn and
// *pgx.Conn are the ones whose batches can begin a transaction.
type batchSender interface {
	SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults
}

// beginBatch sends the begin query and the advance in one batch: one
// round trip once pgx has prepared both statements on the connection.
func (g *Guard) beginBatch(ctx context.Context, db batchSender, op, resource string, token fence.Token, tok int64) (pgx.Tx, error) {
	b := &pgx.Batch{}
	b.BeginTx(g.opts.TxOptions)
	b.Queue(g.advance, []byte(resource), tok)
	br := db.SendBatch(ctx, b)
	tx := br.Tx()
	// Preparing the batch's statements (the first time on a connection)
	// fails for both at the first result: the begin query's.
	_, err := br.Exec()
	if err == nil {
		_, err = br.Exec()
	}
	err = g.advanceErr(op, resource, token, err)
	if cerr := br.Close(); err == nil && cerr != nil {
		err = wrapDBErr(op, cerr)
	}
	if err == nil {
		return tx, nil
	}
	// Roll back whatever began (a pool's connection goes back to the
	// pool even when nothing did).
	if rbErr := tx.Rollback(ctx); rbErr != nil && !errors.Is(rbErr, pgx.ErrTxClosed) {
		err = errors.Join(err, fmt.Errorf("sqlguard: %s: rollback: %w", op, rbErr))
	}
	return nil, err
}

// beginGeneric begins with the Beginner and then advances: two round trips.
func (g *Guard) beginGeneric(ctx context.Context, db Beginner, op, resource string, token fence.Token, tok int64) (pgx.Tx, error) {
	var (
		tx  pgx.Tx
		err error
	)
	if g.opts.TxOptions != (pgx.TxOptions{}) {
		tb, ok := db.(TxBeginner)
		if !ok {
			return nil, fmt.Errorf("sqlguard: %s: %w: TxOptions are set but %T has no BeginTx (a pgx.Tx cannot change isolation)", op, fence.ErrInvalidArgument, db)
		}
		tx, err = tb.BeginTx(ctx, g.opts.TxOptions)
	} else {
		tx, err = db.Begin(ctx)
	}
	if err != nil {
		return nil, wrapDBErr(op+": begin", err)
	}
	if _, err := tx.Exec(ctx, g.advance, []byte(resource), tok); err != nil {
		err = g.advanceErr(op, resource, token, err)
		if rbErr := tx.Rollback(ctx); rbErr != nil && !errors.Is(rbErr, pgx.ErrTxClosed) {
			err = errors.Join(err, fmt.Errorf("sqlguard: %s: rollback: %w", op, rbErr))
		}
		return nil, err
	}
	return tx, nil
}

// check validates the arguments of Advance and BeginFunc (fn: BeginFunc's
// function is not nil; true for Advance).
func (g *Guard) check(db any, resource string, token fence.Token, fn bool) (int64, error) {
	tok, err := tokenArg(token)
	return tok, rowguard.CheckFenced(err, db, resource, MaxResourceLen, fn)
}

// advanceErr maps an error from the advance statement. A rejection
// (SQLSTATE FK409) always matches fence.ErrStaleToken; its DETAIL is the
// stored token, and when that cannot be read the *fence.StaleError carries
// Current = fence.None, meaning unknown.
func (g *Guard) advanceErr(op, resource string, token fence.Token, err error) error {
	if err == nil {
		return nil
	}
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		switch pgErr.Code {
		case codeStale:
			cur, perr := strconv.ParseInt(pgErr.Detail, 10, 64)
			if perr != nil || cur <= 0 {
				return fmt.Errorf("sqlguard: %s: current token unreadable (DETAIL %q): %w: %w",
					op, pgErr.Detail, fence.Stale(resource, token, fence.None), err)
			}
			return fence.Stale(resource, token, fence.Token(cur))
		case codeUndefinedFunction, codeUndefinedTable, codeInvalidSchemaName:
			return g.notMigrated(op, err)
		}
	}
	return wrapDBErr(op, err)
}

// notMigrated is the error for a schema without the toolkit's table or
// function: err is the database's error, or nil when a check found it.
func (g *Guard) notMigrated(op string, err error) error {
	where := "in the connection's search_path"
	cmd := "fencekit migrate up"
	if g.opts.Schema != "" {
		where = fmt.Sprintf("in schema %q (Options.Schema)", g.opts.Schema)
		cmd += " --schema " + pgident.ShellWord(g.opts.Schema)
	}
	what := fmt.Errorf("sqlguard: %s: %w: %s and %s not found %s", op, fence.ErrNotMigrated, ResourceTable, AdvanceFunction, where)
	if err != nil {
		what = fmt.Errorf("%w: %w", what, err)
	}
	return &fence.SetupError{Err: what, Fix: "run `" + cmd + "` there (or migrations.Up), or point the guard at the schema that has them (Options.Schema, sqlguard.WithSchema; --schema on the fencekit command)"}
}
