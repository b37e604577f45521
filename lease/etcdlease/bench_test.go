package etcdlease_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"testing"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"

	"github.com/fencekit/fencekit/internal/testkit"
	"github.com/fencekit/fencekit/internal/testkit/pairbench"
	"github.com/fencekit/fencekit/lease"
	"github.com/fencekit/fencekit/lease/etcdlease"
	"github.com/fencekit/fencekit/lease/etcdlease/etcdtest"
)

// The benchmarks run on a three-member cluster of their own with etcd's
// default timing (100 ms heartbeats, 1 s election timeout: on a loaded
// machine the tests' fast timing leads to spurious elections, which stall
// requests for seconds), no fsync, every client talking to every member,
// with a 10 s TTL:
//
//	cd lease/etcdlease
//	go test -run '^$' -bench 'CyclePaired' -count 6 . | tee cycle.txt
//	go test -run '^$' -bench 'Handoff' -benchtime 300x -count 6 . | tee handoff.txt
//	benchstat -col /lib cycle.txt; benchstat -col /lib handoff.txt
const benchTTL = 10 * time.Second

// cycleLib is one way to take a lock and give it back.
type cycleLib struct {
	name  string
	cycle func(ctx context.Context, i int) error
}

// cycleLibs returns, on one cluster:
//
//   - raw: the floor, the requests a grant of this design needs, sent
//     directly: LeaseGrant, the create-if-absent transaction with the key
//     attached to the lease, and a revoke (three round trips);
//   - fencekit: Manager.TryAcquire + Lease.Release over etcdlease
//     (defaults; its transaction also compares the epoch key, and a watch
//     of the held key is made and ended on the watch stream);
//   - mutex-session: etcd's concurrency.Mutex with a session of its own
//     per cycle (NewSession, Lock, Unlock, Close): a lease per grant, as
//     fencekit;
//   - mutex: concurrency.Mutex on one session kept for the whole run (Lock,
//     Unlock: no lease per grant, all locks share the session's lease).
func cycleLibs(b *testing.B) []cycleLib {
	cl := etcdtest.StartWith(b, 3, etcdtest.Default)
	p := prefix(b)
	raw := cl.Client()
	fk := testkit.NewManager(b, benchBackend(b, cl.Client(), p+"fencekit/"), benchTTL)
	mcli := cl.Client()
	sess, err := concurrency.NewSession(mcli, concurrency.WithTTL(int(benchTTL/time.Second)))
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = sess.Close() })
	return []cycleLib{
		{"raw", func(ctx context.Context, i int) error {
			key := p + "raw/cycle"
			g, err := raw.Grant(ctx, int64(benchTTL/time.Second))
			if err != nil {
				return err
			}
			resp, err := raw.Txn(ctx).If(clientv3.Compare(clientv3.CreateRevision(key), "=", 0)).
				Then(clientv3.OpPut(key, fmt.Sprint("raw-", i), clientv3.WithLease(g.ID))).Commit()
			if err != nil {
				return err
			}
			if !resp.Succeeded {
				return errors.New("raw: not acquired")
			}
			_, err = raw.Revoke(ctx, g.ID)
			return err
		}},
		{"fencekit", func(ctx context.Context, _ int) error {
			l, err := fk.TryAcquire(ctx, "cycle")
			if err != nil {
				return err
			}
			return l.Release(ctx)
		}},
		{"mutex-session", func(ctx context.Context, _ int) error {
			s, err := concurrency.NewSession(mcli, concurrency.WithTTL(int(benchTTL/time.Second)), concurrency.WithContext(ctx))
			if err != nil {
				return err
			}
			mu := concurrency.NewMutex(s, p+"mutex-session/cycle")
			if err := mu.Lock(ctx); err != nil {
				_ = s.Close()
				return err
			}
			if err := mu.Unlock(ctx); err != nil {
				_ = s.Close()
				return err
			}
			return s.Close()
		}},
		{"mutex", func(ctx context.Context, _ int) error {
			mu := concurrency.NewMutex(sess, p+"mutex/cycle")
			if err := mu.Lock(ctx); err != nil {
				return err
			}
			return mu.Unlock(ctx)
		}},
	}
}

