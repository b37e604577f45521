package main

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/fencekit/fencekit/fence"
	"github.com/fencekit/fencekit/sqlguard"
)

// pgRows is the batch's rows in PostgreSQL (--row-store postgres): the
// invoices and job_runs tables of the run's schema, written through
// sqlguard.
type pgRows struct {
	pool      *pgxpool.Pool
	schema    string
	period    string
	resource  string
	customers []customer
	guard     *sqlguard.Guard
	invoices  *sqlguard.Table
	jobs      *sqlguard.Table
}

func newPGRows(pool *pgxpool.Pool, schema, period string, customers []customer) (*pgRows, error) {
	b := &pgRows{pool: pool, schema: schema, period: period, resource: resourceFor(period), customers: customers}
	var err error
	if b.guard, err = sqlguard.New(sqlguard.WithSchema(schema)); err != nil {
		return nil, err
	}
	if b.invoices, err = sqlguard.NewTable(schema, invoicesTable, "customer", "period"); err != nil {
		return nil, err
	}
	if b.jobs, err = sqlguard.NewTable(schema, jobTable, "period"); err != nil {
		return nil, err
	}
	return b, nil
}

func (b *pgRows) where() string { return "PostgreSQL" }

func (b *pgRows) ident(table string) string { return pgx.Identifier{b.schema, table}.Sanitize() }

// step: the guard first advances the period's resource to tok: a newer
// holder's token makes it fail with a *fence.StaleError before anything
// runs, and a holder that got there earlier makes it wait until that one
// commits or rolls back. Then it reads the progress row and goes on as
// rows.step says, inside the one transaction. A killed holder's open
// transaction is rolled back by PostgreSQL, so the next holder resumes
// exactly at the first invoice that was not committed.
func (b *pgRows) step(ctx context.Context, tok fence.Token, replica string, render time.Duration, seen func(next int, done bool)) (stepResult, error) {
	var st stepResult
	err := b.guard.BeginFunc(ctx, b.pool, b.resource, tok, func(tx pgx.Tx) error {
		st = stepResult{}
		var done bool
		if err := tx.QueryRow(ctx, `SELECT next_index, completed_at IS NOT NULL FROM `+b.ident(jobTable)+` WHERE period = $1`, b.period).
			Scan(&st.next, &done); err != nil {
			return fmt.Errorf("reading the progress row: %w", err)
		}
		if seen != nil {
			seen(st.next, done)
		}
		switch {
		case done:
			st.outcome = evNothing
			return nil
		case st.next >= len(b.customers):
			st.outcome = evCompleted
			return b.jobs.Update(ctx, tx, []any{b.period}, tok, sqlguard.Col("completed_at", time.Now()))
		}
		st.outcome, st.customer = evInvoice, b.customers[st.next]
		if err := rendering(ctx, render); err != nil {
			return err
		}
		return b.writeInvoice(ctx, tx, tok, replica, st.next)
	})
	return st, err
}

func (b *pgRows) replay(ctx context.Context, tok fence.Token, replica string, at int) error {
	return b.guard.BeginFunc(ctx, b.pool, b.resource, tok, func(tx pgx.Tx) error {
		return b.writeInvoice(ctx, tx, tok, replica, at)
	})
}

// writeInvoice inserts invoice #at+1 (a fenced row insert: unique key
// (customer, period), lock_version = tok) and moves the progress row on to
// at+1, in tx.
func (b *pgRows) writeInvoice(ctx context.Context, tx pgx.Tx, tok fence.Token, replica string, at int) error {
	c := b.customers[at]
	if err := b.invoices.Insert(ctx, tx, []any{c.ID, b.period}, tok,
		sqlguard.Col("number", at+1),
		sqlguard.Col("amount_cents", c.AmountCents),
		sqlguard.Col("written_by", replica)); err != nil {
		return fmt.Errorf("invoice #%d for %s: %w", at+1, c.ID, err)
	}
	return b.jobs.Update(ctx, tx, []any{b.period}, tok, sqlguard.Col("next_index", at+1))
}

func (b *pgRows) read(ctx context.Context) (stored, error) {
	var s stored
	rs, err := b.pool.Query(ctx, `SELECT customer, number, written_by, lock_version FROM `+b.ident(invoicesTable)+
		` WHERE period = $1 ORDER BY customer`, b.period)
	if err != nil {
		return s, err
	}
	if s.invoices, err = pgx.CollectRows(rs, func(row pgx.CollectableRow) (invoice, error) {
		var i invoice
		var lv int64
		err := row.Scan(&i.Customer, &i.Number, &i.WrittenBy, &lv)
		i.LockVersion = fence.Token(lv)
		return i, err
	}); err != nil {
		return s, err
	}
	var jobTok *int64
	if err := b.pool.QueryRow(ctx, `SELECT next_index, completed_at IS NOT NULL, lock_version FROM `+b.ident(jobTable)+` WHERE period = $1`, b.period).
		Scan(&s.next, &s.completed, &jobTok); err != nil {
		return s, fmt.Errorf("the progress row: %w", err)
	}
	if jobTok != nil {
		s.progressTok = fence.Token(*jobTok)
	}
	var resTok int64
	err = b.pool.QueryRow(ctx, `SELECT token FROM `+b.ident(sqlguard.ResourceTable)+` WHERE resource = $1`, b.resource).Scan(&resTok)
	if err != nil && !errors.Is(err, pgx.ErrNoRows) {
		return s, err
	}
	s.resource = fence.Token(resTok)
	return s, nil
}

// rendering waits render, the time rendering an invoice takes, or until
// ctx ends.
func rendering(ctx context.Context, render time.Duration) error {
	t := time.NewTimer(render)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return context.Cause(ctx)
	}
}
