package redislease

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/fencekit/fencekit/lease"
	"github.com/fencekit/fencekit/lease/driver"
	"github.com/fencekit/fencekit/lease/redislease/redistest"
)

// The benchmarks of this file compare a Redis Cluster of three masters (with
// a replica each) with one redis-server, both started by the benchmark on
// this machine's loopback:
//
//	go test -run '^$' -bench 'Cluster' -count 6 ./lease/redislease/ | tee cluster.txt
//	benchstat -col /deploy cluster.txt

// benchDeployments starts both deployments and returns a client of each;
// trips counts the round trips of both.
func benchDeployments(b *testing.B, trips *atomic.Int64) map[string]Client {
	cl := redistest.StartCluster(b, redistest.ClusterOptions{Masters: 3})
	rc := redistest.Start(b).Client()
	rc.AddHook(tripHook{trips})
	return map[string]Client{
		"cluster3": withSlotReload(cl.Client(b, func(o *redis.ClusterOptions) {
			o.NewClient = func(opt *redis.Options) *redis.Client {
				nc := redis.NewClient(opt)
				nc.AddHook(tripHook{trips})
				return nc
			}
		})),
		"single": rc,
	}
}

// tripHook counts round trips: commands and pipelines.
type tripHook struct{ n *atomic.Int64 }

func (h tripHook) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h tripHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error { h.n.Add(1); return next(ctx, cmd) }
}
func (h tripHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error { h.n.Add(1); return next(ctx, cmds) }
}

// BenchmarkClusterCycle: a TryAcquire+Release cycle of the Manager, on the
// cluster and on one server.
func BenchmarkClusterCycle(b *testing.B) {
	ctx := context.Background()
	var trips atomic.Int64
	clients := benchDeployments(b, &trips)
	for _, deploy := range []string{"cluster3", "single"} {
		be, err := New(clients[deploy], func(o *Options) { o.Prefix = "bench:" })
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { _ = be.Close() })
		m, err := lease.NewManager(be, 10*time.Second)
		if err != nil {
			b.Fatal(err)
		}
		for i := range 64 { // every node caches the scripts
			l, err := m.TryAcquire(ctx, fmt.Sprintf("cycle-%d", i))
			if err != nil {
				b.Fatal(err)
			}
			_ = l.Release(ctx)
		}
		b.Run("deploy="+deploy, func(b *testing.B) {
			before, ops := trips.Load(), 0
			for b.Loop() {
				ops++
				l, err := m.TryAcquire(ctx, fmt.Sprintf("cycle-%d", ops%64)) // names on every master
				if err != nil {
					b.Fatal(err)
				}
				if err := l.Release(ctx); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(trips.Load()-before)/float64(ops), "rtts/op")
		})
	}
}

// BenchmarkClusterRenewBatch: one RenewBatch of n leases whose names spread
// over every master (one pipeline per master, sent in parallel by go-redis),
// against the same batch on one server (one pipeline). rtts/op counts the
// round trips of one batch.
func BenchmarkClusterRenewBatch(b *testing.B) {
	ctx := context.Background()
	var trips atomic.Int64
	clients := benchDeployments(b, &trips)
	for _, n := range []int{100, 1000, 10000} {
		for _, deploy := range []string{"cluster3", "single"} {
			be, err := New(clients[deploy], func(o *Options) { o.Prefix = "bench:" })
			if err != nil {
				b.Fatal(err)
			}
			b.Cleanup(func() { _ = be.Close() })
			recs := make([]driver.Grant, n)
			for i := range recs {
				if recs[i], err = be.Acquire(ctx, driver.Request{Name: fmt.Sprintf("renew-%d-%d", n, i), Owner: "bench", TTL: time.Minute}); err != nil {
					b.Fatal(err)
				}
			}
			b.Run(fmt.Sprintf("leases=%d/deploy=%s", n, deploy), func(b *testing.B) {
				be.RenewBatch(ctx, recs, func(int, error) {}) // scripts cached on every node
				before, ops := trips.Load(), 0
				for b.Loop() {
					ops++
					var failed atomic.Int64
					be.RenewBatch(ctx, recs, func(i int, err error) {
						if err != nil {
							failed.Add(1)
						}
					})
					if n := failed.Load(); n > 0 {
						b.Fatalf("%d renewals failed", n)
					}
				}
				b.ReportMetric(float64(trips.Load()-before)/float64(ops), "rtts/op")
				b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(ops*n), "ns/lease")
			})
		}
	}
}
