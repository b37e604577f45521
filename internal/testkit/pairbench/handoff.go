package pairbench

import (
	"context"
	"fmt"
	mrand "math/rand/v2"
	"sync"
	"testing"
	"time"
)

// A BlockingLock takes a named lock, waiting for it in its library's own
// way, and returns the function that releases it.
type BlockingLock func(ctx context.Context, name string) (unlock func(context.Context) error, err error)

// Handoff is the shape of a hand-off benchmark: Groups independent locks,
// each contended by Waiters+1 goroutines, so that at every hand-off one
// goroutine holds the lock and Waiters are blocked waiting for it.
// HoldSpread and RejoinSpread must be positive.
type Handoff struct {
	Groups, Waiters int
	// A holder keeps the lock for a random time in [HoldMin, HoldMin +
	// HoldSpread).
	HoldMin, HoldSpread time.Duration
	// After a release, the former holder waits until another goroutine
	// has the lock, then for a random time in [0, RejoinSpread), and only
	// then waits for the lock again: waiters that all started waiting
	// right at a hand-off would poll in step, as one waiter, which real
	// independent processes do not.
	RejoinSpread time.Duration
	// RetryGiveUps: an acquire that fails while the run goes on (a polling
	// library ran out of tries) is counted in HandoffResult.GiveUps and
	// made again, as its caller would; without it, such a failure fails
	// the benchmark.
	RetryGiveUps bool
}

// HandoffResult is what Handoff.Run measured.
type HandoffResult struct {
	// Samples are the hand-off latencies: from the moment a holder calls
	// its release to the moment the next holder's acquire returns.
	Samples []time.Duration
	// GiveUps counts the acquires that failed and were made again (with
	// RetryGiveUps).
	GiveUps int
}

// handoffGroup is one contended lock and what its goroutines share.
type handoffGroup struct {
	name       string
	mu         sync.Mutex
	releasedAt time.Time     // set by the holder just before it releases; zero once counted
	acquired   chan struct{} // closed, and replaced, at every acquire
}

// Run runs h.Groups groups of h.Waiters+1 goroutines until b.N hand-offs
// have been measured, and returns their latencies. newLock is called once
// per goroutine, before the timer starts, for the lock that goroutine
// takes (it may return the same lock every time). A failed release, or
// an acquire that fails without RetryGiveUps, fails b. The lock names are
// unique to the run.
func (h Handoff) Run(b *testing.B, newLock func() BlockingLock) HandoffResult {
	b.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()

	var (
		mu       sync.Mutex
		res      = HandoffResult{Samples: make([]time.Duration, 0, b.N)}
		firstErr error
		wg       sync.WaitGroup
	)
	record := func(d time.Duration) {
		mu.Lock()
		defer mu.Unlock()
		if len(res.Samples) < b.N {
			res.Samples = append(res.Samples, d)
			if len(res.Samples) == b.N {
				cancel()
			}
		}
	}
	fail := func(err error) {
		mu.Lock()
		if firstErr == nil {
			firstErr = err
		}
		mu.Unlock()
		cancel()
	}

	run := fmt.Sprintf("%d-%d", time.Now().UnixNano(), mrand.Int64())
	locks := make([][]BlockingLock, h.Groups)
	for g := range locks {
		for range h.Waiters + 1 {
			locks[g] = append(locks[g], newLock())
		}
	}
	b.ResetTimer()
	for g := range h.Groups {
		grp := &handoffGroup{name: fmt.Sprintf("%s-%d", run, g), acquired: make(chan struct{})}
		for _, lock := range locks[g] {
			wg.Go(func() {
				for ctx.Err() == nil {
					unlock, err := lock(ctx, grp.name)
					if err != nil {
						if ctx.Err() != nil {
							return
						}
						if !h.RetryGiveUps {
							fail(err)
							return
						}
						mu.Lock()
						res.GiveUps++
						mu.Unlock()
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

					hold := time.NewTimer(h.HoldMin + mrand.N(h.HoldSpread))
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
					// queueing again (one holder, Waiters waiters), then
					// for a random time: see RejoinSpread.
					select {
					case <-next:
					case <-ctx.Done():
						return
					}
					rejoin := time.NewTimer(mrand.N(h.RejoinSpread))
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
