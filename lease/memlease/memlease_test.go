package memlease_test

import (
	"testing"

	"go.uber.org/goleak"

	"github.com/fencekit/fencekit/lease/driver"
	"github.com/fencekit/fencekit/lease/leasetest"
	"github.com/fencekit/fencekit/lease/memlease"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// The in-memory backend passes the conformance suite like every backend.
func TestConformance(t *testing.T) {
	leasetest.Run(t, leasetest.Config{
		NewStore: func(t *testing.T) func() driver.Backend {
			b := memlease.New()
			return func() driver.Backend { return b }
		},
		LoseData: func(t *testing.T, b driver.Backend) { b.(*memlease.Backend).Forget() },
		Lacks: map[leasetest.Capability]string{
			leasetest.PushLoss: "the memory backend has no sessions: its grants end only by expiry or release",
		},
	})
}
