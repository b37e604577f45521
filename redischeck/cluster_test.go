package redischeck_test

import (
	"context"
	"testing"
	"time"

	"github.com/fencekit/fencekit/fence"
	"github.com/fencekit/fencekit/fencecheck"
	"github.com/fencekit/fencekit/fencecheck/checktest"
	"github.com/fencekit/fencekit/lease/redislease/redistest"
	"github.com/fencekit/fencekit/redischeck"
)

// The checker on a real Redis Cluster (3 masters with a replica each),
// through a *redis.ClusterClient: each script touches one key, so any
// slot works (the suite's names carry hash tags, which pick the slot).
func TestConformanceCluster(t *testing.T) {
	cl := redistest.StartCluster(t, redistest.ClusterOptions{Masters: 3, NodeTimeout: time.Second})
	rdb := cl.Client(t)
	checktest.Run(t, checktest.Config{
		New: func(t *testing.T) (fencecheck.Checker, func(context.Context, string) (fence.Token, error)) {
			c, err := redischeck.New(rdb)
			if err != nil {
				t.Fatal(err)
			}
			return c, c.Current
		},
	})
}
