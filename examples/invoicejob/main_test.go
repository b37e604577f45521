package main

import (
	"bytes"
	"cmp"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/fencekit/fencekit/internal/rig/demotest"
)

// TestMain lets the test binary stand in for the program: run() starts
// replicas as os.Executable() with configVar set, and here they run the
// replica's body instead of the tests.
func TestMain(m *testing.M) { demotest.Main(m, configVar, runReplica, run) }

// TestInvoiceJob runs the whole scenario against the machine's Redis and
// PostgreSQL, with real replica processes and real kills, and checks the
// verdict and the summary.
func TestInvoiceJob(t *testing.T) {
	for _, tc := range []struct {
		name string
		args []string
		// kills is how many holders must have been killed.
		kills, replicas int
		// ttl is the leases' TTL (default 1s: with 500ms, a replica whose
		// acquire reply was held up about 0.4 s by a loaded machine got a
		// grant with 17 ms of validity left and lost it before its first
		// write, which the scenario counts as a failure; seen at load 10
		// in a CI run); lag is how late after
		// its TTL the store ends a dead holder's grant: etcd revokes
		// expired leases every 500 ms, the ZooKeeper server the program
		// starts ends expired sessions on its tick of 100 ms.
		ttl, lag time.Duration
	}{
		{"one kill", []string{"--replicas", "3", "--customers", "20", "--kill-after", "6", "--kills", "1"}, 1, 3, 0, 0},
		{"two kills", []string{"--replicas", "3", "--customers", "20", "--kill-after", "4", "--kills", "2"}, 2, 3, 0, 0},
		{"no kill", []string{"--replicas", "2", "--customers", "8", "--kills", "0"}, 0, 2, 0, 0},
		// Leases in PostgreSQL: no Redis involved.
		{"one kill, postgres leases", []string{"--lease-store", "postgres", "--replicas", "3", "--customers", "20", "--kill-after", "6", "--kills", "1"}, 1, 3, 0, 0},
		{"one kill, postgres session leases", []string{"--lease-store", "postgres-session", "--replicas", "3", "--customers", "20", "--kill-after", "6", "--kills", "1"}, 1, 3, 0, 0},
		// Leases in etcd and ZooKeeper, servers the program starts itself.
		{"one kill, etcd leases", []string{"--lease-store", "etcd", "--replicas", "3", "--customers", "20", "--kill-after", "6", "--kills", "1"}, 1, 3, time.Second, 500 * time.Millisecond},
		// Leases in DynamoDB (FENCE_DYNAMODB_ENDPOINT): a waiter takes a dead
		// holder's lease a TTL after its next poll (PollInterval TTL/2) saw
		// the last renewal.
		{"one kill, dynamodb leases", []string{"--lease-store", "dynamodb", "--replicas", "3", "--customers", "20", "--kill-after", "6", "--kills", "1"}, 1, 3, 0, 250 * time.Millisecond},
		// Leases and rows in DynamoDB: each invoice is one dynamoguard
		// transaction.
		{"two kills, dynamodb leases and rows", []string{"--lease-store", "dynamodb", "--row-store", "dynamodb", "--replicas", "3", "--customers", "20", "--kill-after", "4", "--kills", "2"}, 2, 3, 0, 250 * time.Millisecond},
		{"two kills, zookeeper leases", []string{"--lease-store", "zookeeper", "--replicas", "3", "--customers", "20", "--kill-after", "4", "--kills", "2"}, 2, 3, 0, 100 * time.Millisecond},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ttl := cmp.Or(tc.ttl, time.Second)
			sum, out := runJob(t, append([]string{"--ttl", ttl.String(), "--invoice-time", "20ms"}, tc.args...))
			checkJob(t, sum, tc.kills, tc.replicas, ttl+ttl/3+loadAllowance+tc.lag)
			if t.Failed() {
				t.Logf("output:\n%s", out)
			}
		})
	}
}

