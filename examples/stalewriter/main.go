// Command stalewriter shows, with real processes and real stores, why a
// lease alone cannot protect a write and how fencing tokens do.
//
// It runs the scenario of Kleppmann's critique of Redis locks ("How to do
// distributed locking", 2016):
//
//  1. worker A acquires a lease in Redis (or PostgreSQL, etcd, ZooKeeper:
//     --lease-store) and gets fencing token N;
//  2. A checks that its lease is valid and starts writing; right then it is
//     frozen with SIGSTOP, as a stop-the-world GC or a suspended VM would
//     freeze it, longer than the TTL (its heartbeat freezes with it);
//  3. the lease expires; worker B acquires it with a greater token (tokens
//     are large numbers minted from the Redis server clock) and writes a
//     row in PostgreSQL (a fenced pgx transaction on a table with
//     lock_version) and an object in S3 (blobguard);
//  4. A is resumed (SIGCONT) and, still believing it holds the lease,
//     writes the same row and object with token N;
//  5. both of A's writes are rejected as stale; B's data survives.
//
// It prints a timeline and a verdict computed from what happened (see
// verdict.go): who held which token when, and what each store answered to
// each write. Timing decides the story: a pause shorter than the lease's
// remaining validity lets A keep its lease; a write A sends after losing
// its lease is rejected if B has written there already, and accepted (B's
// write then replaces it) if B has not, which the verdict says plainly. It
// exits 0 when no stale write landed after a newer one and the final state
// belongs to the newest token. With --unguarded the same timeline uses
// plain SQL and plain PUT: A's write overwrites B's, and the program exits
// 1 saying why.
//
// Services come from the environment (FENCE_REDIS_URL, FENCE_POSTGRES_URL,
// FENCE_S3_*, FENCE_ETCD_ENDPOINTS, FENCE_ZK_SERVERS), else the default
// local addresses, else servers it starts itself (versitygw and etcd are
// built once into the user cache; ZooKeeper runs from Debian's package),
// else Docker through testcontainers-go. Everything it creates is removed at the end, however
// the run ends: the processes it starts die with it, even by SIGKILL, and
// what a killed run leaves in the stores is removed by the next run
// (package internal/rig/leftover).
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"syscall"
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

// run is the program: the timeline and the verdict go to stdout, errors to
// stderr. It returns the exit status.
func run(args []string, stdout, stderr io.Writer) int {
	o, err := parseFlags(args, stdout, stderr)
	s, exit := demo.Begin("stalewriter", err, stdout, stderr)
	if s == nil {
		return exit
	}
	defer s.End() // last: after everything below is removed

	mode := "guarded: fenced pgx transaction + blobguard"
	if o.unguarded {
		mode = "UNGUARDED: plain SQL UPDATE + plain S3 PUT"
	}
	fmt.Fprintf(s.Out, "stalewriter: lease TTL %v, worker A frozen for %v, writes %s\n\n", o.TTL, o.pause, mode)
	if err := s.Provide(demo.ServicesConfig(o.LeaseStore, services.Config{
		RedisURL: o.RedisURL, PostgresURL: o.PostgresURL, S3Endpoint: o.s3URL, Keep: o.Keep,
	})); err != nil {
		return s.Fail("%v", err)
	}
	sc, err := setUp(s.Ctx, s.Services, o)
	if err != nil {
		return s.Fail("setting up: %v", err)
	}
	if o.Keep {
		defer sc.keep(s)
	} else {
		defer sc.tearDown(s.ErrOut)
	}
	fmt.Fprintf(s.Out, "Leases: %s.\n", sc.cfg.Leases().Describe())
	ds, err := startDownstream(o, s.Out)
	if err != nil {
		return s.Fail("%v", err)
	}
	defer ds.close()
	s.Timeline.Restart() // the timeline counts from the first worker, not from starting services
	fmt.Fprintf(s.Out, "Row %s.%s id=%s and object s3://%s/%s start empty; lease %q.\n\nTimeline:\n",
		sc.cfg.Schema, sc.cfg.Table, sc.cfg.RowID, sc.cfg.S3.Bucket, sc.cfg.ObjectKey, sc.cfg.LeaseName)

	sum, err := sc.play(s.Ctx, s.Timeline, o)
	if err != nil {
		return s.Incomplete(err)
	}
	sum.Services = s.Services.Used
	if o.Keep {
		sum.KeptDirs = s.Services.Dirs
	}
	sum.Elapsed = s.Timeline.Elapsed()
	sum.printFinal(s.Out)
	ds.finish(sum, s.Out)
	if err := s.WriteJSON(o.JSON, sum); err != nil {
		return s.Fail("%v", err)
	}
	return sum.exitCode()
}

