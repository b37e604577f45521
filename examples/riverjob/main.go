// Command riverjob shows, with real River workers in separate processes,
// a job's first attempt paused past River's rescue, and how package
// riverfence keeps it from writing and completing the job twice.
//
// The job pays an amount once: it writes its progress on the job's
// payment row, then adds a ledger line and the amount to an account, and
// completes, in one transaction. The run:
//
//  1. worker A (a River client in its own process) fetches the job; the
//     middleware gives the attempt fencing token N; right then A is frozen
//     with SIGSTOP, as a stop-the-world GC or a frozen container would
//     freeze it;
//  2. the attempt has run longer than RescueStuckJobsAfter: River's
//     rescuer (on the leader, a client in this process) makes the job
//     retryable, and its scheduler available again;
//  3. worker B fetches it: attempt 2, a greater token; B writes, pays and
//     completes the job;
//  4. A is resumed (SIGCONT) and, not looking at its context, writes and
//     pays and completes with token N;
//  5. A's write and its completion are refused as stale; the amount was
//     paid once; the job is completed by attempt 2.
//
// With --unfenced the same run uses plain SQL and River's JobCompleteTx
// without the middleware: A's late transaction pays a second time, and the
// program exits 1 saying so.
//
// PostgreSQL comes from --postgres-url, $FENCE_POSTGRES_URL, the local
// default, or a server it starts itself. Everything the run creates lives
// in a schema of its own, dropped at the end however the run ends (package
// internal/rig/leftover); the worker processes die with it.
package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"time"

	"github.com/fencekit/fencekit/examples/internal/demo"
	"github.com/fencekit/fencekit/internal/rig/services"
)

func main() {
	if len(os.Args) > 1 && os.Args[1] == "worker" {
		os.Exit(runWorker())
	}
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

// options are the program's flags.
type options struct {
	rescueAfter, writeDelay time.Duration
	unfenced, keep          bool
	postgresURL, json       string
}

// Bounds of the timing flags.
const (
	minRescueAfter, maxRescueAfter = 500 * time.Millisecond, time.Minute
	minWriteDelay, maxWriteDelay   = 50 * time.Millisecond, 10 * time.Second
)

const usageText = `Usage: go run ./examples/riverjob [flags]

Runs one River job whose first attempt is frozen past River's rescue, with
two real worker processes and PostgreSQL, and shows the first attempt's late
writes and completion refused by the stores (package riverfence).
Exit status: 0 when the job's effects happened once and its row is the
second attempt's; 1 when they did not (expected with --unfenced); 2 when the
run could not be carried out.

Flags:
`

func parseFlags(args []string, stdout, stderr io.Writer) (options, error) {
	var o options
	fs := flag.NewFlagSet("riverjob", flag.ContinueOnError)
	fs.DurationVar(&o.rescueAfter, "rescue-after", time.Second, "River's RescueStuckJobsAfter: how long an attempt runs before River rescues the job (500ms to 1m)")
	fs.DurationVar(&o.writeDelay, "write-delay", 300*time.Millisecond, "time between the first attempt's start and its first write, in which it is frozen (50ms to 10s)")
	fs.BoolVar(&o.unfenced, "unfenced", false, "run the job without riverfence (plain SQL, River's JobCompleteTx), to show the failure")
	fs.BoolVar(&o.keep, "keep", false, "keep the schema after the run, for inspection")
	fs.StringVar(&o.postgresURL, "postgres-url", "", "PostgreSQL URL (default: $FENCE_POSTGRES_URL, else postgres://postgres@127.0.0.1:5432/test, else one it starts)")
	fs.StringVar(&o.json, "json", "", "also write a machine-readable summary of the run to this file")
	if err := demo.ParseFlags(fs, usageText, args, stdout, stderr); err != nil {
		return o, err
	}
	var errs []error
	if o.rescueAfter < minRescueAfter || o.rescueAfter > maxRescueAfter {
		errs = append(errs, fmt.Errorf("--rescue-after %v: must be from %v to %v", o.rescueAfter, minRescueAfter, maxRescueAfter))
	}
	if o.writeDelay < minWriteDelay || o.writeDelay > maxWriteDelay {
		errs = append(errs, fmt.Errorf("--write-delay %v: must be from %v (or A may write before it is frozen) to %v", o.writeDelay, minWriteDelay, maxWriteDelay))
	}
	return o, errors.Join(errs...)
}

// run is the program: the timeline and the verdict go to stdout, errors to
// stderr. It returns the exit status.
func run(args []string, stdout, stderr io.Writer) int {
	o, err := parseFlags(args, stdout, stderr)
	s, exit := demo.Begin("riverjob", err, stdout, stderr)
	if s == nil {
		return exit
	}
	defer s.End() // last: after everything below is removed

	mode := "fenced: riverfence middleware, sqlguard, Complete"
	if o.unfenced {
		mode = "UNFENCED: plain SQL and River's JobCompleteTx"
	}
	fmt.Fprintf(s.Out, "riverjob: River rescues a job after %v; the first attempt is frozen past that; %s\n\n", o.rescueAfter, mode)
	if err := s.Provide(services.Config{PostgresURL: o.postgresURL, NoRedis: true, NoS3: true, Keep: o.keep}); err != nil {
		return s.Fail("%v", err)
	}
	sc, err := setUp(s.Ctx, s.Services, o)
	if err != nil {
		return s.Fail("setting up: %v", err)
	}
	if o.keep {
		defer sc.keep(s.Out)
	} else {
		defer sc.tearDown(s.ErrOut)
	}
	s.Timeline.Restart()
	fmt.Fprintf(s.Out, "Schema %s: River's tables, fencekit's, and the job's (payments, ledger, accounts).\n\nTimeline:\n", sc.cfg.Schema)
	sum, err := sc.play(s.Ctx, s.Timeline, o)
	if err != nil {
		return s.Incomplete(err)
	}
	sum.Elapsed = s.Timeline.Elapsed()
	sum.print(s.Out)
	if err := s.WriteJSON(o.json, sum); err != nil {
		return s.Fail("%v", err)
	}
	if !sum.OK {
		return 1
	}
	return 0
}
