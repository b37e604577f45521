package main

import (
	"context"
	"fmt"
	"syscall"
	"time"

	"github.com/fencekit/fencekit/examples/internal/demo"
	"github.com/fencekit/fencekit/fence"
)

// summary is what the run found; --json writes it.
type summary struct {
	OK          bool          `json:"ok"`
	Verdict     string        `json:"verdict"`
	Period      string        `json:"period"`
	Customers   int           `json:"customers"`
	Replicas    int           `json:"replicas"`
	TTLMillis   int64         `json:"ttl_ms"`
	RenewMillis int64         `json:"renew_interval_ms"`
	Holders     []*holder     `json:"holders"`
	Handovers   []*handover   `json:"handovers"`
	Checks      []check       `json:"checks"`
	Invoices    int           `json:"invoices_in_db"`
	Replays     []replay      `json:"replays"`
	LeaseStore  string        `json:"lease_store"`
	Rows        rowsInfo      `json:"rows"`
	Events      []event       `json:"events"`
	Services    []string      `json:"services"`
	Elapsed     time.Duration `json:"elapsed_ns"`
	problems    []string      // things that went wrong during the run
}

// rowsInfo says where the run's rows were (--row-store).
type rowsInfo struct {
	Store  string `json:"store"`
	Schema string `json:"schema"` // the run's PostgreSQL schema (the customers; the invoices with postgres)
	// DynamoDB names the run's table with --row-store dynamodb.
	DynamoDB *demo.RunTable `json:"dynamodb,omitempty"`
}

// holder is one grant of the lease to a replica.
type holder struct {
	Replica    string      `json:"replica"`
	Pid        int         `json:"pid"`
	Token      fence.Token `json:"token"`
	AcquiredAt time.Time   `json:"acquired_at"`
	// ResumedAt is the batch position the progress row showed (-1 if the
	// holder never read it).
	ResumedAt int `json:"resumed_at"`
	// Reported is how many invoices the replica said it committed.
	Reported int `json:"invoices_reported"`
	// Written is how many invoices in the database carry its token, and
	// First and Last their numbers.
	Written int `json:"invoices_written"`
	First   int `json:"first_invoice,omitempty"`
	Last    int `json:"last_invoice,omitempty"`
	// Fate is evKilled, evCompleted, evNothing, or what went wrong.
	Fate     string    `json:"fate"`
	KilledAt time.Time `json:"killed_at,omitzero"`
}

// handover is one kill and the acquire that followed it.
type handover struct {
	From      string        `json:"from"`
	FromToken fence.Token   `json:"from_token"`
	KilledAt  time.Time     `json:"killed_at"`
	LeaseLeft time.Duration `json:"lease_left_ns"` // what the store kept of the dead holder's grant right after the kill
	To        string        `json:"to,omitempty"`
	ToToken   fence.Token   `json:"to_token,omitempty"`
	Acquired  time.Time     `json:"acquired_at,omitzero"`
	Took      time.Duration `json:"took_ns"`
}

// evKilled is the fate of a holder the orchestrator killed.
const evKilled = "killed"

// fateText describes a holder's fate for the summary table.
func fateText(fate string) string {
	switch fate {
	case evKilled:
		return "killed with SIGKILL"
	case evCompleted:
		return "completed the batch, released"
	case evNothing:
		return "found the batch complete, released"
	case "":
		return "(no end reported)"
	}
	return fate
}

type check struct {
	OK   bool   `json:"ok"`
	Text string `json:"text"`
}

