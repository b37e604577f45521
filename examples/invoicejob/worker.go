package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/fencekit/fencekit/examples/internal/demo"
	"github.com/fencekit/fencekit/fence"
	"github.com/fencekit/fencekit/lease"
)

// workerConfig is what the orchestrator hands a replica process (as JSON in
// the environment variable configVar, see demo.StartChild).
type workerConfig struct {
	demo.ChildLease        // the lease, where it lives, its TTL
	Replica         string `json:"replica"`
	Period          string `json:"period"`
	// InvoiceTime is how long rendering one invoice takes, inside its
	// fenced transaction (the window in which a kill usually lands).
	InvoiceTime time.Duration `json:"invoice_time"`
	// RowStore is where the invoices and the progress row live
	// (rowPostgres or rowDynamoDB); with rowDynamoDB, in DynamoTable at
	// DynamoEndpoint.
	RowStore       string `json:"row_store"`
	DynamoEndpoint string `json:"dynamodb_endpoint,omitempty"`
	DynamoTable    string `json:"dynamodb_table,omitempty"`
}

const configVar = "FENCEKIT_INVOICEJOB_REPLICA"

const (
	customersTable = "customers"
	invoicesTable  = "invoices"
	jobTable       = "job_runs"
)

// resourceFor is the resource that fences one period's batch: every write
// of the batch (invoice rows and the progress row) happens in a transaction
// that advances this resource's token (sqlguard's resource row, or
// dynamoguard's fence item).
func resourceFor(period string) string { return "invoices/" + period }

// event is one line a replica prints on its standard output.
type event struct {
	At      time.Time   `json:"at"`
	Replica string      `json:"replica"`
	Pid     int         `json:"pid"`
	Kind    string      `json:"kind"`
	Token   fence.Token `json:"token,omitempty"`
	// Customer and Number are set on invoice events.
	Customer string `json:"customer,omitempty"`
	Number   int    `json:"number,omitempty"`
	// Next is the batch position the holder resumes at (acquired events).
	Next int    `json:"next,omitempty"`
	Text string `json:"text"`
}

const (
	evWaiting   = "waiting"   // started, blocked in Acquire
	evAcquired  = "acquired"  // holds the lease
	evResume    = "resume"    // read the progress row: where the batch stands
	evInvoice   = "invoice"   // one invoice committed
	evCompleted = "completed" // the batch is done (this holder marked it)
	evNothing   = "nothing"   // acquired, found the batch already done
	evReleased  = "released"
	evStopped   = "stopped" // stopped work: lease lost or a write refused
	evFailed    = "failed"
)

type replica struct {
	cfg workerConfig
	out *demo.Reporter
}

func (r *replica) emit(e event) {
	e.At, e.Replica, e.Pid = time.Now(), r.cfg.Replica, os.Getpid()
	r.out.Report(e)
}

func (r *replica) fail(format string, args ...any) int {
	r.emit(event{Kind: evFailed, Text: fmt.Sprintf(format, args...)})
	return 1
}

