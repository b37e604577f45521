// Package redisfailover holds the end-to-end failover tests of the Redis
// lease backend: a Sentinel primary or a Cluster master is killed (SIGKILL)
// after its replica was cut off, and the holder of a lease the failover
// lost, still believing it holds it, writes through sqlguard (PostgreSQL)
// and blobguard (S3) while another client holds the lease: its writes are
// rejected as stale. The lease-only failover tests (a manual failover, the
// sharded waiters across one) stay with the backend, in lease/redislease,
// which needs no store but Redis.
//
// It lives in the integration module so that the backend's module does not
// require the guards, the migrations, pgx or the S3 SDK.
package redisfailover

import (
	"testing"

	"github.com/fencekit/fencekit/internal/rig/itest"
	"github.com/fencekit/fencekit/internal/rig/services"
)

func TestMain(m *testing.M) {
	itest.Main(m, "redisfailover", services.Config{}, nil, nil)
}
