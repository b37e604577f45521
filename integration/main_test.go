package integration

import (
	"fmt"
	"os"
	"testing"

	"go.uber.org/goleak"

	"github.com/fencekit/fencekit/internal/rig/itest"
	"github.com/fencekit/fencekit/internal/rig/services"
)

// binDir holds the holder program (internal/rig/cmd/holder), built once by
// TestMain, and the stale-writer demo, built by the first test that runs
// it.
var binDir string

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(mainM{m},
		// A server started here (versitygw, when no S3 is given) is forked
		// from one goroutine locked to its thread for the life of the
		// process, so that the child's parent-death signal follows the
		// process, not a thread.
		goleak.IgnoreTopFunction("github.com/fencekit/fencekit/internal/rig/leftover.startSpawner.func1"),
	)
}

// mainM builds the helper programs before the tests run and removes them
// after; goleak checks for leaked goroutines once it returns.
type mainM struct{ m *testing.M }

func (w mainM) Run() int {
	dir, cleanup, err := itest.Setup("integration", services.Config{}, "github.com/fencekit/fencekit/internal/rig/cmd/holder")
	if err != nil {
		fmt.Fprintf(os.Stderr, "integration: %v\n", err)
		return 1
	}
	defer cleanup()
	binDir = dir
	return w.m.Run()
}
