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
	ttl                time.Duration
	replicas, orders   int
	freezeAfter        int
	pause, orderTime   time.Duration
	period             string
	redisURL, mysqlURL string
	keep               bool
	json               string
}

// Bounds of the flags: a demo that runs for hours helps nobody.
const (
	maxReplicas  = 9
	maxOrders    = 10000
	maxPause     = 10 * time.Minute
	maxOrderTime = 10 * time.Second
)

const usageText = `Usage: go run ./examples/settleorders [flags]

Runs replicas of a nightly "settle orders" job as real processes: leases in
Redis, orders in MariaDB through dbguard, an inventory service over HTTP
behind fencehttp, metrics through leaseprom, the job run once per night with
lease.Manager.RunOnce and dbguard.Ledger, every guard checked at start-up.
The replica that runs the job is frozen with SIGSTOP past its lease's TTL and
resumed once another replica has finished the night's run; the program then
checks that every write the frozen replica made late was refused as stale,
that each order was settled and its stock released exactly once, and what
each replica's /metrics showed.
Exit status: 0 when every check passed; 1 when a check failed; 2 when the run
could not be carried out (a service is missing, a start-up check failed, a
bad flag).

Flags:
`

// parseFlags parses args. --help prints the usage on stdout and returns
// flag.ErrHelp; a bad flag's message and the usage go to stderr.
func parseFlags(args []string, stdout, stderr io.Writer) (options, error) {
	var o options
	fs := flag.NewFlagSet("settleorders", flag.ContinueOnError)
	fs.DurationVar(&o.ttl, "ttl", 2*time.Second, "lease TTL (whole milliseconds, from 100ms to 1m)")
	fs.IntVar(&o.replicas, "replicas", 3, "replica processes of the job (2 to 9)")
	fs.IntVar(&o.orders, "orders", 12, "open orders to settle tonight (2 to 10000)")
	fs.IntVar(&o.freezeAfter, "freeze-after", 0, "freeze the replica that runs the job after it has settled this many orders\n(default: a third of --orders; fewer than --orders)")
	fs.DurationVar(&o.pause, "pause", 0, "how long the frozen replica stays frozen at least (up to 10m; default 2*TTL); it is\nresumed once that has passed and another replica has finished the night's run")
	fs.DurationVar(&o.orderTime, "order-time", 100*time.Millisecond, "time the job takes between two orders (up to 10s)")
	fs.StringVar(&o.period, "period", time.Now().UTC().Format(time.DateOnly), "the night the run is for: the run key in the ledger")
	fs.StringVar(&o.redisURL, "redis-url", "", "Redis URL (default: $FENCE_REDIS_URL, else redis://127.0.0.1:6379/0, else one it starts)")
	fs.StringVar(&o.mysqlURL, "mysql-url", "", "MariaDB or MySQL server, a go-sql-driver DSN (default: $"+demo.MySQLURLVar+", else\n"+demo.DefaultMySQLURL+"); a throwaway database is made there")
	fs.BoolVar(&o.keep, "keep", false, "keep the run's MariaDB database and the lease's Redis keys after the run, for inspection")
	fs.StringVar(&o.json, "json", "", "also write a machine-readable summary of the run to this file")
	if err := demo.ParseFlags(fs, usageText, args, stdout, stderr); err != nil {
		return o, err
	}
	var errs []error
	if o.ttl < demo.MinTTL || o.ttl > demo.MaxTTL || o.ttl%time.Millisecond != 0 {
		errs = append(errs, fmt.Errorf("--ttl %v: must be a whole number of milliseconds, from %v to %v", o.ttl, demo.MinTTL, demo.MaxTTL))
	}
	if o.replicas < 2 || o.replicas > maxReplicas {
		errs = append(errs, fmt.Errorf("--replicas %d: must be from 2 (one to freeze, one to take over) to %d", o.replicas, maxReplicas))
	}
	if o.orders < 2 || o.orders > maxOrders {
		errs = append(errs, fmt.Errorf("--orders %d: must be from 2 to %d", o.orders, maxOrders))
	}
	if o.freezeAfter == 0 {
		o.freezeAfter = max(1, o.orders/3)
	}
	if o.freezeAfter < 1 || o.freezeAfter >= o.orders {
		errs = append(errs, fmt.Errorf("--freeze-after %d: must be from 1 to %d (fewer than --orders)", o.freezeAfter, o.orders-1))
	}
	if o.pause == 0 && len(errs) == 0 {
		o.pause = 2 * o.ttl
	}
	if o.pause < 0 || o.pause > maxPause {
		errs = append(errs, fmt.Errorf("--pause %v: must be positive and at most %v", o.pause, maxPause))
	}
	if o.orderTime < 0 || o.orderTime > maxOrderTime {
		errs = append(errs, fmt.Errorf("--order-time %v: must be from 0 to %v", o.orderTime, maxOrderTime))
	}
	if o.period == "" {
		errs = append(errs, errors.New("--period: must not be empty"))
	}
	return o, errors.Join(errs...)
}

// budget bounds the whole run: the frozen replica's pause, the handover
// (a TTL), the orders at --order-time each, twice over, and a minute for a
// loaded machine.
func (o options) budget() time.Duration {
	return o.pause + 4*o.ttl + 2*time.Duration(o.orders)*(o.orderTime+100*time.Millisecond) + time.Minute
}
