package main

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/fencekit/fencekit/examples/internal/demo"
	"github.com/fencekit/fencekit/fence"
)

// --row-store: where the batch's fenced rows (the invoices and the progress
// row) live. The customers, the batch's input, stay in the run's PostgreSQL
// schema either way, and the leases wherever --lease-store puts them.
const (
	rowPostgres = "postgres" // tables in the run's schema, fenced by sqlguard
	rowDynamoDB = "dynamodb" // items in a DynamoDB table of the run's own, fenced by dynamoguard
)

const rowStoreUsage = "where the invoices and the progress row live: postgres (tables in the run's schema, fenced\n" +
	"transactions through sqlguard) or dynamodb (items in a table of the run's own at $" + demo.DynamoEndpointVar + ",\n" +
	"one TransactWriteItems per invoice through dynamoguard)"

func checkRowStore(s string) error {
	switch s {
	case rowPostgres, rowDynamoDB:
		return nil
	}
	return fmt.Errorf("--row-store %q: want %s or %s", s, rowPostgres, rowDynamoDB)
}

// rows is the batch's fenced rows in one store: the holders write them one
// fenced transaction per step, the verifier reads them back and replays
// stale holders' writes. pgRows (batch.go) and dynamoRows (dynamodb.go)
// implement it.
type rows interface {
	// step is one fenced transaction of the batch: it reads where the
	// batch stands from the progress row (seen, if not nil, is called with
	// it), then writes the next invoice and moves the progress row on
	// (render is the time rendering the invoice takes, before the write),
	// or marks the batch complete, or only checks the fence when the batch
	// is already complete. A holder with an older token than the
	// resource's gets a *fence.StaleError and writes nothing.
	step(ctx context.Context, tok fence.Token, replica string, render time.Duration, seen func(next int, done bool)) (stepResult, error)
	// replay makes the write a holder at batch position at makes (invoice
	// #at+1 and the progress row moved to at+1), in one fenced
	// transaction with tok, without reading the progress row first.
	replay(ctx context.Context, tok fence.Token, replica string, at int) error
	// read returns what is stored: the period's invoices in customer
	// order, the progress row and the resource's token.
	read(ctx context.Context) (stored, error)
	// where names the store in the output.
	where() string
}

// stepResult says what one step did.
type stepResult struct {
	outcome  string   // evInvoice, evCompleted or evNothing
	next     int      // the batch position read from the progress row
	customer customer // the invoice's customer (evInvoice)
}

// invoice is one stored invoice.
type invoice struct {
	Customer    string
	Number      int
	WrittenBy   string
	LockVersion fence.Token
}

// stored is what the verifier reads back.
type stored struct {
	invoices []invoice // in customer order
	// The progress row: the next batch position, whether the batch is
	// marked complete, and the token it was last written with.
	next        int
	completed   bool
	progressTok fence.Token
	// resource is the token the period's resource holds (fence.None if
	// nobody wrote).
	resource fence.Token
}

// openRows returns the run's rows (--row-store) for a process that has
// pool (the run's PostgreSQL) and the batch's customers, and the function
// that closes them.
func (c workerConfig) openRows(pool *pgxpool.Pool, customers []customer) (rows, func(), error) {
	if c.RowStore == rowDynamoDB {
		return newDynamoRows(c.DynamoEndpoint, c.DynamoTable, c.Period, customers)
	}
	r, err := newPGRows(pool, c.Schema, c.Period, customers)
	return r, func() {}, err
}
