package reliability

import (
	"fmt"
	"os"
	"testing"

	"go.uber.org/goleak"

	"github.com/fencekit/fencekit/examples/services"
	"github.com/fencekit/fencekit/integration/internal/itest"
	"github.com/fencekit/fencekit/integration/internal/toxi"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(mainM{m}, append(toxi.LeakIgnores(),
		// A server started here (versitygw, when no S3 is given) is forked
		// from one goroutine locked to its thread for the life of the
		// process, so that the child's parent-death signal follows the
		// process, not a thread.
		goleak.IgnoreTopFunction("github.com/fencekit/fencekit/examples/internal/leftover.startSpawner.func1"),
	)...)
}

// mainM builds the helper programs and finds the services before the tests
// run; goleak checks for leaked goroutines once it returns.
type mainM struct{ m *testing.M }

func (w mainM) Run() int {
	_, cleanup, err := itest.Setup("reliability", services.Config{}, "../internal/cmd/holder")
	if err != nil {
		fmt.Fprintf(os.Stderr, "reliability: %v\n", err)
		return 1
	}
	defer cleanup()
	return w.m.Run()
}
