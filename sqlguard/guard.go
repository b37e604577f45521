package sqlguard

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/fencekit/fencekit/fence"
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

	// TxOptions are used by BeginFunc to begin its transaction. Default:
	// the zero value, which begins with the server's default isolation
	// level (READ COMMITTED unless configured otherwise). AccessMode
	// pgx.ReadOnly is refused: the guard writes. A BeginQuery, if set, must
	// be one statement; the guard appends its own.
	TxOptions pgx.TxOptions
}

// Option changes Options.
type Option func(*Options)

// WithSchema sets Options.Schema.
func WithSchema(schema string) Option { return func(o *Options) { o.Schema = schema } }

// WithTxOptions sets Options.TxOptions.
func WithTxOptions(txOptions pgx.TxOptions) Option {
	return func(o *Options) { o.TxOptions = txOptions }
}

// Guard fences whole resources: any SQL, on any tables, that runs in a
// transaction whose token for the resource has been advanced (by BeginFunc
// or Advance). It keeps one row per resource in the toolkit's table. A
// Guard holds only its options; it is safe for concurrent use.
type Guard struct {
	opts     Options
	fn       string // quoted, possibly qualified function name
	advance  string // the advance statement with $1, $2
	beginSQL string // BEGIN with the isolation options
}

// New returns a Guard configured by opts. It does no I/O. It returns an
// error wrapping ErrInvalid, listing every problem, when Schema is not a
// valid identifier or TxOptions has an unknown value or is read-only.
func New(opts ...Option) (*Guard, error) {
	var o Options
	for _, opt := range opts {
		if opt != nil {
			opt(&o)
		}
	}
	var errs []error
	if o.Schema != "" {
		errs = append(errs, checkIdent("schema", o.Schema))
	}
	txo := o.TxOptions
	switch txo.IsoLevel {
	case "", pgx.Serializable, pgx.RepeatableRead, pgx.ReadCommitted, pgx.ReadUncommitted:
	default:
		errs = append(errs, fmt.Errorf("%w: unknown isolation level %q", ErrInvalid, txo.IsoLevel))
	}
	switch txo.AccessMode {
	case "", pgx.ReadWrite:
	case pgx.ReadOnly:
		errs = append(errs, fmt.Errorf("%w: read-only transactions cannot advance a token", ErrInvalid))
	default:
		errs = append(errs, fmt.Errorf("%w: unknown access mode %q", ErrInvalid, txo.AccessMode))
	}
	switch txo.DeferrableMode {
	case "", pgx.Deferrable, pgx.NotDeferrable:
	default:
		errs = append(errs, fmt.Errorf("%w: unknown deferrable mode %q", ErrInvalid, txo.DeferrableMode))
	}
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}

	g := &Guard{opts: o}
	if o.Schema != "" {
		g.fn = pgx.Identifier{o.Schema, AdvanceFunction}.Sanitize()
	} else {
		g.fn = pgx.Identifier{AdvanceFunction}.Sanitize()
	}
	g.advance = "SELECT " + g.fn + "($1::text, $2::bigint)"
	if txo.BeginQuery != "" {
		g.beginSQL = strings.TrimRight(strings.TrimSpace(txo.BeginQuery), ";")
	} else {
		b := "BEGIN"
		if txo.IsoLevel != "" {
			b += " ISOLATION LEVEL " + string(txo.IsoLevel)
		}
		if txo.AccessMode != "" {
			b += " " + string(txo.AccessMode)
		}
		if txo.DeferrableMode != "" {
			b += " " + string(txo.DeferrableMode)
		}
		g.beginSQL = b
	}
	return g, nil
}

// Options returns a copy of the Guard's options.
func (g *Guard) Options() Options { return g.opts }

