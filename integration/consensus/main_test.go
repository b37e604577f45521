package consensus

import (
	"strings"
	"testing"

	"go.uber.org/goleak"

	"github.com/fencekit/fencekit/internal/rig/itest"
	"github.com/fencekit/fencekit/internal/rig/services"
)

func TestMain(m *testing.M) {
	itest.Main(m, "consensus", services.Config{NoRedis: true}, []string{itest.HolderPkg}, nil,
		// A member stopped with etcdtest.Member.Kill (EtcdServer.HardStop,
		// the only way to stop raft at once in-process) can leave its peer
		// version handler blocked forever on the closed backend's lock:
		// the embedded server's goroutine, not the backend's. (SERVICES.md:
		// "HardStop leaks goroutines".)
		goleak.IgnoreAnyFunction("go.etcd.io/etcd/server/v3/etcdserver/api/etcdhttp.newPeerHandler.versionHandler.func1"),
	)
}

// testName is t.Name() usable in a key, a znode or a proxy name.
func testName(t testing.TB) string {
	return strings.NewReplacer("/", "_", " ", "_", "=", "_", ":", "_", ".", "_").Replace(t.Name())
}
