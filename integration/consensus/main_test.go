package consensus

import (
	"strings"
	"testing"

	"github.com/fencekit/fencekit/internal/rig/itest"
	"github.com/fencekit/fencekit/internal/rig/services"
)

func TestMain(m *testing.M) {
	itest.Main(m, "consensus", services.Config{NoRedis: true}, []string{itest.HolderPkg}, nil)
}

// testName is t.Name() usable in a key, a znode or a proxy name.
func testName(t testing.TB) string {
	return strings.NewReplacer("/", "_", " ", "_", "=", "_", ":", "_", ".", "_").Replace(t.Name())
}