// play runs the timeline: worker A takes the lease and checks it; right
// then it is frozen, longer than the TTL; worker B takes the lease over and
// writes; A is resumed and writes with its old token. Then play reads what
// the stores kept and judges the run.
func (sc *scenario) play(ctx context.Context, tl *demo.Timeline, o options) (*summary, error) {
	sum := sc.newSummary(o)
	workers := demo.NewGroup[event]("worker", configVar)
	defer workers.Stop() // never leave a process behind, frozen or not
	a, err := sc.startWorker(workers, "A", 30*time.Second)
	if err != nil {
		return nil, err
	}
	tl.Say(time.Now(), "orchestrator", "started worker A (pid %d)", a.Pid())
	var (
		b       *demo.Proc
		frozen  bool
		frozeAt time.Time
		resume  <-chan time.Time
		overall = time.After(o.pause + 6*o.TTL + 60*time.Second)
		// With --resume-after-b, A wakes when both the pause is over and
		// B has written and checked its lease.
		pauseOver, bDone bool
	)
	thaw := func() error {
		if err := a.Signal(syscall.SIGCONT); err != nil {
			return fmt.Errorf("SIGCONT worker A: %w", err)
		}
		frozen = false
		sum.Events = append(sum.Events, event{At: time.Now(), Role: "orchestrator", Kind: evResumed})
		why := ""
		if o.resumeAfterB {
			why = " (the pause was over and B had written)"
		}
		tl.Say(time.Now(), "orchestrator", "resumed worker A with SIGCONT after %v%s; it goes on with its write", time.Since(frozeAt).Round(time.Millisecond), why)
		return nil
	}
	for running := 2; running > 0; {
		select {
		case e := <-workers.Events:
			sum.Events = append(sum.Events, e)
			tl.Say(e.At, "worker "+e.Role, "%s", e.Text)
			switch {
			case e.Kind == evFailed:
				return nil, fmt.Errorf("worker %s: %s", e.Role, e.Text)
			case e.Kind == evAcquired && e.Role == "A":
				sum.TokenA = e.Token
			case e.Kind == evAcquired:
				sum.TokenB = e.Token
			case e.Kind == evLeaseState && e.Role == "B":
				bDone = true
				if o.resumeAfterB && pauseOver && frozen {
					if err := thaw(); err != nil {
						return nil, err
					}
				}
			case e.Kind == evChecked && e.Role == "A":
				// Freeze A between its lease check and its write.
				if err := a.Signal(syscall.SIGSTOP); err != nil {
					return nil, fmt.Errorf("SIGSTOP worker A: %w", err)
				}
				frozen, frozeAt = true, time.Now()
				sum.Events = append(sum.Events, event{At: time.Now(), Role: "orchestrator", Kind: evFroze})
				tl.Say(time.Now(), "orchestrator", "froze worker A with SIGSTOP for %v (TTL %v): its heartbeat stops with it", o.pause, o.TTL)
				resume = time.After(o.pause)
				if b, err = sc.startWorker(workers, "B", o.pause+4*o.TTL+30*time.Second); err != nil {
					return nil, err
				}
				tl.Say(time.Now(), "orchestrator", "started worker B (pid %d); it waits for the lease", b.Pid())
			}
		case <-resume:
			resume, pauseOver = nil, true
			if o.resumeAfterB && !bDone {
				tl.Say(time.Now(), "orchestrator", "the pause of %v is over; worker A stays frozen until worker B has written (--resume-after-b)", o.pause)
				continue
			}
			if err := thaw(); err != nil {
				return nil, err
			}
		case x := <-workers.Exits:
			workers.Exited(x)
			running--
			if x.Err != nil {
				return nil, fmt.Errorf("worker %s: %w", x.Name, x.Err)
			}
			if b == nil {
				return nil, errors.New("worker A exited before it was frozen")
			}
		case <-overall:
			return nil, fmt.Errorf("timed out (A frozen: %v)", frozen)
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	workers.Drain(func(e event) { // events that arrived with the exits
		sum.Events = append(sum.Events, e)
		tl.Say(e.At, "worker "+e.Role, "%s", e.Text)
	})
	if err := sc.conclude(ctx, sum, o.unguarded); err != nil {
		return nil, err
	}
	return sum, nil
}
