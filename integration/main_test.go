package integration

import (
	"testing"

	"github.com/fencekit/fencekit/internal/rig/itest"
	"github.com/fencekit/fencekit/internal/rig/services"
)

// binDir holds the holder program (internal/rig/cmd/holder), built once by
// TestMain, and the stale-writer demo, built by the first test that runs
// it.
var binDir string

func TestMain(m *testing.M) {
	itest.Main(m, "integration", services.Config{}, []string{itest.HolderPkg}, &binDir)
}
