// Command invoicejob runs the job fencekit was written for, with real
// processes and real stores: several replicas of a scheduled "generate
// invoices" job compete for one lease, the holder works through the batch
// with fenced writes, and the holder is killed with SIGKILL in the middle of
// the batch, as kill -9, an OOM kill or a deploy would end it.
//
//  1. the replicas start together and each runs the batch with
//     lease.Manager.Run on one lease (Redis): Run waits for the lease, runs
//     the batch with the lease's context and token, and releases it; one
//     gets it with fencing token N, the others wait;
//  2. the holder writes one invoice per customer, each in a transaction
//     fenced with its token on the resource "invoices/<period>" (sqlguard):
//     the invoice row (unique key (customer, period), lock_version = token)
//     and the job's progress row; with --row-store dynamodb, the invoice
//     and progress items of a DynamoDB table, in one TransactWriteItems
//     with the resource's fence item (dynamoguard);
//  3. after a set number of invoices the orchestrator kills the holder with
//     SIGKILL: its lease is not released, its open transaction is rolled
//     back by PostgreSQL (a DynamoDB transaction is one request: sent
//     whole or not at all);
//  4. a waiting replica acquires the lease as soon as the dead holder's
//     grant expires in Redis (waiters retry at the grant's exact expiry;
//     pub/sub wakes them at once on a release), with a greater token (tokens
//     are large numbers minted from the Redis server clock), reads the
//     progress row and resumes at the first invoice not committed;
//  5. it completes the batch and releases; the other replicas find the
//     batch done.
//
// It then checks the row store: exactly one invoice per customer for the
// period, none lost, every invoice's lock_version one of the holders'
// tokens and in token order, the progress row complete; and it replays the
// killed holder's next write with its old token, which the store must
// reject as stale. It prints a timeline, a summary (who held the lease with
// which token, how many invoices each wrote, how long the handover took from
// the kill to the next acquire) and a verdict, and exits 0 only when every
// check passed.
//
// Services come from the environment (FENCE_REDIS_URL, FENCE_POSTGRES_URL,
// FENCE_DYNAMODB_ENDPOINT), else the default local addresses, else servers
// it starts itself, else Docker through testcontainers-go. Everything it
// creates (a schema, the lease's Redis keys, a DynamoDB table) is removed
// at the end, however the run ends: the
// replicas die with it, even by SIGKILL, and what a killed run leaves is
// removed by the next run (package examples/internal/leftover).
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/fencekit/fencekit/examples/internal/demo"
	"github.com/fencekit/fencekit/examples/internal/leftover"
	"github.com/fencekit/fencekit/examples/services"
)

