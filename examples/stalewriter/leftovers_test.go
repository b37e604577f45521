package main

import (
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/fencekit/fencekit/internal/rig/demotest"
	"github.com/fencekit/fencekit/internal/rig/leftover"
	"github.com/fencekit/fencekit/internal/testkit/testenv"
)

// TestMain lets the test binary stand in for the program: run() starts
// workers as os.Executable() with configVar set, and the leftover tests
// start the program itself with demotest.RunMainVar set.
func TestMain(m *testing.M) { demotest.Main(m, configVar, runWorker, run) }

// A long freeze keeps the run in its most fragile state while the test
// ends it: worker A stopped with SIGSTOP, worker B and versitygw running,
// the schema, keys and object in place.
var frozenRun = []string{"--ttl", "2s", "--pause", "60s"}

// TestSignalLeavesNothing ends the program with each signal a terminal or a
// service manager sends, mid-run: it must clean up by itself, and every
// process it started must be gone.
func TestSignalLeavesNothing(t *testing.T) {
	for _, sig := range []syscall.Signal{syscall.SIGHUP, syscall.SIGTERM, syscall.SIGINT} {
		t.Run(sig.String(), func(t *testing.T) {
			env := demotest.NewEnv(t)
			p, entries, children := env.StartUntil(t, "froze worker A", frozenRun...)
			if len(children) < 2 {
				t.Fatalf("children %v; want worker A and versitygw at least", children)
			}
			env.ExpectSignalledClean(t, p, sig, children, entries)
		})
	}
}

// TestClosedStdoutLeavesNothing closes the program's stdout mid-run, as
// `stalewriter | head` does when head exits: the next write must end the
// run and clean up, not kill the program with SIGPIPE.
func TestClosedStdoutLeavesNothing(t *testing.T) {
	env := demotest.NewEnv(t)
	p, entries, children := env.StartUntil(t, "froze worker A", "--ttl", "300ms", "--pause", "30s")
	p.CloseStdout() // B's acquire, 300 ms on, is the next line written
	env.ExpectStoppedClean(t, p, children, entries)
	if !strings.Contains(p.Stderr.String(), "output pipe closed") {
		t.Errorf("stderr does not say why the run ended:\n%s", p.Stderr)
	}
}

// TestKilledRunIsSweptByTheNext kills the program with SIGKILL mid-run: it
// can clean nothing, but every process it started must die with it (their
// parent-death signal), and the next run must remove the rest (the schema,
// the Redis keys, the object, versitygw's directory) before its own.
func TestKilledRunIsSweptByTheNext(t *testing.T) {
	env := demotest.NewEnv(t)
	p, entries, children := env.StartUntil(t, "froze worker A", frozenRun...)
	left := env.Kill(t, p, children, entries)
	if len(left.Ledgers) != 1 || len(left.Schemas) != 1 || len(left.RedisKeys) == 0 || len(left.TempEntries) == 0 {
		t.Fatalf("after SIGKILL: %+v; want the ledger, the schema, the lease's keys and versitygw's directory left for the sweep", left)
	}

	env.ExpectSwept(t, "stalewriter", entries, "--ttl", "300ms", "--pause", "800ms")
}

// TestKeepKeepsWhatItSays: with --keep the schema, the object (in the data
// directory of the versitygw the demo started) and the lease's keys are
// there after the run, where the output says, and the ledger does not
// hand them to the next run's sweep.
func TestKeepKeepsWhatItSays(t *testing.T) {
	env := demotest.NewEnv(t)
	p := env.Start(t, "--keep", "--ttl", "300ms", "--pause", "800ms")
	var schema, dir, object string
	var out []string
	for line := range p.Lines {
		out = append(out, line)
		f := strings.Fields(line)
		switch {
		case len(f) >= 2 && f[0] == "schema":
			schema = f[1]
		case len(f) >= 2 && f[0] == "object":
			object = strings.TrimPrefix(f[1], "s3://") // bucket/key
		case strings.HasPrefix(line, "  the data of a server this demo started"):
			dir = strings.TrimSuffix(strings.Fields(strings.SplitN(line, ": ", 2)[1])[0], ";")
		}
	}
	if ws := p.Wait(t); ws.ExitStatus() != 0 {
		t.Fatalf("exit %v; stderr:\n%s", ws, p.Stderr)
	}
	if schema == "" || dir == "" || object == "" {
		t.Fatalf("the output names no kept schema, object or data directory:\n%s", strings.Join(out, "\n"))
	}
	id := strings.TrimPrefix(schema, "stalewriter_")
	entries := []leftover.Entry{
		{Kind: leftover.KindSchema, Name: schema},
		{Kind: leftover.KindRedisKeys, URL: testenv.RedisURL(), Keys: []string{"fencekit:{stalewriter-" + id + "}:token"}},
	}
	t.Cleanup(func() { // what --keep kept is the user's to remove; here, the test's
		_ = os.RemoveAll(dir)
		demotest.DropSchema(t, schema)
		demotest.DeleteKeys(t, entries[1])
	})
	left := env.Look(t, entries)
	if len(left.Schemas) != 1 || len(left.RedisKeys) != 1 {
		t.Errorf("after --keep: %+v; want the schema and the token key", left)
	}
	if len(left.Ledgers) != 0 {
		t.Errorf("after --keep the ledger still lists things for the next sweep: %v", left.Ledgers)
	}
	// versitygw's posix backend keeps an object as a file: root/bucket/key.
	obj := filepath.Join(dir, "root", filepath.FromSlash(object))
	if _, err := os.Stat(obj); err != nil {
		t.Errorf("the kept object: %v", err)
	}
}
