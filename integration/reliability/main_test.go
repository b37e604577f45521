package reliability

import (
	"testing"

	"go.uber.org/goleak"

	"github.com/fencekit/fencekit/internal/rig/itest"
	"github.com/fencekit/fencekit/internal/rig/services"
)

func TestMain(m *testing.M) {
	itest.Main(m, "reliability", services.Config{}, []string{itest.HolderPkg}, nil,
		// toxiproxy (a test tool, in-process here) leaves the goroutine of
		// a link's no-op stage blocked when a toxic is removed from a link
		// whose connection had closed meanwhile; fencekit's own goroutines
		// are all checked.
		goleak.IgnoreTopFunction("github.com/Shopify/toxiproxy/v2/toxics.(*NoopToxic).Pipe"),
		// The same race seen from the link's reader: it had read a chunk
		// from the client and blocks forever sending it to the stage that
		// was removed (CI, 2026-12-04, after the MariaDB history check).
		goleak.IgnoreTopFunction("github.com/Shopify/toxiproxy/v2/stream.(*ChanWriter).Write"),
	)
}