func main() {
	if len(os.Args) > 1 && os.Args[1] == "replica" {
		os.Exit(runReplica())
	}
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

type options struct {
	replicas, customers, killAfter, kills int
	ttl, invoiceTime                      time.Duration
	period                                string
	keep                                  bool
	leaseStore, rowStore                  string
	redisURL, pgURL                       string
	jsonOut                               string
}

// renewInterval is the lease's renew interval: the Manager's default.
func (o options) renewInterval() time.Duration { return o.ttl / 3 }

// handoverBound is the longest a handover may take: the dead holder's grant
// has at most one TTL left at the kill (it renewed at most a renew interval
// ago, plus the renewal's own latency), the store ends it at most lag
// later (demo.LeaseStore.ExpiryLag: etcd and ZooKeeper expire grants on a
// timer of their own), and a waiter retries, or is woken, right then. One
// renew interval and loadAllowance are allowed on top, for a loaded
// machine.
func (o options) handoverBound(lag time.Duration) time.Duration {
	return o.ttl + o.renewInterval() + loadAllowance + lag
}

// loadAllowance is how late a waiting replica may run on a loaded machine
// (each replica is a process of its own; two cores running the tests under
// the race detector delay one by a few hundred milliseconds at worst).
const loadAllowance = 300 * time.Millisecond

// Bounds of the flags: a demo that runs for hours helps nobody.
const (
	minTTL, maxTTL = 100 * time.Millisecond, time.Minute
	maxReplicas    = 20
	maxCustomers   = 100000
	maxInvoiceTime = 10 * time.Second
	// maxBatchTime bounds --customers x --invoice-time, the batch's own
	// length.
	maxBatchTime = 30 * time.Minute
)

// parseFlags parses args. --help prints the usage on stdout and returns
// flag.ErrHelp; a bad flag's message and the usage go to stderr.
func parseFlags(args []string, stdout, stderr io.Writer) (options, error) {
	var o options
	fs := flag.NewFlagSet("invoicejob", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), `Usage: go run ./examples/invoicejob [flags]

Runs replicas of a scheduled invoice job as real processes competing for one
lease (Redis; or PostgreSQL, etcd, ZooKeeper or DynamoDB with --lease-store); the
holder writes invoices through fenced PostgreSQL transactions (or DynamoDB
transactions with --row-store dynamodb) and is killed with SIGKILL mid-batch;
another replica takes over within about one TTL and finishes the batch. Then
it checks that no invoice was written twice or lost and that the dead
holder's token can no longer write.
Exit status: 0 when every check passed; 1 when a check failed; 2 when the run
could not be carried out (a service is missing, a bad flag).

Flags:
`)
		fs.PrintDefaults()
	}
	fs.IntVar(&o.replicas, "replicas", 3, "number of replica processes competing for the lease (2 to 20)")
	fs.IntVar(&o.customers, "customers", 40, "number of customers, one invoice each: the batch size (1 to 100000)")
	fs.IntVar(&o.killAfter, "kill-after", 15, "kill a holder with SIGKILL after it has written this many invoices")
	fs.IntVar(&o.kills, "kills", 1, "how many holders to kill, one after the other (fewer than --replicas)")
	fs.DurationVar(&o.ttl, "ttl", 2*time.Second, "lease TTL (whole milliseconds, from 100ms to 1m); renewed every TTL/3")
	fs.DurationVar(&o.invoiceTime, "invoice-time", 100*time.Millisecond, "time to render one invoice, inside its fenced transaction (up to 10s;\n--customers x --invoice-time at most 30m)")
	fs.StringVar(&o.period, "period", "2026-11", "billing period the batch is for")
	fs.BoolVar(&o.keep, "keep", false, "keep the schema and the lease's keys after the run, for inspection; servers the demo\nstarted itself are stopped, and their data directories are kept (their paths are printed)")
	fs.StringVar(&o.leaseStore, "lease-store", demo.LeaseRedis, demo.LeaseStoreUsage)
	fs.StringVar(&o.rowStore, "row-store", rowPostgres, rowStoreUsage)
	fs.StringVar(&o.redisURL, "redis-url", "", "Redis URL (default: $FENCE_REDIS_URL, else redis://127.0.0.1:6379/0, else one it starts)")
	fs.StringVar(&o.pgURL, "postgres-url", "", "PostgreSQL URL (default: $FENCE_POSTGRES_URL, else postgres://postgres@127.0.0.1:5432/test, else one it starts)")
	fs.StringVar(&o.jsonOut, "json", "", "also write a machine-readable summary of the run to this file")
	if demo.WantsHelp(args) {
		fs.SetOutput(stdout)
		fs.Usage()
		return o, flag.ErrHelp
	}
	if err := fs.Parse(args); err != nil {
		return o, err
	}
	if fs.NArg() > 0 {
		return o, fmt.Errorf("unexpected arguments: %v", fs.Args())
	}
	var errs []error
	if o.ttl < minTTL || o.ttl > maxTTL || o.ttl%time.Millisecond != 0 {
		errs = append(errs, fmt.Errorf("--ttl %v: must be a whole number of milliseconds, from %v to %v", o.ttl, minTTL, maxTTL))
	}
	if o.replicas < 2 || o.replicas > maxReplicas {
		errs = append(errs, fmt.Errorf("--replicas %d: must be from 2 (for a takeover) to %d", o.replicas, maxReplicas))
	}
	if o.kills < 0 || o.kills >= o.replicas {
		errs = append(errs, fmt.Errorf("--kills %d: must be at least 0 and fewer than --replicas (%d), or nobody is left to finish", o.kills, o.replicas))
	}
	if o.killAfter < 1 {
		errs = append(errs, fmt.Errorf("--kill-after %d: must be at least 1", o.killAfter))
	}
	if o.customers < 1 || o.customers > maxCustomers {
		errs = append(errs, fmt.Errorf("--customers %d: must be between 1 and %d", o.customers, maxCustomers))
	} else if o.kills > 0 && o.kills*o.killAfter >= o.customers {
		errs = append(errs, fmt.Errorf("--kills %d x --kill-after %d must be less than --customers %d, so that every kill lands mid-batch", o.kills, o.killAfter, o.customers))
	}
	switch {
	case o.invoiceTime < 0 || o.invoiceTime > maxInvoiceTime:
		errs = append(errs, fmt.Errorf("--invoice-time %v: must be from 0 to %v", o.invoiceTime, maxInvoiceTime))
	case o.customers >= 1 && o.customers <= maxCustomers && time.Duration(o.customers)*o.invoiceTime > maxBatchTime:
		errs = append(errs, fmt.Errorf("--customers %d x --invoice-time %v is %v: must be at most %v", o.customers, o.invoiceTime,
			time.Duration(o.customers)*o.invoiceTime, maxBatchTime))
	}
	if err := demo.CheckLeaseStore(o.leaseStore); err != nil {
		errs = append(errs, err)
	} else if err := demo.CheckTTL(o.leaseStore, o.ttl); err != nil {
		errs = append(errs, err)
	}
	if err := checkRowStore(o.rowStore); err != nil {
		errs = append(errs, err)
	}
	if o.period == "" || len(o.period) > 32 {
		errs = append(errs, fmt.Errorf("--period %q: must be 1 to 32 bytes", o.period))
	}
	return o, errors.Join(errs...)
}

