package sqlguard

import (
	"context"
	"errors"
	"fmt"
	"math"
	"strconv"

	"github.com/jackc/pgx/v5"

	"github.com/fencekit/fencekit/fence"
	"github.com/fencekit/fencekit/fencecheck"
	"github.com/fencekit/fencekit/internal/rowguard"
)

// Checker is a fencecheck.Checker on PostgreSQL, for a service that
// receives fencing tokens from its callers (package fencehttp, fencegrpc)
// and checks them at its boundary. It keeps the newest token of each
// resource in the toolkit's table, fencekit_resource_tokens, through the
// same function as Guard (both created by migrations.Up, `fencekit migrate
// up`), so a Checker and a Guard on the same schema share one order per
// resource: a token checked at the boundary and one advanced in a
// transaction are compared with each other.
//
// Check runs the advance as one statement outside any transaction of
// yours: one round trip, committed at once. It orders checks, not the
// handler's effects (see package fencecheck). When the service's own state
// is in the same database, order the effects too: check the token in the
// transaction that writes the state, with CheckTx (or Guard.BeginFunc;
// Checker.Guard returns the Guard that Check uses); a holder with a newer
// token then waits for that transaction, and a stale one cannot commit.
//
// A Checker is safe for concurrent use.
type Checker struct {
	g       *Guard
	db      DBTX
	current string // $1 the resource's UTF-8 bytes
}

var _ fencecheck.Checker = (*Checker)(nil)

// MaxCheckerToken is the largest token a Checker stores (a PostgreSQL
// bigint); Check refuses a larger one with fencecheck.ErrTokenRange.
const MaxCheckerToken = fence.Token(math.MaxInt64)

// NewChecker returns a Checker that runs its statements on db (a
// *pgxpool.Pool, as a rule: a pgx.Tx would make every check part of that
// transaction), with the options of New (Options.Schema; TxOptions do not
// apply to Check). It does no I/O. It returns an error wrapping fence.ErrInvalidArgument,
// listing every problem, for a nil db or invalid options.
func NewChecker(db DBTX, opts ...Option) (*Checker, error) {
	g, err := New(opts...)
	if rowguard.IsNil(db) {
		err = errors.Join(err, fmt.Errorf("%w: nil database", fence.ErrInvalidArgument))
	}
	if err != nil {
		return nil, err
	}
	table := pgx.Identifier{ResourceTable}.Sanitize()
	if g.opts.Schema != "" {
		table = pgx.Identifier{g.opts.Schema, ResourceTable}.Sanitize()
	}
	return &Checker{g: g, db: db,
		current: "SELECT token FROM " + table + " WHERE resource = pg_catalog.convert_from($1::bytea, 'UTF8')"}, nil
}

// CheckTx is Check as the first statement of your own transaction: it
// advances resource's token to token in tx (Guard.Advance), and the
// token's row stays locked until tx ends. Write the service's state in the
// same tx: a holder with a newer token waits at its own check until tx
// commits or rolls back, and once a newer token has been accepted this one
// cannot commit anything. That orders the service's effects, not only its
// checks. Errors: those of Guard.Advance (a *fence.StaleError, after which
// tx is aborted and must be rolled back; fence.ErrRetryable under REPEATABLE READ
// or SERIALIZABLE; fence.ErrNotMigrated), with bad arguments (and a token above
// MaxCheckerToken) reported before any I/O as Check reports them. ctx bounds the statement.
func (c *Checker) CheckTx(ctx context.Context, tx pgx.Tx, resource string, token fence.Token) error {
	if _, err := c.args(resource, token); err != nil {
		return fmt.Errorf("sqlguard: check %s in a transaction: %w", strconv.Quote(resource), err)
	}
	return c.g.Advance(ctx, tx, resource, token)
}

// Guard returns the Guard whose advance Check runs, for checks that must
// be part of your own transaction (Guard.Advance, Guard.BeginFunc).
func (c *Checker) Guard() *Guard { return c.g }

// Check implements fencecheck.Checker: it stores token as the resource's
// newest if it is >= the stored one (or none is stored), in one statement
// committed at once. It returns nil when accepted; a *fence.StaleError
// naming the stored token when that is newer (nothing changed); before any
// I/O, an error matching fence.ErrInvalidToken for token 0, one matching
// fencecheck.ErrTokenRange for a token above 2^63-1 (MaxCheckerToken: a
// bigint holds no more), and one matching fencecheck.ErrInvalidResource and
// fence.ErrInvalidArgument for an empty name, one longer than MaxResourceLen bytes, not
// UTF-8 or containing NUL; fence.ErrNotMigrated when the toolkit's function is
// missing; an error matching fence.ErrOutcomeUnknown when the statement was
// sent and its answer was lost (ctx ended, the connection broke): the token
// may have been stored; other database errors wrapped. ctx bounds the
// statement.
func (c *Checker) Check(ctx context.Context, resource string, token fence.Token) error {
	op := "check " + strconv.Quote(resource)
	tok, err := c.args(resource, token)
	if err != nil {
		return fmt.Errorf("sqlguard: %s: %w", op, err)
	}
	_, err = c.db.Exec(ctx, c.g.advance, []byte(resource), tok)
	if err == nil {
		return nil
	}
	if mapped := c.g.advanceErr(op, resource, token, err); errors.Is(mapped, fence.ErrStaleToken) || errors.Is(mapped, fence.ErrSetup) {
		return mapped
	}
	return sentErr(op, err, connOf(c.db))
}

func (c *Checker) args(resource string, token fence.Token) (int64, error) {
	var tok int64
	err := token.Validate()
	if err == nil {
		if tok, err = tokenArg(token); err != nil {
			// A valid token that a bigint cannot hold: out of the
			// checker's range, not malformed.
			err = fmt.Errorf("%w: token %d is above the PostgreSQL bigint range (max %d)", fencecheck.ErrTokenRange, uint64(token), int64(math.MaxInt64))
		}
	}
	if rerr := rowguard.CheckResource(resource, MaxResourceLen); rerr != nil {
		err = errors.Join(err, fmt.Errorf("%w: %w", fencecheck.ErrInvalidResource, rerr))
	}
	return tok, err
}

// Current returns the newest token stored for resource, or fence.None when
// none is. It returns fence.ErrNotMigrated when the toolkit's table is missing,
// an error matching fencecheck.ErrInvalidResource before any I/O for a
// bad name, other database errors wrapped. ctx bounds the query.
func (c *Checker) Current(ctx context.Context, resource string) (fence.Token, error) {
	op := "current token of " + strconv.Quote(resource)
	if err := rowguard.CheckResource(resource, MaxResourceLen); err != nil {
		return fence.None, fmt.Errorf("sqlguard: %s: %w: %w", op, fencecheck.ErrInvalidResource, err)
	}
	var tok int64
	err := c.db.QueryRow(ctx, c.current, []byte(resource)).Scan(&tok)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return fence.None, nil
	case err != nil:
		return fence.None, c.g.advanceErr(op, resource, 0, err)
	}
	return fence.Token(tok), nil
}
