package reliability

import (
	"fmt"
	"os"
	"testing"

	"go.uber.org/goleak"

	"github.com/fencekit/fencekit/internal/rig/itest"
	"github.com/fencekit/fencekit/internal/rig/services"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(mainM{m},
		// toxiproxy (a test tool, in-process here) leaves the goroutine of
		// a link's no-op stage blocked when a toxic is removed from a link
		// whose connection had closed meanwhile; fencekit's own goroutines
		// are all checked.
		goleak.IgnoreTopFunction("github.com/Shopify/toxiproxy/v2/toxics.(*NoopToxic).Pipe"),
		// The same race seen from the link's reader: it had read a chunk
		// from the client and blocks forever sending it to the stage that
		// was removed (CI, 2026-12-04, after the MariaDB history check).
		goleak.IgnoreTopFunction("github.com/Shopify/toxiproxy/v2/stream.(*ChanWriter).Write"),
		// A server started here (versitygw, when no S3 is given) is forked
		// from one goroutine locked to its thread for the life of the
		// process, so that the child's parent-death signal follows the
		// process, not a thread.
		goleak.IgnoreTopFunction("github.com/fencekit/fencekit/internal/rig/leftover.startSpawner.func1"),
	)
}

// mainM builds the helper programs and finds the services before the tests
// run; goleak checks for leaked goroutines once it returns.
type mainM struct{ m *testing.M }

func (w mainM) Run() int {
	_, cleanup, err := itest.Setup("reliability", services.Config{}, "github.com/fencekit/fencekit/internal/rig/cmd/holder")
	if err != nil {
		fmt.Fprintf(os.Stderr, "reliability: %v\n", err)
		return 1
	}
	defer cleanup()
	return w.m.Run()
}
