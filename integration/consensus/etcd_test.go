package consensus

import (
	"testing"
	"time"

	"github.com/fencekit/fencekit/internal/testkit"
	"github.com/fencekit/fencekit/lease/etcdlease"
	"github.com/fencekit/fencekit/lease/etcdlease/etcdtest"
)

// The etcd tests' helpers, as lease/etcdlease's tests have them.

// etcdPrefix returns a key prefix of its own for one test.
func etcdPrefix(t testing.TB) string {
	return "fencekit-test/" + testName(t) + "-" + testkit.RandHex(6) + "/"
}

// newEtcdBackend returns a backend over cli with the test servers' minimum
// TTL (1 s: TickMs 10, ElectionMs 100), closed when the test ends.
func newEtcdBackend(t testing.TB, cli etcdlease.Client, prefix string) *etcdlease.Backend {
	t.Helper()
	b, err := etcdlease.New(cli, etcdlease.WithPrefix(prefix), etcdlease.WithMinTTL(time.Second))
	if err != nil {
		t.Fatalf("etcdlease.New: %v", err)
	}
	t.Cleanup(func() { _ = b.Close() })
	return b
}

// etcdCluster starts a three-member cluster for one test, with the Steady
// timing (see etcdtest.Steady).
func etcdCluster(t testing.TB) *etcdtest.Cluster { return etcdtest.StartWith(t, 3, etcdtest.Steady) }