// play starts the replicas, kills holders mid-batch, and follows the run
// until every replica has exited.
func (sc *scenario) play(ctx context.Context, tl *demo.Timeline, o options) (*summary, error) {
	sum := &summary{Period: o.period, Customers: o.customers, Replicas: o.replicas, LeaseStore: o.leaseStore,
		Rows:      rowsInfo{Store: o.rowStore, Schema: sc.cfg.Schema, DynamoDB: sc.dynamo},
		TTLMillis: o.ttl.Milliseconds(), RenewMillis: o.renewInterval().Milliseconds()}
	budget := time.Duration(o.customers)*(o.invoiceTime+50*time.Millisecond)*2 + time.Duration(o.kills+2)*3*o.ttl + 60*time.Second
	events := make(chan event, 1024)
	exits := make(chan exit, o.replicas)
	procs := make(map[string]*proc, o.replicas)
	defer func() { // never leave a replica behind, and wait for each
		left := 0
		for _, p := range procs {
			if !p.exited {
				_ = p.cmd.Process.Kill()
				left++
			}
		}
		for left > 0 {
			select {
			case <-events: // the rest of their output, so that they can end
			case x := <-exits:
				procs[x.name].exited = true
				left--
			}
		}
	}()
	for i := range o.replicas {
		name := fmt.Sprintf("replica-%d", i+1)
		p, err := sc.startReplica(name, budget, events, exits)
		if err != nil {
			return nil, fmt.Errorf("starting %s: %w", name, err)
		}
		procs[name] = p
		tl.Say(time.Now(), "orchestrator", "started %s (pid %d)", name, p.cmd.Process.Pid)
	}

	var (
		killsLeft = o.kills
		pending   *handover // a kill waiting for the next acquire
		current   = map[string]*holder{}
	)
	handle := func(e event) {
		sum.Events = append(sum.Events, e)
		tl.Say(e.At, e.Replica, "%s", e.Text)
		h := current[e.Replica]
		switch e.Kind {
		case evAcquired:
			h = &holder{Replica: e.Replica, Pid: e.Pid, Token: e.Token, AcquiredAt: e.At, ResumedAt: -1}
			current[e.Replica] = h
			sum.Holders = append(sum.Holders, h)
			if pending != nil {
				pending.To, pending.ToToken, pending.Acquired = e.Replica, e.Token, e.At
				pending.Took = e.At.Sub(pending.KilledAt)
				tl.Say(e.At, "orchestrator", "handover: %s took over %v after %s was killed (TTL %v)",
					e.Replica, pending.Took.Round(time.Millisecond), pending.From, o.ttl)
				pending = nil
			}
		case evResume:
			if h != nil {
				h.ResumedAt = e.Next
			}
		case evInvoice:
			if h == nil {
				return
			}
			h.Reported++
			p := procs[e.Replica]
			if killsLeft > 0 && h.Reported == o.killAfter && !p.killed {
				killsLeft--
				err := p.cmd.Process.Signal(syscall.SIGKILL)
				killedAt := time.Now()
				if err != nil {
					sum.problems = append(sum.problems, fmt.Sprintf("could not kill %s: %v", e.Replica, err))
					return
				}
				p.killed = true
				h.Fate, h.KilledAt = evKilled, killedAt
				left, _ := sc.LeaseLeft(ctx, o.ttl)
				pending = &handover{From: e.Replica, FromToken: h.Token, KilledAt: killedAt, LeaseLeft: left}
				sum.Handovers = append(sum.Handovers, pending)
				tl.Say(killedAt, "orchestrator", "KILLED %s (pid %d) with SIGKILL after its invoice #%d; its lease is not released and has %s left in %s",
					e.Replica, p.cmd.Process.Pid, e.Number, leftText(sc.LeaseStore, pending.LeaseLeft), storeName(sc.LeaseStore))
			}
		case evCompleted:
			if h != nil {
				h.Fate = evCompleted
			}
		case evNothing:
			if h != nil {
				h.Fate = evNothing
			}
		case evStopped, evFailed:
			if h != nil {
				h.Fate = e.Text
			}
			sum.problems = append(sum.problems, fmt.Sprintf("%s: %s", e.Replica, e.Text))
		}
	}

	overall := time.NewTimer(budget)
	defer overall.Stop()
	for running := o.replicas; running > 0; {
		select {
		case e := <-events:
			handle(e)
		case x := <-exits:
			running--
			p := procs[x.name]
			p.exited = true
			switch {
			case p.killed:
				tl.Say(time.Now(), "orchestrator", "%s is gone (%v)", x.name, x.err)
			case x.err != nil:
				sum.problems = append(sum.problems, fmt.Sprintf("%s exited with %v", x.name, x.err))
				tl.Say(time.Now(), "orchestrator", "%s exited with %v", x.name, x.err)
			default:
				tl.Say(time.Now(), "orchestrator", "%s exited normally", x.name)
			}
		case <-overall.C:
			return nil, fmt.Errorf("timed out after %v", budget)
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	// A replica's events are all queued before its exit is: take the rest.
	for {
		select {
		case e := <-events:
			handle(e)
			continue
		default:
		}
		break
	}
	if pending != nil {
		pending.Took = -1
		sum.problems = append(sum.problems, fmt.Sprintf("nobody acquired the lease after %s was killed", pending.From))
	}
	return sum, nil
}

// leftText says how long a grant had left, as LeaseLeft read it: etcd
// counts whole seconds, truncated, and ZooKeeper only knows the session
// timeout.
func leftText(leaseStore string, left time.Duration) string {
	switch leaseStore {
	case demo.LeaseEtcd:
		if left == 0 {
			return "under 1s"
		}
		return fmt.Sprintf("%v to %v", left, left+time.Second)
	case demo.LeaseZooKeeper, demo.LeaseDynamoDB:
		if left > 0 {
			return fmt.Sprintf("up to %v", left)
		}
	}
	return left.Round(time.Millisecond).String()
}

// storeName names where the lease lives, for the output.
func storeName(leaseStore string) string { return demo.LeaseStore{Kind: leaseStore}.Name() }