// run is the program: the timeline, summary and verdict go to stdout,
// errors to stderr. It returns the exit status.
func run(args []string, stdout, stderr io.Writer) int {
	o, err := parseFlags(args, stdout, stderr)
	if errors.Is(err, flag.ErrHelp) {
		return 0
	}
	if err != nil {
		fmt.Fprintf(stderr, "invoicejob: %v\n", err)
		return 2
	}
	ctx, out, errOut, stop := demo.Interrupts(context.Background(), stdout, stderr)
	defer stop()
	ledger, err := leftover.Begin(ctx, "invoicejob", func(f string, a ...any) { fmt.Fprintf(errOut, "invoicejob: "+f+"\n", a...) })
	if err != nil {
		fmt.Fprintf(errOut, "invoicejob: the run's ledger: %v\n", err)
		return 2
	}
	defer ledger.End() // last: after everything below is removed

	tl := demo.NewTimeline(out)
	fmt.Fprintf(out, "invoicejob: %d replicas, %d invoices for period %s, lease TTL %v (renewed every %v); kill %d holder(s) with SIGKILL after %d invoices each\n\n",
		o.replicas, o.customers, o.period, o.ttl, o.renewInterval().Round(time.Millisecond), o.kills, o.killAfter)

	svc, err := demo.ProvideServices(ctx, demo.ServicesConfig(o.leaseStore, services.Config{
		RedisURL: o.redisURL, PostgresURL: o.pgURL, NoS3: true, Keep: o.keep,
	}), out)
	if err != nil {
		fmt.Fprintf(errOut, "invoicejob: cannot run without its services:\n  %s\n", strings.ReplaceAll(err.Error(), "\n", "\n  "))
		return 2
	}
	defer svc.Close()

	sc, err := setUp(ctx, svc, o)
	if err != nil {
		fmt.Fprintf(errOut, "invoicejob: setting up: %v\n", err)
		return 2
	}
	if o.keep {
		defer sc.keep(out, svc)
	} else {
		defer sc.tearDown(errOut)
	}
	fmt.Fprintf(out, "Schema %s: %d customers, no invoices yet; lease %q; writes fenced on resource %q.\n",
		sc.cfg.Schema, o.customers, sc.cfg.LeaseName, resourceFor(o.period))
	if sc.dynamo != nil {
		fmt.Fprintf(out, "Invoices and progress item in DynamoDB table %s at %s.\n", sc.dynamo.Name, sc.dynamo.Endpoint)
	}
	fmt.Fprintf(out, "\nTimeline:\n")

	sum, err := sc.play(ctx, tl, o)
	if err != nil {
		if cause := context.Cause(ctx); cause != nil && ctx.Err() != nil {
			err = fmt.Errorf("%w (%v)", err, cause)
		}
		fmt.Fprintf(errOut, "\ninvoicejob: the run could not be completed: %v\n", err)
		return 2
	}
	if err := sc.verify(ctx, tl, o, sum); err != nil {
		fmt.Fprintf(errOut, "\ninvoicejob: checking the outcome: %v\n", err)
		return 2
	}
	sum.Services = svc.Used
	sum.Elapsed = tl.Elapsed()
	sum.print(out, tl, o)
	if o.jsonOut != "" {
		b, _ := json.MarshalIndent(sum, "", "  ")
		if err := os.WriteFile(o.jsonOut, b, 0o644); err != nil {
			fmt.Fprintf(errOut, "invoicejob: writing %s: %v\n", o.jsonOut, err)
			return 2
		}
	}
	if !sum.OK {
		return 1
	}
	return 0
}

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