// Advance is the resource check for a transaction you manage yourself: call
// it first in the transaction, with tx, then write. It stores token as the
// resource's newest token if it is >= the stored one (or the resource has
// none yet), and the resource's row stays locked until tx ends: a holder
// with a newer token waits at its own Advance until tx commits or rolls
// back, and then the stale one of the two is rejected. It runs one
// statement (one round trip).
//
// It returns nil when the token was accepted; a *fence.StaleError
// (matching fence.ErrStaleToken) with the stored token when that is newer,
// after which the transaction is aborted and must be rolled back; an error
// matching ErrRetryable on a serialization failure (under REPEATABLE READ
// or SERIALIZABLE, when another transaction advanced the resource after
// this one's snapshot) or a deadlock; ErrNotMigrated when the toolkit's
// function is missing; other database errors wrapped. Bad arguments are
// reported before any I/O (fence.ErrInvalidToken, ErrInvalid). ctx bounds
// the statement.
//
// Called outside a transaction (a pool or a connection in autocommit), it
// only records the token: nothing stays locked.
func (g *Guard) Advance(ctx context.Context, tx DBTX, resource string, token fence.Token) error {
	op := "advance " + strconv.Quote(resource)
	tok, err := g.check(tx, resource, token)
	if err != nil {
		return fmt.Errorf("sqlguard: %s: %w", op, err)
	}
	_, err = tx.Exec(ctx, g.advance, resource, tok)
	return g.advanceErr(op, resource, token, err)
}

// BeginFunc runs fn in a transaction fenced for resource, in the manner of
// pgx.BeginFunc. It begins a transaction (with Options.TxOptions), advances
// the resource's token to token as Advance does, runs fn with the
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
// With a *pgxpool.Pool or a *pgx.Conn, BEGIN and the advance go to the
// server in one simple-protocol message, so the fence costs no extra round
// trip: the transaction takes BEGIN+advance, fn's statements, COMMIT. With
// any other Beginner (a pgx.Tx, which makes a savepoint) they are two round
// trips. A stale token costs one more round trip (the ROLLBACK).
//
// Errors: a *fence.StaleError; an error matching ErrRetryable for a
// serialization failure or deadlock while advancing or committing (retry
// the whole BeginFunc; IsRetryable also recognizes them in fn's own
// errors); ErrNotMigrated; fn's error as returned; other database errors
// wrapped. Bad arguments are reported before any I/O. ctx bounds the whole
// transaction, including fn's statements if fn uses it.
func (g *Guard) BeginFunc(ctx context.Context, db Beginner, resource string, token fence.Token, fn func(pgx.Tx) error) error {
	op := "fenced transaction " + strconv.Quote(resource)
	tok, err := g.check(db, resource, token)
	if fn == nil {
		err = errors.Join(err, fmt.Errorf("%w: nil function", ErrInvalid))
	}
	if err != nil {
		return fmt.Errorf("sqlguard: %s: %w", op, err)
	}

	var tx pgx.Tx
	switch d := db.(type) {
	case *pgxpool.Pool:
		pc, err := d.Acquire(ctx)
		if err != nil {
			return fmt.Errorf("sqlguard: %s: acquire connection: %w", op, err)
		}
		defer pc.Release()
		tx, err = g.beginConn(ctx, pc.Conn(), op, resource, token, tok)
		if err != nil {
			return err
		}
	case *pgx.Conn:
		tx, err = g.beginConn(ctx, d, op, resource, token, tok)
		if err != nil {
			return err
		}
	default:
		tx, err = g.beginGeneric(ctx, db, op, resource, token, tok)
		if err != nil {
			return err
		}
	}
	// A no-op after Commit; rolls back when fn fails or panics.
	defer tx.Rollback(ctx) //nolint:errcheck

	if err := fn(tx); err != nil {
		return err
	}
	if err := tx.Commit(ctx); err != nil {
		return wrapDBErr(op+": commit", err)
	}
	return nil
}

