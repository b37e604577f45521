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
	demo.Flags        // --ttl, --lease-store, --keep, --redis-url, --postgres-url, --json
	pause, writeDelay time.Duration
	unguarded         bool
	dynamodb          bool
	rowStore          string
	s3URL             string
	downstream        bool // --downstream: see downstream.go
	resumeAfterB      bool // --resume-after-b
}

// Bounds of the timing flags: a demo that runs for hours, or whose default
// pause overflows, helps nobody.
const (
	maxPause                     = 10 * time.Minute
	minWriteDelay, maxWriteDelay = 50 * time.Millisecond, 10 * time.Second
)

const usageText = `Usage: go run ./examples/stalewriter [flags]

Runs the paused-client scenario with two real worker processes, a lease
store (Redis; or PostgreSQL, etcd, ZooKeeper or DynamoDB with --lease-store),
PostgreSQL and S3 (and a DynamoDB item with --dynamodb), and shows the stale
write rejected by the stores.
Exit status: 0 when every stale write was rejected and the newest token's data
survived; 1 when a stale write landed (expected with --unguarded); 2 when the
run could not be carried out (a service is missing, a bad flag, a write that
failed for another reason than a stale token).

Flags:
`

// parseFlags parses args. --help prints the usage on stdout and returns
// flag.ErrHelp; a bad flag's message and the usage go to stderr.
func parseFlags(args []string, stdout, stderr io.Writer) (options, error) {
	var o options
	fs := flag.NewFlagSet("stalewriter", flag.ContinueOnError)
	o.Register(fs, "lease TTL (whole milliseconds, from 100ms to 1m)",
		"keep the schema, the lease's keys and the S3 object after the run, for inspection; servers\nthe demo started itself are stopped, and their data directories are kept (their paths are printed)")
	fs.DurationVar(&o.pause, "pause", 0, "how long worker A is frozen, up to 10m (default: 2*TTL + 1s, well past the TTL)")
	fs.DurationVar(&o.writeDelay, "write-delay", 300*time.Millisecond, "time between A's lease check and its write, in which A is frozen (50ms to 10s)")
	fs.BoolVar(&o.resumeAfterB, "resume-after-b", false, "keep worker A frozen past --pause until worker B has written every store and checked its lease:\nB's writes come first however slow the machine (the scenario the tests check)")
	fs.BoolVar(&o.unguarded, "unguarded", false, "write with plain SQL and plain PUT, without fencing, to show the failure")
	fs.BoolVar(&o.dynamodb, "dynamodb", false, "also write the report to a DynamoDB item through dynamoguard, in a table of the run's own\nat $"+demo.DynamoEndpointVar+" (with --lease-store dynamodb: leases and a fenced item in DynamoDB)")
	fs.StringVar(&o.rowStore, "row-store", rowPostgres, rowStoreUsage)
	fs.StringVar(&o.s3URL, "s3-endpoint", "", "S3 endpoint URL; needs FENCE_S3_ACCESS_KEY and FENCE_S3_SECRET_KEY (default: $FENCE_S3_ENDPOINT, else a versitygw it starts)")
	fs.BoolVar(&o.downstream, "downstream", false, downstreamUsage)
	if err := demo.ParseFlags(fs, usageText, args, stdout, stderr); err != nil {
		return o, err
	}
	ttlErr := o.CheckTTL()
	if ttlErr == nil && o.pause == 0 {
		o.pause = 2*o.TTL + time.Second
	}
	var pauseErr, delayErr error
	if o.pause < 0 || o.pause > maxPause {
		pauseErr = fmt.Errorf("--pause %v: must be positive and at most %v", o.pause, maxPause)
	}
	if o.writeDelay < minWriteDelay || o.writeDelay > maxWriteDelay {
		delayErr = fmt.Errorf("--write-delay %v: must be from %v (or A may write before it is frozen) to %v", o.writeDelay, minWriteDelay, maxWriteDelay)
	}
	return o, errors.Join(ttlErr, checkRowStore(o.rowStore), o.CheckLeaseStore(), pauseErr, delayErr)
}
