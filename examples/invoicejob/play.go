package main

import (
	"context"
	"fmt"
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

// follower follows the replicas for play: it prints their events,
// records who held the lease with which token, and kills holders.
type follower struct {
	sc       *scenario
	ctx      context.Context
	tl       *demo.Timeline
	o        options
	replicas *demo.Group[event]
	sum      *summary

	killsLeft int
	pending   *handover          // a kill waiting for the next acquire
	current   map[string]*holder // each replica's latest grant
}

// event takes in one of the replicas' events.
func (f *follower) event(e event) {
	f.sum.Events = append(f.sum.Events, e)
	f.tl.Say(e.At, e.Replica, "%s", e.Text)
	h := f.current[e.Replica]
	switch e.Kind {
	case evAcquired:
		f.acquired(e)
	case evResume:
		if h != nil {
			h.ResumedAt = e.Next
		}
	case evInvoice:
		if h != nil {
			h.Reported++
			f.invoice(e, h)
		}
	case evCompleted, evNothing:
		if h != nil {
			h.Fate = e.Kind
		}
	case evStopped, evFailed:
		if h != nil {
			h.Fate = e.Text
		}
		f.sum.problems = append(f.sum.problems, fmt.Sprintf("%s: %s", e.Replica, e.Text))
	}
}

// acquired records a grant of the lease, and the handover it completes.
func (f *follower) acquired(e event) {
	h := &holder{Replica: e.Replica, Pid: e.Pid, Token: e.Token, AcquiredAt: e.At, ResumedAt: -1}
	f.current[e.Replica] = h
	f.sum.Holders = append(f.sum.Holders, h)
	if p := f.pending; p != nil {
		p.To, p.ToToken, p.Acquired = e.Replica, e.Token, e.At
		p.Took = e.At.Sub(p.KilledAt)
		f.tl.Say(e.At, "orchestrator", "handover: %s took over %v after %s was killed (TTL %v)",
			e.Replica, p.Took.Round(time.Millisecond), p.From, f.o.TTL)
		f.pending = nil
	}
}

// exit takes in a replica's exit.
func (f *follower) exit(x demo.Exit) {
	switch p := f.replicas.Exited(x); {
	case p.Killed:
		f.tl.Say(time.Now(), "orchestrator", "%s is gone (%v)", x.Name, x.Err)
	case x.Err != nil:
		f.sum.problems = append(f.sum.problems, fmt.Sprintf("%s exited with %v", x.Name, x.Err))
		f.tl.Say(time.Now(), "orchestrator", "%s exited with %v", x.Name, x.Err)
	default:
		f.tl.Say(time.Now(), "orchestrator", "%s exited normally", x.Name)
	}
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
