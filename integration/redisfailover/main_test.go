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
	"fmt"
	"os"
	"testing"

	"go.uber.org/goleak"

	"github.com/fencekit/fencekit/internal/rig/itest"
	"github.com/fencekit/fencekit/internal/rig/services"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(mainM{m},
		// A server started here (versitygw, when no S3 is given) is forked
		// from one goroutine locked to its thread for the life of the
		// process, so that the child's parent-death signal follows the
		// process, not a thread.
		goleak.IgnoreTopFunction("github.com/fencekit/fencekit/internal/rig/leftover.startSpawner.func1"),
	)
}

// mainM finds the services (PostgreSQL and S3; the Redis deployments are
// started by the tests) before the tests run; goleak checks for leaked
// goroutines once it returns.
type mainM struct{ m *testing.M }

func (w mainM) Run() int {
	_, cleanup, err := itest.Setup("redisfailover", services.Config{})
	if err != nil {
		fmt.Fprintf(os.Stderr, "redisfailover: %v\n", err)
		return 1
	}
	defer cleanup()
	return w.m.Run()
}
