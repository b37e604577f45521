package bench

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/bsm/redislock"
	"github.com/go-redsync/redsync/v4"
	"github.com/go-redsync/redsync/v4/redis/goredis/v9"

	"github.com/fencekit/fencekit/internal/testkit/pairbench"
	"github.com/fencekit/fencekit/lease"
	"github.com/fencekit/fencekit/lease/redislease/redistest"
)

// handoff is the shape of the hand-off benchmark: 8 independent locks,
// each contended by 4+1 goroutines, so that at every hand-off one goroutine
// holds the lock and 4 are blocked waiting for it.
var handoff = pairbench.Handoff{
	Groups:  8,
	Waiters: 4,
	// After a release, the former holder waits until another goroutine has
	// the lock, then for a random time in [0, RejoinSpread), and only then
	// waits for the lock again. Without that delay every waiter would start
	// waiting right at a hand-off, which is right after a poll of the
	// waiter that won: all waiters of a fixed-interval poller would end up
	// polling in step, as one waiter, which real independent processes do
	// not. RejoinSpread covers redislock's 100 ms retry interval.
	RejoinSpread: 100 * time.Millisecond,
	// A holder keeps the lock for a random time in [HoldMin, HoldMin +
	// HoldSpread): longer than RejoinSpread, so that every waiter is
	// blocked again before the next release, and spread over a whole
	// retry interval, so that a release falls at a random point of each
	// waiter's polling cycle.
	HoldMin:    105 * time.Millisecond, // RejoinSpread + 5 ms
	HoldSpread: 100 * time.Millisecond,
	// A polling library that runs out of tries (redsync after 32) would
	// be called again: it is, and counted.
	RetryGiveUps: true,
}

// redislockRetry is the retry interval of redislock's examples
// (LinearBackoff(100 * time.Millisecond)); redislock does not retry by
// default.
const redislockRetry = 100 * time.Millisecond

// BenchmarkHandoff measures how long a released lock stays free while
// others wait for it: the time from the moment a holder calls its
// library's release to the moment the next holder's acquire returns, over
// b.N hand-offs. Each library waits its own way:
//
//   - lib=fencekit: Manager.Acquire (defaults): woken by pub/sub on release,
//     polling as a fallback (PollInterval, TTL/2 capped at 1 s).
//   - lib=fencekit-fifo: the same with lease.WithFIFO: the waiters hold
//     their places in line at the store, the oldest is granted.
//   - lib=redislock: Obtain with RetryStrategy LinearBackoff(100 ms), the
//     interval of its examples (its default is not to retry at all).
//   - lib=redsync: Mutex.LockContext with its defaults: 32 tries, a random
//     delay of 50-250 ms between them.
//
// Metrics: p50-ns, p99-ns and mean-ns of the hand-off latency (ns/op is
// suppressed: wall time per op would be mostly the simulated hold time);
// rtts/op, the client round trips per hand-off (the holder's, the
// waiters' and the release); giveups/op, the blocking acquires that gave up
// (redsync after 32 tries) and were started again.
//
// Run it with a fixed count, e.g. -benchtime 400x: a p99 needs hundreds of
// hand-offs.
func BenchmarkHandoff(b *testing.B) {
	c := redistest.Shared(b)
	var rt redistest.RoundTrips
	c.AddHook(&rt)
	prefix := redistest.Prefix(b) + "handoff:"

	be := redisBackend(b, c, prefix+"fencekit:")
	m, err := lease.NewManager(be, benchTTL)
	if err != nil {
		b.Fatal(err)
	}
	fifo, err := lease.NewManager(be, benchTTL, lease.WithFIFO())
	if err != nil {
		b.Fatal(err)
	}
	locker := redislock.New(c)
	rs := redsync.New(goredis.NewPool(c))

	libs := []struct {
		name string
		lock pairbench.BlockingLock // with the library's default or recommended settings
	}{
		{"fencekit", func(ctx context.Context, name string) (func(context.Context) error, error) {
			l, err := m.Acquire(ctx, name)
			if err != nil {
				return nil, err
			}
			return l.Release, nil
		}},
		{"fencekit-fifo", func(ctx context.Context, name string) (func(context.Context) error, error) {
			l, err := fifo.Acquire(ctx, name)
			if err != nil {
				return nil, err
			}
			return l.Release, nil
		}},
		{"redislock", func(ctx context.Context, name string) (func(context.Context) error, error) {
			l, err := locker.Obtain(ctx, prefix+"redislock:"+name, benchTTL,
				&redislock.Options{RetryStrategy: redislock.LinearBackoff(redislockRetry)})
			if err != nil {
				return nil, err
			}
			return l.Release, nil
		}},
		{"redsync", func(ctx context.Context, name string) (func(context.Context) error, error) {
			mu := rs.NewMutex(prefix+"redsync:"+name, redsync.WithExpiry(benchTTL))
			if err := mu.LockContext(ctx); err != nil {
				return nil, err
			}
			return func(ctx context.Context) error {
				ok, err := mu.UnlockContext(ctx)
				if err == nil && !ok {
					err = errors.New("redsync: unlock: not held")
				}
				return err
			}, nil
		}},
	}
	for _, lib := range libs {
		b.Run("lib="+lib.name, func(b *testing.B) {
			rt0 := rt.Load()
			res := runHandoff(b, lib.lock)
			b.ReportMetric(float64(rt.Load()-rt0)/float64(b.N), "rtts/op")
			b.ReportMetric(float64(res.GiveUps)/float64(b.N), "giveups/op")
		})
	}
}

// runHandoff runs the hand-off benchmark on lock, shared by every
// goroutine, and reports the latency metrics (ns/op suppressed).
func runHandoff(b *testing.B, lock pairbench.BlockingLock) pairbench.HandoffResult {
	b.Helper()
	res := handoff.Run(b, func() pairbench.BlockingLock { return lock })
	if len(res.Samples) < b.N {
		b.Fatalf("%d hand-offs measured, want %d", len(res.Samples), b.N)
	}
	b.ReportMetric(0, "ns/op")
	pairbench.ReportLatency(b, "", res.Samples)
	return res
}
