package zklease_test

import (
	"testing"
	"time"

	"github.com/fencekit/fencekit/internal/testkit/zktest"
	"github.com/fencekit/fencekit/lease"
	"github.com/fencekit/fencekit/lease/leasetest"
	"github.com/fencekit/fencekit/lease/zklease"
)

// conformanceSession is the session timeout of the conformance runs, and so
// their long TTL.
const conformanceSession = 6 * time.Second

// The whole conformance suite on a three-node ensemble started by the test;
// every backend is its own connection and session. It lacks no
// capability.
func TestConformance(t *testing.T) {
	ens := zktest.Start(t, 3, zktest.Config{})
	admin := adminConn(t, ens.Servers())
	leasetest.Run(t, leasetest.Config{
		NewStore: func(t *testing.T) func() lease.Backend {
			root := zktest.Root(t)
			return func() lease.Backend {
				return newBackend(t, ens.Servers(), zklease.WithRoot(root), zklease.WithSessionTimeout(conformanceSession))
			}
		},
		ShortTTL: 400 * time.Millisecond,
		LoseData: func(t *testing.T, b lease.Backend) {
			// An operator deletes the backend's whole tree, held nodes
			// included: parents are recreated, sequence numbers restart.
			if err := deleteTree(admin.Conn, b.(*zklease.Backend).Options().Root); err != nil {
				t.Fatalf("delete the tree: %v", err)
			}
		},
		EndSession: func(t *testing.T, b lease.Backend) { endSession(t, b.(*zklease.Backend)) },
	})
}
