// Command settleorders is the program a new user writes first, run end to
// end: three replicas of a nightly "settle orders" job, with real
// processes and real stores, and nothing hand-written around the library.
//
//   - Leases in Redis (redislease); the job runs once a night on one
//     replica with lease.Manager.RunOnce, its runs recorded in MariaDB by
//     dbguard.Ledger, the night's done mark written in the job's last
//     transaction (Ledger.MarkDoneTx).
//   - Orders in MariaDB through dbguard: each order settled in a
//     transaction fenced on the job's resource (Guard.BeginFunc), its row
//     written through a fenced table (Table.Update) and its payout beside
//     it.
//   - An internal inventory service over HTTP behind fencehttp: the job
//     calls it through fencehttp.Transport with the lease's token, fenced
//     by the resource and the job ("inventory/settle-orders"), never by
//     Lease.Name().
//   - Metrics for the operations team through leaseprom: one Observer per
//     replica takes the lease events (fencekit_job_running among them) and
//     the writes of dbguard and fencehttp, served at the replica's
//     /metrics.
//   - At start-up, before taking any work, each replica checks every store
//     the job needs: Manager.Check, Guard.Check, Table.Check, Ledger.Check.
//
// The scenario: the replicas start together and each calls RunOnce for
// tonight; one gets the lease and settles orders. After --freeze-after
// orders it is frozen with SIGSTOP, as a stop-the-world GC or a suspended
// VM would freeze it, past its lease's TTL; another replica takes the
// lease over, with a greater token, settles the rest and marks the night
// done; the third finds the night done. Then the frozen replica is resumed
// and, still in its job, goes on with the orders on its list. Its late
// calls and transactions are refused as stale by the inventory service and
// by MariaDB. The program reads the stores and every replica's /metrics
// and prints a verdict: every late write refused, each order settled and
// its stock released exactly once, the night run once, and what the
// metrics showed. It exits 0 when every check passed, 1 when one failed,
// 2 when the run could not be carried out.
//
// Services: Redis from --redis-url or FENCE_REDIS_URL, else the default
// local address, else a redis-server it starts; MariaDB from --mysql-url or
// FENCE_MYSQL_URL, else root@tcp(127.0.0.1:3306)/test, where it makes a
// database of its own. Everything it creates is removed at the end,
// however the run ends (package internal/rig/leftover).
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
	if len(os.Args) > 1 && os.Args[1] == "replica" {
		os.Exit(runReplica())
	}
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

