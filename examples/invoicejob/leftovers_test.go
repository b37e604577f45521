package main

import (
	"syscall"
	"testing"

	"github.com/fencekit/fencekit/internal/rig/demotest"
)

// A batch long enough to be ended in its middle.
var longBatch = []string{"--ttl", "500ms", "--replicas", "3", "--customers", "400", "--invoice-time", "50ms", "--kills", "0"}

// TestSignalLeavesNothing ends the job mid-batch with SIGHUP and SIGTERM:
// it must clean up by itself, and every replica must be gone.
func TestSignalLeavesNothing(t *testing.T) {
	for _, sig := range []syscall.Signal{syscall.SIGHUP, syscall.SIGTERM} {
		t.Run(sig.String(), func(t *testing.T) {
			env := demotest.NewEnv(t)
			p, entries, children := env.StartUntil(t, "invoice #3 for", longBatch...)
			if len(children) != 3 {
				t.Fatalf("children %v; want the 3 replicas", children)
			}
			env.ExpectSignalledClean(t, p, sig, children, entries)
		})
	}
}

// TestKilledRunIsSweptByTheNext kills the job with SIGKILL mid-batch: every
// replica must die with it, and the next run must remove the schema and
// the lease's keys (and, with its rows in DynamoDB, the run's DynamoDB
// table) before its own.
func TestKilledRunIsSweptByTheNext(t *testing.T) {
	for _, tc := range []struct {
		name string
		args []string
	}{
		{"postgres rows", nil},
		{"dynamodb rows", []string{"--row-store", "dynamodb"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			env := demotest.NewEnv(t)
			p, entries, children := env.StartUntil(t, "invoice #3 for", append(tc.args, longBatch...)...)
			left := env.Kill(t, p, children, entries)
			if len(left.Ledgers) != 1 || len(left.Schemas) != 1 || len(left.DynamoTables) != len(tc.args)/2 {
				t.Fatalf("after SIGKILL: %+v; want the ledger, the schema and %d DynamoDB table(s) left for the sweep", left, len(tc.args)/2)
			}
			env.ExpectSwept(t, "invoicejob", entries, "--ttl", "300ms", "--replicas", "2", "--customers", "4", "--invoice-time", "10ms", "--kills", "0")
		})
	}
}
