package main

import (
	"strings"
	"testing"

	"github.com/fencekit/fencekit/fence"
	"github.com/fencekit/fencekit/internal/rig/demotest"
)

// TestMain lets the test binary stand in for the program: run() starts
// replicas as os.Executable() with configVar set, and here they run the
// replica's body instead of the tests.
func TestMain(m *testing.M) { demotest.Main(m, configVar, runReplica, run) }

// TestFlags checks the flags' bounds, that every problem is reported at
// once, and that usage and errors go to stderr while --help goes to stdout.
func TestFlags(t *testing.T) {
	demotest.CheckFlags(t, run, []demotest.FlagCase{
		{[]string{"--help"}, 0, "Usage: go run ./examples/settleorders", ""},
		{[]string{"--ttl", "5ms"}, 2, "", "--ttl 5ms: must be a whole number of milliseconds, from 100ms to 1m0s"},
		{[]string{"--replicas", "1"}, 2, "", "--replicas 1: must be from 2"},
		{[]string{"--replicas", "1", "--orders", "1"}, 2, "", "--orders 1: must be from 2"},
		{[]string{"--orders", "5", "--freeze-after", "5"}, 2, "", "--freeze-after 5: must be from 1 to 4"},
		{[]string{"--pause", "11m"}, 2, "", "--pause 11m0s: must be positive and at most 10m0s"},
		{[]string{"--order-time", "-1s"}, 2, "", "--order-time -1s: must be from 0"},
		{[]string{"--period", ""}, 2, "", "--period: must not be empty"},
		{[]string{"extra"}, 2, "", "unexpected arguments"},
		{[]string{"--nope"}, 2, "", "flag provided but not defined"},
	})
}

// safeRun is the record of a run in which everything went right: replica-1
// frozen with token 10 after two orders of four, replica-2 (token 20) ran
// the rest and completed the night, replica-1's late writes all refused.
func safeRun() *summary {
	late := func(store string) write {
		return write{Store: store, Token: 10, Outcome: outcomeStale, Current: 20, Late: true}
	}
	ok := func(store string, tok fence.Token) write {
		return write{Store: store, Token: tok, Outcome: outcomeAccepted}
	}
	s := &summary{Job: job, Period: "2026-12-01", Orders: 4, Replicas: 2, Frozen: "replica-1", FrozenToken: 10}
	s.Events = []event{
		{Replica: "replica-1", Kind: evReady}, {Replica: "replica-2", Kind: evReady},
		{Replica: "replica-1", Kind: evStarted, Token: 10},
		{Replica: "replica-1", Kind: evOrder, Order: 1, Writes: []write{ok(storeInventory, 10), ok(storeMariaDB, 10)}},
		{Replica: "replica-1", Kind: evOrder, Order: 2, Writes: []write{ok(storeInventory, 10), ok(storeMariaDB, 10)}},
		{Replica: "replica-2", Kind: evStarted, Token: 20},
		{Replica: "replica-2", Kind: evOrder, Order: 3, Writes: []write{ok(storeInventory, 20), ok(storeMariaDB, 20)}},
		{Replica: "replica-2", Kind: evOrder, Order: 4, Writes: []write{ok(storeInventory, 20), ok(storeMariaDB, 20)}},
		{Replica: "replica-2", Kind: evOrder, Writes: []write{ok(storeMariaDB, 20)}},
		{Replica: "replica-2", Kind: evRunEnded, Ran: true},
		{Replica: "replica-1", Kind: evOrder, Order: 3, Writes: []write{late(storeInventory), late(storeMariaDB)}},
		{Replica: "replica-1", Kind: evOrder, Order: 4, Writes: []write{late(storeInventory), late(storeMariaDB)}},
		{Replica: "replica-1", Kind: evOrder, Writes: []write{late(storeMariaDB)}},
		{Replica: "replica-1", Kind: evRunEnded, Ran: true, Error: "order 3: refused as stale"},
	}
	s.Stores = stores{SettledBy: map[string]int{"replica-1": 2, "replica-2": 2}, Payouts: 4, PayoutCents: 100, OrderCents: 100,
		Runs: 1, LedgerDone: true, Released: map[int]release{1: {Replica: "replica-1"}, 2: {Replica: "replica-1"}, 3: {Replica: "replica-2"}, 4: {Replica: "replica-2"}}}
	m := func(running, lost float64, writes map[string]float64) metrics {
		return metrics{Answered: true, JobRunning: running, Lost: lost, Writes: writes}
	}
	s.Samples = []sample{
		{Kind: sampleBeforeFreeze, Replicas: map[string]metrics{"replica-1": m(1, 0, nil), "replica-2": m(0, 0, nil)}},
		{Kind: sampleFrozen, Replicas: map[string]metrics{"replica-1": {Error: "no answer"}, "replica-2": m(1, 0, nil)}},
		{Kind: sampleAfterResume, Replicas: map[string]metrics{"replica-1": m(0, 1, nil), "replica-2": m(0, 0, nil)}},
		{Kind: sampleFinal, Replicas: map[string]metrics{"replica-1": m(0, 1, map[string]float64{"dbguard stale": 3, "fencehttp stale": 2}), "replica-2": m(0, 0, nil)}},
	}
	s.InventoryMetrics = metrics{Answered: true, Writes: map[string]float64{"fencehttp stale": 2}}
	return s
}

// The verdict passes a run in which everything went right, and fails each
// way a run can go wrong: a late write accepted, an effect twice, the
// night run twice, a job gauge that stayed up after the lease ended.
func TestVerdict(t *testing.T) {
	s := safeRun()
	s.judge()
	if !s.OK {
		for _, c := range s.Checks {
			t.Logf("ok=%v %s", c.OK, c.Text)
		}
		t.Fatalf("a safe run judged %q", s.Verdict)
	}
	for _, tc := range []struct {
		name  string
		spoil func(*summary)
		want  string // in the failed check's text
	}{
		{"a late write accepted", func(s *summary) {
			e := &s.Events[len(s.Events)-2]
			e.Writes[0] = write{Store: storeMariaDB, Token: 10, Outcome: outcomeAccepted, Late: true}
		}, "every late write refused as stale: 4 of 5"},
		{"a payout twice", func(s *summary) { s.Stores.Payouts, s.Stores.NotPaidOnce = 5, []int{3} }, "orders not paid once: [3]"},
		{"a release missing", func(s *summary) { delete(s.Stores.Released, 4) }, "3 released"},
		{"the night run twice", func(s *summary) { s.Stores.Runs = 2 }, "2 run record(s)"},
		{"a second replica completed the run", func(s *summary) {
			s.Events[len(s.Events)-1] = event{Replica: "replica-1", Kind: evRunEnded, Ran: true}
		}, "the night's run completed once"},
		{"the job gauge up after the loss", func(s *summary) {
			s.Samples[2].Replicas["replica-1"] = metrics{Answered: true, JobRunning: 1, Lost: 1}
		}, "fencekit_job_running 1"},
		{"refusals not counted", func(s *summary) {
			s.Samples[3].Replicas["replica-1"].Writes["dbguard stale"] = 0
		}, "0 stale dbguard writes"},
		{"no late write to show", func(s *summary) { s.Events = s.Events[:10] }, "every late write refused as stale: 0 of 0"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := safeRun()
			tc.spoil(s)
			s.judge()
			failed := ""
			for _, c := range s.Checks {
				if !c.OK {
					failed += c.Text + "\n"
				}
			}
			if s.OK || !strings.Contains(failed, tc.want) {
				t.Fatalf("ok=%v, failed checks:\n%s\nwant one with %q", s.OK, failed, tc.want)
			}
		})
	}
}
