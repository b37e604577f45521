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
	"context"
	"fmt"
	"os"
	"testing"

	"go.uber.org/goleak"

	"github.com/fencekit/fencekit/examples/services"
	"github.com/fencekit/fencekit/internal/testenv"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(mainM{m},
		// A server started here (versitygw, when no S3 is given) is forked
		// from one goroutine locked to its thread for the life of the
		// process, so that the child's parent-death signal follows the
		// process, not a thread.
		goleak.IgnoreTopFunction("github.com/fencekit/fencekit/examples/internal/leftover.startSpawner.func1"),
	)
}

// mainM finds the services (PostgreSQL and S3; the Redis deployments are
// started by the tests) before the tests run; goleak checks for leaked
// goroutines once it returns.
type mainM struct{ m *testing.M }

func (w mainM) Run() int {
	svc, err := services.Provide(context.Background(), services.Config{
		Log: func(f string, a ...any) { fmt.Fprintf(os.Stderr, "redisfailover: "+f+"\n", a...) },
	})
	if err != nil {
		fmt.Fprintf(os.Stderr, "redisfailover: %v\n", err)
		return 1
	}
	defer svc.Close()
	for k, v := range map[string]string{
		testenv.RedisURLVar: svc.RedisURL, testenv.PostgresURLVar: svc.PostgresURL,
		testenv.S3EndpointVar: svc.S3.Endpoint, testenv.S3AccessKeyVar: svc.S3.AccessKey,
		testenv.S3SecretKeyVar: svc.S3.SecretKey, testenv.S3BucketVar: svc.S3.Bucket,
	} {
		os.Setenv(k, v)
	}
	return w.m.Run()
}