// runReplica is the body of one replica of the scheduled job: wait for the
// lease, then generate the period's invoices, one fenced transaction each,
// starting where the progress row says the batch stands.
func runReplica() int {
	r := &replica{out: demo.NewReporter(os.Stdout)}
	if err := demo.ReadChildConfig(configVar, &r.cfg); err != nil {
		fmt.Fprintf(os.Stderr, "invoicejob replica: %v\n", err)
		return 2
	}
	cfg := r.cfg
	ctx := context.Background()

	m, closeLeases, err := demo.NewLeaseManager(cfg.Leases(), cfg.TTL, lease.WithIdentity(cfg.Replica))
	if err != nil {
		return r.fail("%v", err)
	}
	defer closeLeases()
	pcfg, err := pgxpool.ParseConfig(cfg.PostgresURL)
	if err != nil {
		return r.fail("postgres URL: %v", err)
	}
	pcfg.MaxConns = 2
	pool, err := pgxpool.NewWithConfig(ctx, pcfg)
	if err != nil {
		return r.fail("postgres: %v", err)
	}
	defer pool.Close()
	customers, err := loadCustomers(ctx, pool, cfg.Schema)
	if err != nil {
		return r.fail("reading customers: %v", err)
	}
	rs, closeRows, err := cfg.openRows(pool, customers)
	if err != nil {
		return r.fail("%v", err)
	}
	defer closeRows()

	r.emit(event{Kind: evWaiting, Text: fmt.Sprintf("started; waiting for lease %q", cfg.LeaseName)})
	// Manager.Run is the job's whole life under the lease: it waits for
	// the lease (up to AcquireTimeout: a dead Redis is retried, and
	// logged, until then), runs the batch with the lease's context and
	// token, and releases the lease. Its error joins the batch's with the
	// loss of the lease, if the lease was lost while the batch ran.
	actx, cancel := context.WithTimeout(ctx, cfg.AcquireTimeout)
	defer cancel()
	start := time.Now()
	var (
		tok  fence.Token
		code = 1
	)
	err = m.Run(actx, cfg.LeaseName, func(ctx context.Context, l *lease.Lease) error {
		tok = l.Token()
		r.emit(event{Kind: evAcquired, Token: tok, Text: fmt.Sprintf("acquired the lease with fencing token %d after waiting %v",
			tok, time.Since(start).Round(time.Millisecond))})
		code = r.generate(ctx, l, rs, len(customers))
		return nil
	})
	switch {
	case tok == 0: // never acquired
		return r.fail("could not acquire lease %s: %v", cfg.LeaseName, err)
	case err == nil:
		r.emit(event{Kind: evReleased, Token: tok, Text: "released the lease (waiters are woken by " + cfg.Leases().WakeUps() + ")"})
	case errors.Is(err, lease.ErrLost):
		r.emit(event{Kind: evReleased, Token: tok, Text: "the lease had been lost: " + err.Error()})
	default:
		r.emit(event{Kind: evReleased, Token: tok, Text: "release failed (the lease expires after its TTL): " + err.Error()})
	}
	return code
}

type customer struct {
	ID          string
	AmountCents int64
}

func loadCustomers(ctx context.Context, pool *pgxpool.Pool, schema string) ([]customer, error) {
	rows, err := pool.Query(ctx, `SELECT id, amount_cents FROM `+pgx.Identifier{schema, customersTable}.Sanitize()+` ORDER BY id`)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, func(row pgx.CollectableRow) (customer, error) {
		var c customer
		err := row.Scan(&c.ID, &c.AmountCents)
		return c, err
	})
}

// generate writes the remaining invoices under the lease, one fenced
// transaction each (rows.step), until the batch is complete. All the work
// runs under ctx, which Manager.Run ends when the lease is lost: the
// transaction in flight is then cancelled (PostgreSQL rolls it back; a
// DynamoDB transaction not yet sent is never sent), and nothing more is
// written.
func (r *replica) generate(ctx context.Context, l *lease.Lease, rs rows, total int) int {
	cfg := r.cfg
	tok := l.Token()
	first := true
	for {
		st, err := rs.step(ctx, tok, cfg.Replica, cfg.InvoiceTime, func(next int, done bool) {
			if !first {
				return
			}
			first = false
			text := fmt.Sprintf("progress row: %d of %d invoices done; resuming at #%d", next, total, next+1)
			switch {
			case done:
				text = fmt.Sprintf("progress row: the batch is complete (%d of %d invoices)", next, total)
			case next == 0:
				text = fmt.Sprintf("progress row: nothing done yet; starting the batch of %d invoices", total)
			}
			r.emit(event{Kind: evResume, Token: tok, Next: next, Text: text})
		})
		switch {
		case err == nil && st.outcome == evInvoice:
			r.emit(event{Kind: evInvoice, Token: tok, Customer: st.customer.ID, Number: st.next + 1,
				Text: fmt.Sprintf("invoice #%d for %s written with token %d", st.next+1, st.customer.ID, tok)})
		case err == nil && st.outcome == evCompleted:
			r.emit(event{Kind: evCompleted, Token: tok, Text: fmt.Sprintf("batch complete: all %d invoices written; marked the progress row done", st.next)})
			return 0
		case err == nil:
			r.emit(event{Kind: evNothing, Token: tok, Text: "the batch is already complete: nothing to do"})
			return 0
		case errors.Is(err, fence.ErrStaleToken):
			r.emit(event{Kind: evStopped, Token: tok, Text: "write REJECTED, a newer holder has taken over: " + err.Error()})
			return 1
		case l.Err() != nil:
			r.emit(event{Kind: evStopped, Token: tok, Text: fmt.Sprintf("stopped: the lease ended (%v); the transaction in flight was not committed", l.Err())})
			return 1
		default:
			return r.fail("invoice transaction: %v", err)
		}
	}
}