// beginConn sends BEGIN and the advance in one simple-protocol message.
func (g *Guard) beginConn(ctx context.Context, c *pgx.Conn, op, resource string, token fence.Token, tok int64) (pgx.Tx, error) {
	q := g.beginSQL + "; SELECT " + g.fn + "(" + quoteLiteral(resource) + "::text, " + strconv.FormatInt(tok, 10) + "::bigint)"
	tx, err := c.BeginTx(ctx, pgx.TxOptions{BeginQuery: q, CommitQuery: g.opts.TxOptions.CommitQuery})
	if err == nil {
		return tx, nil
	}
	err = g.advanceErr(op, resource, token, err)
	// BEGIN succeeded and the advance failed: the connection is in an
	// aborted transaction. (If pgx closed it, there is nothing to do.)
	if !c.IsClosed() && c.PgConn().TxStatus() != 'I' {
		if _, rbErr := c.Exec(ctx, "ROLLBACK"); rbErr != nil {
			err = errors.Join(err, fmt.Errorf("sqlguard: %s: rollback: %w", op, rbErr))
		}
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
			return nil, fmt.Errorf("sqlguard: %s: %w: TxOptions are set but %T has no BeginTx (a pgx.Tx cannot change isolation)", op, ErrInvalid, db)
		}
		tx, err = tb.BeginTx(ctx, g.opts.TxOptions)
	} else {
		tx, err = db.Begin(ctx)
	}
	if err != nil {
		return nil, wrapDBErr(op+": begin", err)
	}
	if _, err := tx.Exec(ctx, g.advance, resource, tok); err != nil {
		err = g.advanceErr(op, resource, token, err)
		if rbErr := tx.Rollback(ctx); rbErr != nil && !errors.Is(rbErr, pgx.ErrTxClosed) {
			err = errors.Join(err, fmt.Errorf("sqlguard: %s: rollback: %w", op, rbErr))
		}
		return nil, err
	}
	return tx, nil
}

// check validates the arguments shared by Advance and BeginFunc.
func (g *Guard) check(db any, resource string, token fence.Token) (int64, error) {
	tok, err := tokenArg(token)
	var errs []error
	errs = append(errs, err)
	if isNil(db) {
		errs = append(errs, fmt.Errorf("%w: nil database", ErrInvalid))
	}
	errs = append(errs, checkResource(resource))
	return tok, errors.Join(errs...)
}

func checkResource(resource string) error {
	switch {
	case resource == "":
		return fmt.Errorf("%w: empty resource name", ErrInvalid)
	case len(resource) > MaxResourceLen:
		return fmt.Errorf("%w: resource name is %d bytes, more than %d", ErrInvalid, len(resource), MaxResourceLen)
	case !utf8.ValidString(resource):
		return fmt.Errorf("%w: resource name %q is not valid UTF-8", ErrInvalid, resource)
	case strings.IndexByte(resource, 0) >= 0:
		return fmt.Errorf("%w: resource name %q contains a NUL byte", ErrInvalid, resource)
	}
	return nil
}

// advanceErr maps an error from the advance statement.
func (g *Guard) advanceErr(op, resource string, token fence.Token, err error) error {
	if err == nil {
		return nil
	}
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		switch pgErr.Code {
		case codeStale:
			cur, perr := strconv.ParseInt(pgErr.Detail, 10, 64)
			if perr != nil {
				return fmt.Errorf("sqlguard: %s: stale token, unreadable current token %q: %w", op, pgErr.Detail, err)
			}
			return fence.Stale(resource, token, fence.Token(cur))
		case codeUndefinedFunction, codeUndefinedTable, codeInvalidSchemaName:
			return fmt.Errorf("sqlguard: %s: %w: %w", op, ErrNotMigrated, err)
		}
	}
	return wrapDBErr(op, err)
}

// quoteLiteral returns s as an E” string literal, which means the same
// whatever standard_conforming_strings is. pgx always talks UTF-8 to the
// server, so no multibyte character can hide a quote or backslash.
func quoteLiteral(s string) string {
	s = strings.ReplaceAll(s, `\`, `\\`)
	s = strings.ReplaceAll(s, `'`, `''`)
	return "E'" + s + "'"
}