// BenchmarkCyclePaired times each library's acquire+release cycle next to
// the raw floor's, alternating which goes first, so that the ratio holds
// when the machine's speed swings. Metrics: ns/op (the library's cycle),
// raw-ratio (library time / floor time), over-raw-ns/op.
func BenchmarkCyclePaired(b *testing.B) {
	libs := cycleLibs(b)
	raw := libs[0].cycle
	ctx := context.Background()
	for _, lib := range libs {
		b.Run("lib="+lib.name, func(b *testing.B) {
			at := func(f func(context.Context, int) error) func(int) error {
				return func(i int) error { return f(ctx, i) }
			}
			rawT, libT, n := pairbench.Alternate(b, at(raw), at(lib.cycle))
			pairbench.ReportAlternate(b, "raw", rawT, libT, n)
		})
	}
}

// handoff is the hand-off's shape: 4 locks, each contended by 3+1
// goroutines (one holds, the others wait). A holder keeps the lock for
// 5-15 ms; after its release it waits until another has the lock, then
// 0-10 ms, before it waits again. A failed acquire fails the benchmark.
var handoff = pairbench.Handoff{
	Groups:       4,
	Waiters:      3,
	HoldMin:      5 * time.Millisecond,
	HoldSpread:   10 * time.Millisecond,
	RejoinSpread: 10 * time.Millisecond,
}

// BenchmarkHandoff measures the time from a holder's release call to the
// next holder's acquire returning, over b.N hand-offs:
//
//   - lib=raw: the floor: each waiter holds a lease granted before it
//     waits, sends the create-if-absent transaction, and on refusal watches
//     the key (from the refusal's revision) for its deletion and sends it
//     again; release is a revoke;
//   - lib=fencekit: Manager.Acquire (woken by its watch), Lease.Release;
//   - lib=fencekit-fifo: the same with lease.WithFIFO: waiters hold their
//     places in line (LineKey), the first in line is granted;
//   - lib=mutex: concurrency.Mutex.Lock, each goroutine with a session of
//     its own for the whole run (waiters queue, each watching the key
//     before its own), Unlock.
//
// Metrics: p50-ns, p99-ns and mean-ns of the hand-off (ns/op is
// suppressed). Run with a fixed count, e.g. -benchtime 300x.
func BenchmarkHandoff(b *testing.B) {
	cl := etcdtest.StartWith(b, 3, etcdtest.Default)
	p := prefix(b)
	fk := testkit.NewManager(b, benchBackend(b, cl.Client(), p+"fencekit/"), benchTTL)
	fifo := testkit.NewManager(b, benchBackend(b, cl.Client(), p+"fencekit-fifo/"), benchTTL, lease.WithFIFO())
	raw := cl.Client()
	mcli := cl.Client()
	secs := int64(benchTTL / time.Second)
	libs := []struct {
		name string
		lock func() pairbench.BlockingLock // one per goroutine
	}{
		{"raw", func() pairbench.BlockingLock {
			return func(ctx context.Context, name string) (func(context.Context) error, error) {
				key := p + "raw/" + name
				g, err := raw.Grant(ctx, secs)
				if err != nil {
					return nil, err
				}
				for {
					resp, err := raw.Txn(ctx).If(clientv3.Compare(clientv3.CreateRevision(key), "=", 0)).
						Then(clientv3.OpPut(key, "raw", clientv3.WithLease(g.ID))).Commit()
					if err != nil {
						return nil, err
					}
					if resp.Succeeded {
						return func(ctx context.Context) error { _, err := raw.Revoke(ctx, g.ID); return err }, nil
					}
					wctx, cancel := context.WithCancel(ctx)
					for wr := range raw.Watch(wctx, key, clientv3.WithRev(resp.Header.Revision+1), clientv3.WithFilterPut()) {
						if slices.ContainsFunc(wr.Events, func(e *clientv3.Event) bool { return e.Type == mvccpb.DELETE }) || wr.Err() != nil {
							break
						}
					}
					cancel()
					if ctx.Err() != nil {
						return nil, ctx.Err()
					}
				}
			}
		}},
		{"fencekit", func() pairbench.BlockingLock {
			return func(ctx context.Context, name string) (func(context.Context) error, error) {
				l, err := fk.Acquire(ctx, name)
				if err != nil {
					return nil, err
				}
				return l.Release, nil
			}
		}},
		{"fencekit-fifo", func() pairbench.BlockingLock {
			return func(ctx context.Context, name string) (func(context.Context) error, error) {
				l, err := fifo.Acquire(ctx, name)
				if err != nil {
					return nil, err
				}
				return l.Release, nil
			}
		}},
		{"mutex", func() pairbench.BlockingLock {
			s, err := concurrency.NewSession(mcli, concurrency.WithTTL(int(secs)))
			if err != nil {
				b.Fatal(err)
			}
			b.Cleanup(func() { _ = s.Close() })
			return func(ctx context.Context, name string) (func(context.Context) error, error) {
				mu := concurrency.NewMutex(s, p+"mutex/"+name)
				if err := mu.Lock(ctx); err != nil {
					return nil, err
				}
				return mu.Unlock, nil
			}
		}},
	}
	for _, lib := range libs {
		b.Run("lib="+lib.name, func(b *testing.B) {
			res := handoff.Run(b, lib.lock)
			b.ReportMetric(0, "ns/op")
			pairbench.ReportLatency(b, "", res.Samples)
		})
	}
}

