package main

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/fencekit/fencekit/fence"
	"github.com/fencekit/fencekit/sqlguard"
)

// batch is one period's invoice run: the fenced writes a holder makes.
type batch struct {
	period    string
	resource  string
	customers []customer
	guard     *sqlguard.Guard
	invoices  *sqlguard.Table
	jobs      *sqlguard.Table
	jobIdent  string
}

func newBatch(schema, period string, customers []customer) (*batch, error) {
	b := &batch{period: period, resource: resourceFor(period), customers: customers,
		jobIdent: pgx.Identifier{schema, jobTable}.Sanitize()}
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

// stepResult says what one step did.
type stepResult struct {
	outcome  string   // evInvoice, evCompleted or evNothing
	next     int      // the batch position read from the progress row
	customer customer // the invoice's customer (evInvoice)
}

// step is one fenced transaction of the batch. The guard first advances the
// period's resource to tok: a newer holder's token makes it fail with a
// *fence.StaleError before anything runs, and a holder that got there
// earlier makes it wait until that one commits or rolls back. Then it reads
// where the batch stands from the progress row, and either renders the next
// invoice (render is the time that takes), inserts it (a fenced row insert:
// unique key (customer, period), lock_version = tok) and moves the progress
// row on, or marks the batch complete. A killed holder's open transaction
// is rolled back by PostgreSQL, so the next holder resumes exactly at the
// first invoice that was not committed. seen, if not nil, is called with
// the progress row as read.
func (b *batch) step(ctx context.Context, pool *pgxpool.Pool, tok fence.Token, replica string, render time.Duration, seen func(next int, done bool)) (stepResult, error) {
	var st stepResult
	err := b.guard.BeginFunc(ctx, pool, b.resource, tok, func(tx pgx.Tx) error {
		st = stepResult{}
		var done bool
		if err := tx.QueryRow(ctx, `SELECT next_index, completed_at IS NOT NULL FROM `+b.jobIdent+` WHERE period = $1`, b.period).
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
			return b.jobs.Update(ctx, tx, tok, []any{b.period}, sqlguard.Col("completed_at", time.Now()))
		}
		st.outcome, st.customer = evInvoice, b.customers[st.next]
		select { // rendering the invoice
		case <-time.After(render):
		case <-ctx.Done():
			return context.Cause(ctx)
		}
		if err := b.invoices.Insert(ctx, tx, tok, []any{st.customer.ID, b.period},
			sqlguard.Col("number", st.next+1),
			sqlguard.Col("amount_cents", st.customer.AmountCents),
			sqlguard.Col("written_by", replica)); err != nil {
			return fmt.Errorf("invoice #%d for %s: %w", st.next+1, st.customer.ID, err)
		}
		return b.jobs.Update(ctx, tx, tok, []any{b.period}, sqlguard.Col("next_index", st.next+1))
	})
	return st, err
}
