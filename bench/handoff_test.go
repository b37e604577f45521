package bench

import (
	"context"
	"errors"
	"fmt"
	mrand "math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/bsm/redislock"
	"github.com/go-redsync/redsync/v4"
	"github.com/go-redsync/redsync/v4/redis/goredis/v9"

	"github.com/fencekit/fencekit/internal/pairbench"
	"github.com/fencekit/fencekit/lease"
	"github.com/fencekit/fencekit/lease/redislease/redistest"
)

// The shape of the hand-off benchmark: handoffGroups independent locks, each
// contended by handoffWaiters+1 goroutines, so that at every hand-off one
// goroutine holds the lock and handoffWaiters are blocked waiting for it.
const (
	handoffGroups  = 8
	handoffWaiters = 4
	// After a release, the former holder waits until another goroutine has
	// the lock, then for a random time in [0, rejoinSpread), and only then
	// waits for the lock again. Without that delay every waiter would start
	// waiting right at a hand-off, which is right after a poll of the
	// waiter that won: all waiters of a fixed-interval poller would end up
	// polling in step, as one waiter, which real independent processes do
	// not. rejoinSpread covers redislock's 100 ms retry interval.
	rejoinSpread = 100 * time.Millisecond
	// A holder keeps the lock for a random time in [holdMin, holdMin +
	// holdSpread): longer than rejoinSpread, so that every waiter is
	// blocked again before the next release, and spread over a whole
	// retry interval, so that a release falls at a random point of each
	// waiter's polling cycle.
	holdMin    = rejoinSpread + 5*time.Millisecond
	holdSpread = 100 * time.Millisecond
	// redislockRetry is the retry interval of redislock's examples
	// (LinearBackoff(100 * time.Millisecond)); redislock does not retry
	// by default.
	redislockRetry = 100 * time.Millisecond
)

// A blockingLock takes a named lock, waiting with the library's default or
// recommended settings, and returns the function that releases it.
type blockingLock func(ctx context.Context, name string) (unlock func(context.Context) error, err error)

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
	var rt RoundTrips
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
		lock blockingLock
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
			if len(res.samples) < b.N {
				b.Fatalf("%d hand-offs measured, want %d", len(res.samples), b.N)
			}
			b.ReportMetric(0, "ns/op")
			pairbench.ReportLatency(b, "", res.samples)
			b.ReportMetric(float64(rt.Load()-rt0)/float64(b.N), "rtts/op")
			b.ReportMetric(float64(res.giveups)/float64(b.N), "giveups/op")
		})
	}
}

type handoffResult struct {
	samples []time.Duration
	giveups int
}

// handoffGroup is one contended lock and what its goroutines share.
type handoffGroup struct {
	name       string
	mu         sync.Mutex
	releasedAt time.Time     // set by the holder just before it releases; zero once counted
	acquired   chan struct{} // closed, and replaced, at every acquire
}

// runHandoff runs handoffGroups groups of handoffWaiters+1 goroutines until
// b.N hand-offs have been measured.
func runHandoff(b *testing.B, lock blockingLock) handoffResult {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()

	var (
		mu  sync.Mutex
		res = handoffResult{samples: make([]time.Duration, 0, b.N)}
		wg  sync.WaitGroup
	)
	record := func(d time.Duration) {
		mu.Lock()
		defer mu.Unlock()
		if len(res.samples) < b.N {
			res.samples = append(res.samples, d)
			if len(res.samples) == b.N {
				cancel()
			}
		}
	}
	var errMu sync.Mutex
	var firstErr error
	fail := func(err error) {
		errMu.Lock()
		if firstErr == nil {
			firstErr = err
		}
		errMu.Unlock()
		cancel()
	}

	run := fmt.Sprintf("%d-%d", time.Now().UnixNano(), mrand.Int64())
	b.ResetTimer()
	for g := range handoffGroups {
		grp := &handoffGroup{name: fmt.Sprintf("%s:%d", run, g), acquired: make(chan struct{})}
		for range handoffWaiters + 1 {
			wg.Go(func() {
				for ctx.Err() == nil {
					unlock, err := lock(ctx, grp.name)
					if err != nil {
						if ctx.Err() == nil {
							// A polling library ran out of tries: it would
							// be called again, so do that, and count it.
							mu.Lock()
							res.giveups++
							mu.Unlock()
						}
						continue
					}
					now := time.Now()
					grp.mu.Lock()
					if !grp.releasedAt.IsZero() {
						record(now.Sub(grp.releasedAt))
						grp.releasedAt = time.Time{}
					}
					close(grp.acquired)
					grp.acquired = make(chan struct{})
					grp.mu.Unlock()

					hold := time.NewTimer(holdMin + mrand.N(holdSpread))
					select {
					case <-hold.C:
					case <-ctx.Done():
						hold.Stop()
					}
					grp.mu.Lock()
					next := grp.acquired
					grp.releasedAt = time.Now()
					grp.mu.Unlock()
					rctx, rcancel := context.WithTimeout(context.Background(), 5*time.Second)
					err = unlock(rctx)
					rcancel()
					if err != nil {
						fail(fmt.Errorf("release: %w", err))
						return
					}
					// Wait until another goroutine has the lock before
					// queueing again (one holder, handoffWaiters waiters),
					// then for a random time: see rejoinSpread.
					select {
					case <-next:
					case <-ctx.Done():
						return
					}
					rejoin := time.NewTimer(mrand.N(rejoinSpread))
					select {
					case <-rejoin.C:
					case <-ctx.Done():
						rejoin.Stop()
						return
					}
				}
			})
		}
	}
	<-ctx.Done()
	b.StopTimer()
	wg.Wait()
	if firstErr != nil {
		b.Fatal(firstErr)
	}
	return res
}