// benchBackend is a backend with the default MinTTL (2 s: the default
// timing's minimum).
func benchBackend(b *testing.B, cli etcdlease.Client, prefix string) *etcdlease.Backend {
	be, err := etcdlease.New(cli, etcdlease.WithPrefix(prefix))
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = be.Close() })
	return be
}

// BenchmarkThroughput is acquire + release throughput on a 3-member etcd
// cluster, as bench's BenchmarkPGThroughput measures it on PostgreSQL:
// lease.Manager.Acquire + Lease.Release, workers goroutines on distinct
// names or on one, b.N cycles in all (run it with a fixed count:
// -benchtime 300x). Metrics: ops/s, p50-ns, p99-ns of a cycle.
func BenchmarkThroughput(b *testing.B) {
	cl := etcdtest.StartWith(b, 3, etcdtest.Default)
	m := testkit.NewManager(b, benchBackend(b, cl.Client(), prefix(b)+"tp/"), benchTTL)
	ctx := context.Background()
	pairbench.ThroughputRuns(b, "lib=fencekit", true, func(name string) error {
		l, err := m.Acquire(ctx, name)
		if err != nil {
			return err
		}
		return l.Release(ctx)
	})
}

// BenchmarkRenewLoad is the requests of keeping leases alive on a
// 3-member etcd cluster, as bench's BenchmarkPGRenewLoad measures them on
// PostgreSQL (pairbench.RenewLoad: 1,000 leases held by one lease.Manager
// with its defaults at TTL 15 s, over a window of b.N seconds; run it
// with -benchtime 10x). The requests are counted at the client, by kind
// (countingClient).
//
// Metrics, per 1,000 held leases: reqs/s, renewals/s, and keepalive/s
// (one LeaseKeepAlive stream with one message per renewal), txn/s (the
// key checks, up to MaxTxnOps reads per transaction) and any other kind.
func BenchmarkRenewLoad(b *testing.B) {
	cl := etcdtest.StartWith(b, 3, etcdtest.Default)
	cc := newCounting(cl.Client())
	renewals := &pairbench.RenewCounter{}
	m, err := lease.NewManager(benchBackend(b, cc, prefix(b)+"renew/"), pairbench.RenewTTL, lease.WithObserver(renewals))
	if err != nil {
		b.Fatal(err)
	}
	pairbench.RenewLoad(b, m, renewals, "renew-", 1000, cc.counts)
}

// counts returns the requests counted so far, by kind.
func (c *countingClient) counts() map[string]int64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	n := make(map[string]int64, len(c.n))
	for k, v := range c.n {
		n[k] = int64(v)
	}
	return n
}
