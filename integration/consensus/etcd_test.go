package consensus

import (
	"testing"

	"github.com/fencekit/fencekit/internal/testkit"
	"github.com/fencekit/fencekit/lease/etcdlease/etcdtest"
)

// The etcd tests' helpers, as lease/etcdlease's tests have them.

// etcdPrefix returns a key prefix of its own for one test.
func etcdPrefix(t testing.TB) string {
	return "fencekit-test/" + testName(t) + "-" + testkit.RandHex(6) + "/"
}

// newEtcdBackend returns a backend over cli with the test servers' minimum
// TTL, closed when the test ends.
var newEtcdBackend = etcdtest.NewBackend

// etcdCluster starts a three-member cluster for one test, with the Steady
// timing (see etcdtest.Steady).
func etcdCluster(t testing.TB) *etcdtest.Cluster { return etcdtest.StartWith(t, 3, etcdtest.Steady) }
