package consensus

import (
	"fmt"
	"os"
	"strings"
	"testing"

	"go.uber.org/goleak"

	"github.com/fencekit/fencekit/examples/services"
	"github.com/fencekit/fencekit/integration/internal/itest"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(mainM{m},
		// A member stopped with etcdtest.Member.Kill (EtcdServer.HardStop,
		// the only way to stop raft at once in-process) can leave its peer
		// version handler blocked forever on the closed backend's lock:
		// the embedded server's goroutine, not the backend's. (SERVICES.md:
		// "HardStop leaks goroutines".)
		goleak.IgnoreAnyFunction("go.etcd.io/etcd/server/v3/etcdserver/api/etcdhttp.newPeerHandler.versionHandler.func1"),
		// A server started here (versitygw, when no S3 is given) is forked
		// from one goroutine locked to its thread for the life of the
		// process, so that the child's parent-death signal follows the
		// process, not a thread.
		goleak.IgnoreTopFunction("github.com/fencekit/fencekit/examples/internal/leftover.startSpawner.func1"),
	)
}

// mainM builds the holder program and finds the services before the tests
// run; goleak checks for leaked goroutines once it returns.
type mainM struct{ m *testing.M }

func (w mainM) Run() int {
	_, cleanup, err := itest.Setup("consensus", services.Config{NoRedis: true}, "../internal/cmd/holder")
	if err != nil {
		fmt.Fprintf(os.Stderr, "consensus: %v\n", err)
		return 1
	}
	defer cleanup()
	return w.m.Run()
}

// testName is t.Name() usable in a key, a znode or a proxy name.
func testName(t testing.TB) string {
	return strings.NewReplacer("/", "_", " ", "_", "=", "_", ":", "_", ".", "_").Replace(t.Name())
}