// runJob runs the program with args and returns its --json summary and its
// output; it fails the test unless the program exits 0 with a safe
// verdict.
func runJob(t *testing.T, args []string) (summary, string) {
	t.Helper()
	js := filepath.Join(t.TempDir(), "summary.json")
	var out, errOut bytes.Buffer
	code := run(append(args, "--json", js), &out, &errOut)
	if code != 0 {
		t.Fatalf("exit %d, want 0; output:\n%s\nstderr:\n%s", code, out.String(), errOut.String())
	}
	b, err := os.ReadFile(js)
	if err != nil {
		t.Fatal(err)
	}
	var sum summary
	if err := json.Unmarshal(b, &sum); err != nil {
		t.Fatal(err)
	}
	if !sum.OK || !strings.HasPrefix(sum.Verdict, "VERDICT: SAFE") {
		t.Fatalf("verdict %q, ok %v; output:\n%s", sum.Verdict, sum.OK, out.String())
	}
	return sum, out.String()
}

// checkJob checks a run's summary: every invoice written once, kills
// handovers each within bound, every replica a holder, every check passed,
// and every holder but the newest refused as stale when its write was
// replayed.
func checkJob(t *testing.T, sum summary, kills, replicas int, bound time.Duration) {
	t.Helper()
	if sum.Invoices != sum.Customers {
		t.Errorf("%d invoices in the database for %d customers", sum.Invoices, sum.Customers)
	}
	if len(sum.Handovers) != kills {
		t.Errorf("%d handovers, want %d", len(sum.Handovers), kills)
	}
	if len(sum.Holders) != replicas {
		t.Errorf("%d holders, want every one of the %d replicas", len(sum.Holders), replicas)
	}
	for _, h := range sum.Handovers {
		if h.Took <= 0 || h.Took > bound {
			t.Errorf("handover from %s took %v, want within %v", h.From, h.Took, bound)
		}
	}
	for _, c := range sum.Checks {
		if !c.OK {
			t.Errorf("check failed: %s", c.Text)
		}
	}
	// Every holder but the newest had a write replayed, and the row store
	// refused each as stale, naming a newer token.
	if len(sum.Replays) != len(sum.Holders)-1 {
		t.Errorf("%d stale writes replayed, want %d", len(sum.Replays), len(sum.Holders)-1)
	}
	for _, r := range sum.Replays {
		if !r.Stale || r.Current <= r.Token {
			t.Errorf("the replayed write of %s with token %d: stale %v, store holds %d (%s)", r.Replica, r.Token, r.Stale, r.Current, r.Error)
		}
	}
}

// TestFlags checks the flags' bounds, that every problem is reported at
// once, and that usage and errors go to stderr while --help goes to stdout.
func TestFlags(t *testing.T) {
	demotest.CheckFlags(t, run, []demotest.FlagCase{
		{[]string{"--help"}, 0, "Usage: go run ./examples/invoicejob", ""},
		{[]string{"--ttl", "50ms"}, 2, "", "--ttl 50ms"},
		{[]string{"--ttl", "1h"}, 2, "", "--ttl 1h0m0s: must be a whole number of milliseconds, from 100ms to 1m0s"},
		{[]string{"--replicas", "1"}, 2, "", "--replicas 1"},
		{[]string{"--replicas", "21"}, 2, "", "--replicas 21: must be from 2 (for a takeover) to 20"},
		{[]string{"--kills", "3"}, 2, "", "--kills 3"},
		{[]string{"--customers", "10", "--kill-after", "10"}, 2, "", "must be less than --customers 10"},
		{[]string{"--invoice-time", "11s"}, 2, "", "--invoice-time 11s: must be from 0 to 10s"},
		{[]string{"--customers", "100000", "--invoice-time", "1s"}, 2, "", "--customers 100000 x --invoice-time 1s is 27h46m40s: must be at most 30m0s"},
		{[]string{"--ttl", "50ms", "--replicas", "0"}, 2, "", "--replicas 0"}, // every problem at once
		{[]string{"--lease-store", "etcd", "--ttl", "2500ms"}, 2, "", "--ttl 2.5s: etcd counts lease TTLs in whole seconds, from 1s"},
		{[]string{"--lease-store", "zk"}, 2, "", `--lease-store "zk": want redis, postgres, postgres-session, etcd, zookeeper or dynamodb`},
		{[]string{"--row-store", "mysql"}, 2, "", `--row-store "mysql": want postgres or dynamodb`},
		{[]string{"extra"}, 2, "", "unexpected arguments"},
		{[]string{"--nope"}, 2, "", "Usage: go run ./examples/invoicejob"},
	})
}
