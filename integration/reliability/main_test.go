package reliability

import (
	"testing"

	"github.com/fencekit/fencekit/internal/rig/itest"
	"github.com/fencekit/fencekit/internal/rig/services"
	"github.com/fencekit/fencekit/internal/rig/toxi"
)

func TestMain(m *testing.M) {
	itest.Main(m, "reliability", services.Config{}, []string{itest.HolderPkg}, nil, toxi.LeakIgnores()...)
}
