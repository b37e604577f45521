package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"time"

	"github.com/fencekit/fencekit/examples/internal/demo"
)

// options are the program's flags.
type options struct {
	demo.Flags                            // --ttl, --lease-store, --keep, --redis-url, --postgres-url, --json
	replicas, customers, killAfter, kills int
	invoiceTime                           time.Duration
	period                                string
	rowStore                              string
}

// renewInterval is the lease's renew interval: the Manager's default.
func (o options) renewInterval() time.Duration { return o.TTL / 3 }

// handoverBound is the longest a handover may take: the dead holder's grant
// has at most one TTL left at the kill (it renewed at most a renew interval
// ago, plus the renewal's own latency), the store ends it at most lag
// later (demo.LeaseStore.ExpiryLag: etcd and ZooKeeper expire grants on a
// timer of their own), and a waiter retries, or is woken, right then. One
// renew interval and loadAllowance are allowed on top, for a loaded
// machine.
func (o options) handoverBound(lag time.Duration) time.Duration {
	return o.TTL + o.renewInterval() + loadAllowance + lag
}

// loadAllowance is how late a waiting replica may run on a loaded machine
// (each replica is a process of its own; two cores running the tests under
// the race detector delay one by a few hundred milliseconds at worst).
const loadAllowance = 300 * time.Millisecond

// Bounds of the flags: a demo that runs for hours helps nobody.
const (
	maxReplicas    = 20
	maxCustomers   = 100000
	maxInvoiceTime = 10 * time.Second
	// maxBatchTime bounds --customers x --invoice-time, the batch's own
	// length.
	maxBatchTime = 30 * time.Minute
)

const usageText = `Usage: go run ./examples/invoicejob [flags]

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
`

// parseFlags parses args. --help prints the usage on stdout and returns
// flag.ErrHelp; a bad flag's message and the usage go to stderr.
func parseFlags(args []string, stdout, stderr io.Writer) (options, error) {
	var o options
	fs := flag.NewFlagSet("invoicejob", flag.ContinueOnError)
	o.Register(fs, "lease TTL (whole milliseconds, from 100ms to 1m); renewed every TTL/3",
		"keep the schema and the lease's keys after the run, for inspection; servers the demo\nstarted itself are stopped, and their data directories are kept (their paths are printed)")
	fs.IntVar(&o.replicas, "replicas", 3, "number of replica processes competing for the lease (2 to 20)")
	fs.IntVar(&o.customers, "customers", 40, "number of customers, one invoice each: the batch size (1 to 100000)")
	fs.IntVar(&o.killAfter, "kill-after", 15, "kill a holder with SIGKILL after it has written this many invoices")
	fs.IntVar(&o.kills, "kills", 1, "how many holders to kill, one after the other (fewer than --replicas)")
	fs.DurationVar(&o.invoiceTime, "invoice-time", 100*time.Millisecond, "time to render one invoice, inside its fenced transaction (up to 10s;\n--customers x --invoice-time at most 30m)")
	fs.StringVar(&o.period, "period", "2026-11", "billing period the batch is for")
	fs.StringVar(&o.rowStore, "row-store", rowPostgres, rowStoreUsage)
	if err := demo.ParseFlags(fs, usageText, args, stdout, stderr); err != nil {
		return o, err
	}
	return o, o.check()
}

// check reports every bad flag at once.
func (o options) check() error {
	errs := []error{o.CheckTTL()}
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
	errs = append(errs, o.CheckLeaseStore(), checkRowStore(o.rowStore))
	if o.period == "" || len(o.period) > 32 {
		errs = append(errs, fmt.Errorf("--period %q: must be 1 to 32 bytes", o.period))
	}
	return errors.Join(errs...)
}
