package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/fencekit/fencekit/examples/internal/demo"
	"github.com/fencekit/fencekit/internal/rig/services"
)

// scenario holds what one run created: the schema and the lease's keys
// (Stores), the DynamoDB table with --row-store dynamodb, and the customers
// of the batch; rows reads and replays the batch's rows.
type scenario struct {
	cfg       workerConfig
	customers []customer
	*demo.Stores
	dynamo    *demo.RunTable
	rows      rows
	closeRows func()
}

// setUp creates what the run works in: the schema with the customers (and
// the invoices and progress tables with --row-store postgres), the lease's
// keys, and the DynamoDB table with --row-store dynamodb.
func setUp(ctx context.Context, svc *services.Set, o options) (*scenario, error) {
	id := demo.RandomID()
	sc := &scenario{cfg: workerConfig{
		ChildLease: demo.NewChildLease(svc, o.LeaseStore, "invoicejob_"+id, "invoicejob-"+id+"/generate-invoices", o.TTL),
		Period:     o.period, InvoiceTime: o.invoiceTime, RowStore: o.rowStore,
	}}
	for i := range o.customers {
		c := customer{ID: fmt.Sprintf("cust-%05d", i+1), AmountCents: 1000 + int64(i*7919%50000)}
		sc.customers = append(sc.customers, c)
	}
	fenced := []string{invoicesTable, jobTable}
	if o.rowStore == rowDynamoDB {
		fenced = nil
	}
	var err error
	stores := sc.cfg.StoresConfig(svc)
	stores.CreateTables, stores.FencedTables = sc.createTables, fenced
	sc.Stores, err = demo.SetUpStores(ctx, stores)
	if err != nil {
		return nil, err
	}
	if o.rowStore == rowDynamoDB {
		if err := sc.setUpDynamo(ctx, id); err != nil {
			return nil, errors.Join(err, sc.Stores.TearDown())
		}
	}
	if sc.rows, sc.closeRows, err = sc.cfg.openRows(sc.Pool, sc.customers); err != nil {
		return nil, errors.Join(err, sc.tearDownAll())
	}
	return sc, nil
}

// setUpDynamo creates the run's DynamoDB table (--row-store dynamodb) at
// $FENCE_DYNAMODB_ENDPOINT, with the period's progress item.
func (sc *scenario) setUpDynamo(ctx context.Context, id string) error {
	ep, err := demo.DynamoEndpoint("--row-store dynamodb")
	if err != nil {
		return err
	}
	if sc.dynamo, err = demo.CreateRunTable(ctx, ep, "invoicejob-"+id, true); err != nil {
		return err
	}
	sc.cfg.DynamoEndpoint, sc.cfg.DynamoTable = ep, sc.dynamo.Name
	d, closeRows, err := newDynamoRows(ep, sc.dynamo.Name, sc.cfg.Period, sc.customers)
	if err != nil {
		return errors.Join(err, sc.dynamo.Delete(ctx))
	}
	defer closeRows()
	if err := d.createProgress(ctx); err != nil {
		return errors.Join(fmt.Errorf("DynamoDB: the progress item: %w", err), sc.dynamo.Delete(ctx))
	}
	return nil
}

// createTables creates the customers table and fills it in; with
// --row-store postgres, it also creates the invoices and progress tables
// and the period's progress row.
func (sc *scenario) createTables(ctx context.Context, pool *pgxpool.Pool) error {
	ident := func(table string) string { return pgx.Identifier{sc.cfg.Schema, table}.Sanitize() }
	if _, err := pool.Exec(ctx, `CREATE TABLE `+ident(customersTable)+` (id text PRIMARY KEY, amount_cents bigint NOT NULL)`); err != nil {
		return fmt.Errorf("create tables: %w", err)
	}
	input := make([][]any, len(sc.customers))
	for i, c := range sc.customers {
		input[i] = []any{c.ID, c.AmountCents}
	}
	if _, err := pool.CopyFrom(ctx, pgx.Identifier{sc.cfg.Schema, customersTable}, []string{"id", "amount_cents"}, pgx.CopyFromRows(input)); err != nil {
		return fmt.Errorf("insert customers: %w", err)
	}
	if sc.cfg.RowStore == rowDynamoDB {
		return nil
	}
	for _, stmt := range []string{
		// One invoice per customer and period; number is its place in
		// the batch, unique too, so a gap or a repeat would show.
		`CREATE TABLE ` + ident(invoicesTable) + ` (
			customer     text NOT NULL REFERENCES ` + ident(customersTable) + `,
			period       text NOT NULL,
			number       int NOT NULL,
			amount_cents bigint NOT NULL,
			written_by   text NOT NULL,
			written_at   timestamptz NOT NULL DEFAULT clock_timestamp(),
			PRIMARY KEY (customer, period),
			UNIQUE (period, number))`,
		// The job's progress: how many invoices of the period are done.
		`CREATE TABLE ` + ident(jobTable) + ` (
			period       text PRIMARY KEY,
			next_index   int NOT NULL DEFAULT 0,
			completed_at timestamptz)`,
	} {
		if _, err := pool.Exec(ctx, stmt); err != nil {
			return fmt.Errorf("create tables: %w", err)
		}
	}
	if _, err := pool.Exec(ctx, `INSERT INTO `+ident(jobTable)+` (period) VALUES ($1)`, sc.cfg.Period); err != nil {
		return fmt.Errorf("insert the progress row: %w", err)
	}
	return nil
}

// tearDown removes what setUp created.
func (sc *scenario) tearDown(errOut io.Writer) {
	if err := sc.tearDownAll(); err != nil {
		fmt.Fprintf(errOut, "invoicejob: cleaning up: %v\n", err)
	}
}

// tearDownAll removes the DynamoDB table, if there is one, the schema and
// the lease's keys.
func (sc *scenario) tearDownAll() error {
	if sc.closeRows != nil {
		sc.closeRows()
	}
	var err error
	if sc.dynamo != nil {
		ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
		defer cancel()
		err = sc.dynamo.Delete(ctx)
	}
	return errors.Join(err, sc.Stores.TearDown())
}

// keep leaves what the run created in place (--keep) and says where it is.
func (sc *scenario) keep(s *demo.Session) {
	out := s.Out
	sc.Stores.Keep()
	if sc.closeRows != nil {
		sc.closeRows()
	}
	fmt.Fprintf(out, "\nKept (--keep):\n  schema %s in %s\n", sc.cfg.Schema, services.Redact(sc.cfg.PostgresURL))
	if sc.dynamo != nil {
		sc.dynamo.Keep()
		fmt.Fprintf(out, "  DynamoDB table %s at %s\n", sc.dynamo.Name, sc.dynamo.Endpoint)
	}
	if sc.Redis != nil {
		fmt.Fprintf(out, "  lease keys %s and %s in %s\n", sc.Keys.Lease, sc.Keys.Token, sc.cfg.RedisURL)
	}
	s.PrintKeptServers()
}

// startReplica starts the replica process name in the group replicas: it
// gives up on the lease after acquireTimeout.
func (sc *scenario) startReplica(replicas *demo.Group[event], name string, acquireTimeout time.Duration) (*demo.Proc, error) {
	cfg := sc.cfg
	cfg.Replica, cfg.AcquireTimeout = name, acquireTimeout
	return replicas.Start(name, cfg)
}
