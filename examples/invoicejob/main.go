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
// removed by the next run (package internal/rig/leftover).
package main

import (
	"context"
	"fmt"
	"io"
	"os"
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

// run is the program: the timeline, summary and verdict go to stdout,
// errors to stderr. It returns the exit status.
func run(args []string, stdout, stderr io.Writer) int {
	o, err := parseFlags(args, stdout, stderr)
	s, exit := demo.Begin("invoicejob", err, stdout, stderr)
	if s == nil {
		return exit
	}
	defer s.End() // last: after everything below is removed

	fmt.Fprintf(s.Out, "invoicejob: %d replicas, %d invoices for period %s, lease TTL %v (renewed every %v); kill %d holder(s) with SIGKILL after %d invoices each\n\n",
		o.replicas, o.customers, o.period, o.TTL, o.renewInterval().Round(time.Millisecond), o.kills, o.killAfter)
	if err := s.Provide(demo.ServicesConfig(o.LeaseStore, services.Config{
		RedisURL: o.RedisURL, PostgresURL: o.PostgresURL, NoS3: true, Keep: o.Keep,
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
	fmt.Fprintf(s.Out, "Schema %s: %d customers, no invoices yet; lease %q; writes fenced on resource %q.\n",
		sc.cfg.Schema, o.customers, sc.cfg.LeaseName, resourceFor(o.period))
	if sc.dynamo != nil {
		fmt.Fprintf(s.Out, "Invoices and progress item in DynamoDB table %s at %s.\n", sc.dynamo.Name, sc.dynamo.Endpoint)
	}
	fmt.Fprintf(s.Out, "\nTimeline:\n")

	sum, err := sc.play(s.Ctx, s.Timeline, o)
	if err != nil {
		return s.Incomplete(err)
	}
	if err := sc.verify(s.Ctx, s.Timeline, o, sum); err != nil {
		fmt.Fprintf(s.ErrOut, "\ninvoicejob: checking the outcome: %v\n", err)
		return 2
	}
	sum.Services = s.Services.Used
	sum.Elapsed = s.Timeline.Elapsed()
	sum.print(s.Out, s.Timeline, o)
	if err := s.WriteJSON(o.JSON, sum); err != nil {
		return s.Fail("%v", err)
	}
	if !sum.OK {
		return 1
	}
	return 0
}

// play starts the replicas and follows them until every one has exited,
// killing the holder mid-batch as often as --kills says (follower.invoice).
func (sc *scenario) play(ctx context.Context, tl *demo.Timeline, o options) (*summary, error) {
	f := &follower{sc: sc, ctx: ctx, tl: tl, o: o, killsLeft: o.kills, current: map[string]*holder{},
		replicas: demo.NewGroup[event]("replica", configVar),
		sum: &summary{Period: o.period, Customers: o.customers, Replicas: o.replicas, LeaseStore: o.LeaseStore,
			Rows:      rowsInfo{Store: o.rowStore, Schema: sc.cfg.Schema, DynamoDB: sc.dynamo},
			TTLMillis: o.TTL.Milliseconds(), RenewMillis: o.renewInterval().Milliseconds()}}
	defer f.replicas.Stop() // never leave a replica behind, and wait for each
	budget := time.Duration(o.customers)*(o.invoiceTime+50*time.Millisecond)*2 + time.Duration(o.kills+2)*3*o.TTL + 60*time.Second
	for i := range o.replicas {
		name := fmt.Sprintf("replica-%d", i+1)
		p, err := sc.startReplica(f.replicas, name, budget)
		if err != nil {
			return nil, fmt.Errorf("starting %s: %w", name, err)
		}
		tl.Say(time.Now(), "orchestrator", "started %s (pid %d)", name, p.Pid())
	}
	overall := time.NewTimer(budget)
	defer overall.Stop()
	for running := o.replicas; running > 0; {
		select {
		case e := <-f.replicas.Events:
			f.event(e)
		case x := <-f.replicas.Exits:
			running--
			f.exit(x)
		case <-overall.C:
			return nil, fmt.Errorf("timed out after %v", budget)
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	f.replicas.Drain(f.event) // a replica's events are all queued before its exit is
	if f.pending != nil {
		f.pending.Took = -1
		f.sum.problems = append(f.sum.problems, fmt.Sprintf("nobody acquired the lease after %s was killed", f.pending.From))
	}
	return f.sum, nil
}

// invoice kills the holder h with SIGKILL once it has written --kill-after
// invoices, while kills are left; the next acquire completes the handover.
func (f *follower) invoice(e event, h *holder) {
	p := f.replicas.Proc(e.Replica)
	if f.killsLeft == 0 || h.Reported != f.o.killAfter || p.Killed {
		return
	}
	f.killsLeft--
	err := p.Kill()
	killedAt := time.Now()
	if err != nil {
		f.sum.problems = append(f.sum.problems, fmt.Sprintf("could not kill %s: %v", e.Replica, err))
		return
	}
	h.Fate, h.KilledAt = evKilled, killedAt
	left, _ := f.sc.LeaseLeft(f.ctx, f.o.TTL)
	f.pending = &handover{From: e.Replica, FromToken: h.Token, KilledAt: killedAt, LeaseLeft: left}
	f.sum.Handovers = append(f.sum.Handovers, f.pending)
	f.tl.Say(killedAt, "orchestrator", "KILLED %s (pid %d) with SIGKILL after its invoice #%d; its lease is not released and has %s left in %s",
		e.Replica, p.Pid(), e.Number, leftText(f.sc.LeaseStore, left), storeName(f.sc.LeaseStore))
}
