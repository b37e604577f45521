package main

import (
	"syscall"
	"testing"

	"github.com/fencekit/fencekit/internal/rig/demotest"
)

// A long pause keeps the run in its most fragile state while the test ends
// it: the holder stopped with SIGSTOP, the other replicas running or
// waiting, the MariaDB database and the lease's keys in place.
var frozenRun = []string{"--ttl", "1s", "--pause", "60s", "--orders", "6", "--order-time", "20ms"}

// TestSignalLeavesNothing ends the program with SIGTERM while the holder
// is frozen: it must clean up by itself (the replicas, the database, the
// keys, its ledger) and exit 2, the run not completed.
func TestSignalLeavesNothing(t *testing.T) {
	env := demotest.NewEnv(t)
	p, entries, children := env.StartUntil(t, "FROZE", frozenRun...)
	if len(children) < 3 {
		t.Fatalf("children %v; want the three replicas", children)
	}
	env.ExpectSignalledClean(t, p, syscall.SIGTERM, children, entries)
}

// TestKilledRunIsSweptByTheNext kills the program with SIGKILL while the
// holder is frozen: it can clean nothing, but its replicas must die with
// it (their parent-death signal), and the next run must drop the MariaDB
// database and delete the keys the killed one left.
func TestKilledRunIsSweptByTheNext(t *testing.T) {
	env := demotest.NewEnv(t)
	p, entries, children := env.StartUntil(t, "FROZE", frozenRun...)
	left := env.Kill(t, p, children, entries)
	if len(left.Ledgers) != 1 || len(left.MySQLDatabases) != 1 || len(left.RedisKeys) == 0 {
		t.Fatalf("after SIGKILL: %+v; want the ledger, the database and the lease's keys left for the sweep", left)
	}
	env.ExpectSwept(t, "settleorders", entries, "--ttl", "300ms", "--pause", "600ms", "--orders", "4", "--order-time", "10ms")
}
