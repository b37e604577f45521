package etcdlease_test

import (
	"testing"
	"time"

	"github.com/fencekit/fencekit/lease"
	"github.com/fencekit/fencekit/lease/etcdlease"
	"github.com/fencekit/fencekit/lease/leasetest"
)

// The conformance suite on a three-member cluster, nothing skipped. Each
// backend the suite connects has a client of its own, talking to one
// member, the members in turn, so that contention crosses members. The
// data loss wipes every member's data directory and starts the cluster
// again from nothing (revisions restart at 1); a session the store ends is
// an operator revoking the backend's etcd leases.
func TestConformance(t *testing.T) {
	cl := cluster(t)
	admin := cl.Client()
	leasetest.Run(t, leasetest.Config{
		// Twice the servers' minimum: the suite renews by hand between
		// other requests, and on a loaded machine one second leaves no
		// room for a slow round of them.
		ShortTTL: 2 * time.Second,
		NewStore: func(t *testing.T) func() lease.Backend {
			p := prefix(t)
			next := 0
			return func() lease.Backend {
				ep := cl.Endpoints()[next%len(cl.Members)]
				next++
				return newBackend(t, cl.Client(ep), p)
			}
		},
		LoseData: func(t *testing.T, _ lease.Backend) { cl.WipeAll() },
		EndSession: func(t *testing.T, b lease.Backend) {
			if n := revokeLeasesUnder(t, admin, b.(*etcdlease.Backend).Options().Prefix); n == 0 {
				t.Fatal("EndSession: the backend holds no etcd lease to revoke")
			}
		},
	})
}