// run is the program: the timeline, the metrics and the verdict go to
// stdout, errors to stderr. It returns the exit status.
func run(args []string, stdout, stderr io.Writer) int {
	o, err := parseFlags(args, stdout, stderr)
	s, exit := demo.Begin("settleorders", err, stdout, stderr)
	if s == nil {
		return exit
	}
	defer s.End() // last: after everything below is removed

	fmt.Fprintf(s.Out, "settleorders: %d replicas of the nightly job %q for %s, %d open orders; lease TTL %v;\n"+
		"the replica running the job is frozen after %d orders for at least %v\n\n",
		o.replicas, job, o.period, o.orders, o.ttl, o.freezeAfter, o.pause)
	if err := s.Provide(services.Config{RedisURL: o.redisURL, NoPostgres: true, NoS3: true}); err != nil {
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
	fmt.Fprintf(s.Out, "MariaDB database %s at %s: %d open orders, fencekit's tables (migrations), lock_version on orders.\n"+
		"Inventory service: %s (fencehttp.Handler, resource %q).\nLease %q in Redis under the prefix %q.\n\nTimeline:\n",
		sc.db.Name, sc.db.Addr, o.orders, sc.inv.url, inventoryResource, job, sc.prefix)
	s.Timeline.Restart()

	f := newFollower(s.Ctx, sc, o, s.Timeline)
	if err := f.play(); err != nil {
		return s.Incomplete(err)
	}
	sum, err := f.conclude()
	if err != nil {
		return s.Incomplete(err)
	}
	sum.Services, sum.Elapsed = s.Services.Used, s.Timeline.Elapsed()
	sum.print(s.Out)
	if err := s.WriteJSON(o.json, sum); err != nil {
		return s.Fail("%v", err)
	}
	if !sum.OK {
		return 1
	}
	return 0
}

// follower follows the replicas through the night, freezes the job's
// first holder at a stop point, resumes it once the night's run is done
// elsewhere, and reads the metrics at the moments that tell the story.
type follower struct {
	ctx      context.Context
	sc       *scenario
	o        options
	tl       *demo.Timeline
	replicas *demo.Group[event]
	sum      *summary
	urls     map[string]string // each replica's /metrics

	frozen          *demo.Proc
	pauseOver       <-chan time.Time
	paused, resumed bool
	runDone         bool
	ended           map[string]bool
}

func newFollower(ctx context.Context, sc *scenario, o options, tl *demo.Timeline) *follower {
	return &follower{ctx: ctx, sc: sc, o: o, tl: tl, replicas: demo.NewGroup[event]("replica", configVar),
		urls: map[string]string{}, ended: map[string]bool{},
		sum: &summary{Job: job, Period: o.period, Orders: o.orders, FreezeAfter: o.freezeAfter, Replicas: o.replicas,
			Database: sc.db.Name, RedisPrefix: sc.prefix, LeaseKeys: []string{sc.keys.Lease, sc.keys.Token}}}
}

// play starts the replicas and follows them until each one's RunOnce has
// returned; then it reads the metrics once more and ends the replicas.
func (f *follower) play() error {
	defer f.replicas.Stop() // never leave a replica behind, frozen or not
	for i := range f.o.replicas {
		name := fmt.Sprintf("replica-%d", i+1)
		p, err := f.replicas.Start(name, f.sc.replicaConfig(name, f.o))
		if err != nil {
			return fmt.Errorf("starting %s: %w", name, err)
		}
		f.tl.Say(time.Now(), "orchestrator", "started %s (pid %d)", name, p.Pid())
	}
	overall := time.NewTimer(f.o.budget())
	defer overall.Stop()
	for len(f.ended) < f.o.replicas {
		select {
		case e := <-f.replicas.Events:
			if err := f.event(e); err != nil {
				return err
			}
		case x := <-f.replicas.Exits:
			f.replicas.Exited(x)
			f.replicas.Drain(func(e event) { _ = f.event(e) })
			return fmt.Errorf("%s exited before the night's run was over: %v", x.Name, x.Err)
		case <-f.pauseOver:
			f.pauseOver, f.paused = nil, true
			if err := f.maybeResume(); err != nil {
				return err
			}
		case <-overall.C:
			return fmt.Errorf("timed out after %v (a replica frozen: %v)", f.o.budget(), f.frozen != nil && !f.resumed)
		case <-f.ctx.Done():
			return f.ctx.Err()
		}
	}
	f.sample(sampleFinal, "after the night's run")
	return f.endReplicas()
}

// event handles one replica event.
func (f *follower) event(e event) error {
	f.sum.Events = append(f.sum.Events, e)
	f.tl.Say(e.At, e.Replica, "%s", e.Text)
	switch e.Kind {
	case evFailed:
		return fmt.Errorf("%s: %s", e.Replica, e.Text)
	case evReady:
		f.urls[e.Replica] = e.MetricsURL
	case evStopPoint:
		return f.stopPoint(e)
	case evRunEnded:
		f.ended[e.Replica] = true
		if e.Ran && e.Error == "" {
			f.runDone = true
		}
		return f.maybeResume()
	}
	return nil
}

// stopPoint handles a replica at one of its stop points: the first
// holder at --freeze-after is read and frozen with SIGSTOP; at the next
// order, the replica that took over and, once it runs again, the frozen
// one are read and let go, as is any other (SIGCONT).
func (f *follower) stopPoint(e event) error {
	p := f.replicas.Proc(e.Replica)
	switch {
	case f.frozen == nil && e.Order == f.o.freezeAfter:
		f.sample(sampleBeforeFreeze, e.Replica+" runs the job, just before it is frozen")
		if err := p.Signal(syscall.SIGSTOP); err != nil {
			return fmt.Errorf("SIGSTOP %s: %w", e.Replica, err)
		}
		f.frozen, f.sum.Frozen, f.sum.FrozenToken = p, e.Replica, e.Token
		f.pauseOver = time.After(f.o.pause)
		f.tl.Say(time.Now(), "orchestrator", "FROZE %s with SIGSTOP after order %d (TTL %v): its heartbeat stops with it; "+
			"it will be resumed after %v, once another replica has finished the night's run", e.Replica, e.Order, f.o.ttl, f.o.pause)
		return nil
	case f.frozen != nil && !f.resumed && p != f.frozen:
		f.sample(sampleFrozen, fmt.Sprintf("%s is frozen; %s runs the job", f.frozen.Name, e.Replica))
	case f.resumed && p == f.frozen:
		f.sample(sampleAfterResume, f.frozen.Name+" was resumed; its job goes on, its lease is lost")
	}
	return p.Signal(syscall.SIGCONT)
}

// sample reads every replica's /metrics, once for each kind of moment.
func (f *follower) sample(kind, moment string) {
	for _, x := range f.sum.Samples {
		if x.Kind == kind {
			return
		}
	}
	f.sum.Samples = append(f.sum.Samples, takeSample(f.ctx, kind, moment, f.urls))
}

// maybeResume resumes the frozen replica once its pause is over and
// another replica has finished the night's run.
func (f *follower) maybeResume() error {
	if f.frozen == nil || f.resumed || !f.paused || !f.runDone {
		return nil
	}
	if err := f.frozen.Signal(syscall.SIGCONT); err != nil {
		return fmt.Errorf("SIGCONT %s: %w", f.frozen.Name, err)
	}
	f.resumed = true
	f.tl.Say(time.Now(), "orchestrator", "RESUMED %s with SIGCONT: it goes on with its job where it was", f.frozen.Name)
	return nil
}

// endReplicas asks each replica to stop (SIGTERM), as a deploy would, and
// waits for them.
func (f *follower) endReplicas() error {
	for name := range f.ended {
		_ = f.replicas.Proc(name).Signal(syscall.SIGTERM)
	}
	wait := time.NewTimer(30 * time.Second)
	defer wait.Stop()
	var errs []error
	for left := f.o.replicas; left > 0; {
		select {
		case e := <-f.replicas.Events:
			_ = f.event(e)
		case x := <-f.replicas.Exits:
			f.replicas.Exited(x)
			left--
			if x.Err != nil {
				errs = append(errs, fmt.Errorf("%s: %w", x.Name, x.Err))
			}
		case <-wait.C:
			return errors.New("the replicas did not stop within 30s of SIGTERM")
		}
	}
	f.replicas.Drain(func(e event) { _ = f.event(e) })
	return errors.Join(errs...)
}