func setUp(ctx context.Context, svc *services.Set, o options) (*scenario, error) {
	id := demo.RandomID()
	sc := &scenario{cfg: workerConfig{
		RedisURL: svc.RedisURL, PostgresURL: svc.PostgresURL,
		Schema: "invoicejob_" + id, Period: o.period,
		LeaseName: "invoicejob-" + id + "/generate-invoices", LeaseStore: o.leaseStore, RedisPrefix: "fencekit:",
		Consensus: demo.StoreFor(o.leaseStore, svc),
		TTL:       o.ttl, InvoiceTime: o.invoiceTime,
		RowStore: o.rowStore,
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
	sc.Stores, err = demo.SetUpStores(ctx, demo.StoresConfig{
		PostgresURL: svc.PostgresURL, Schema: sc.cfg.Schema,
		CreateTables: sc.createTables,
		FencedTables: fenced,
		LeaseStore:   sc.cfg.LeaseStore,
		RedisURL:     svc.RedisURL, RedisPrefix: sc.cfg.RedisPrefix, LeaseName: sc.cfg.LeaseName,
		Leases: sc.cfg.leaseStore(), TTL: sc.cfg.TTL,
		PostgresStarted: svc.PostgresStarted, RedisStarted: svc.RedisStarted,
	})
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
func (sc *scenario) keep(out io.Writer, svc *services.Set) {
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
	for _, d := range svc.Dirs {
		fmt.Fprintf(out, "  the data of a server this demo started (it stops now): %s; remove it when done\n", d)
	}
}

// proc is a running replica process.
type proc struct {
	name   string
	cmd    *exec.Cmd
	killed bool
	exited bool
}

// exit is a replica's end, as seen by the orchestrator.
type exit struct {
	name string
	err  error
}

// startReplica starts a replica process. Its events go to events, and then
// its exit to exits: the orchestrator follows all the replicas on these
// two channels.
func (sc *scenario) startReplica(name string, acquireTimeout time.Duration, events chan<- event, exits chan<- exit) (*proc, error) {
	cfg := sc.cfg
	cfg.Replica, cfg.AcquireTimeout = name, acquireTimeout
	c, err := demo.StartChild[event]("replica", configVar, cfg)
	if err != nil {
		return nil, err
	}
	go func() {
		for e := range c.Events {
			events <- e
		}
		exits <- exit{name: name, err: <-c.Done}
	}()
	return &proc{name: name, cmd: c.Cmd}, nil
}
