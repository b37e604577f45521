package leasetest

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/fencekit/fencekit/fence"
	"github.com/fencekit/fencekit/lease"
)

// The checks of exclusion: one owner at a time, directly and through
// Managers and a semaphore contending over several connections.

func testHeldByAnotherOwner(t *testing.T, s *suite) {
	b1, b2 := s.backend(), s.connect()
	n := name(t)
	g := mustAcquire(t, b1, req(n, "a", s.long))
	_, err := b2.Acquire(ctxT(t), req(n, "b", s.long))
	if !errors.Is(err, lease.ErrNotAcquired) {
		t.Fatalf("second owner's Acquire = %v, want ErrNotAcquired", err)
	}
	var na *lease.NotAcquiredError
	if errors.As(err, &na) && (na.RetryAfter < 0 || na.RetryAfter > g.TTL) {
		t.Fatalf("RetryAfter = %v, want within [0, %v]", na.RetryAfter, g.TTL)
	}
}

func testSameOwnerIdempotent(t *testing.T, s *suite) {
	b := s.backend()
	n := name(t)
	g1 := mustAcquire(t, b, req(n, "a", s.long))
	g2 := mustAcquire(t, b, req(n, "a", s.long))
	if g1.Token != g2.Token {
		t.Fatalf("a retried Acquire by the same owner returned token %d, then %d; want the same", g1.Token, g2.Token)
	}
	release(t, b, g2)
}

// testExclusiveUnderContention: many goroutines over two connections take
// the same lease in turns; a checker fails if two holders ever overlap and
// requires tokens to grow in grant order. The workers wait as long as the
// lease keeps changing hands: they give up when no grant has been made for
// stallLimit (a stuck lease), not at a deadline for all 96 grants, which a
// loaded machine running a three-member store under the race detector
// could miss while every grant is right.
func testExclusiveUnderContention(t *testing.T, s *suite) {
	n := name(t)
	managers := []*lease.Manager{newManager(t, s.backend(), s.long), newManager(t, s.connect(), s.long)}
	const workers, rounds = 8, 12
	var (
		mu      sync.Mutex
		holder  = -1
		last    fence.Token
		grants  int
		failure error
	)
	fail := func(err error) {
		mu.Lock()
		failure = errors.Join(failure, err)
		mu.Unlock()
	}
	ctx, progress := progressCtx(t, stallLimit)
	var wg sync.WaitGroup
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			m := managers[w%len(managers)]
			for range rounds {
				l, err := m.Acquire(ctx, n)
				if err != nil {
					fail(fmt.Errorf("worker %d: Acquire: %w (%v)", w, err, context.Cause(ctx)))
					return
				}
				progress()
				mu.Lock()
				if holder != -1 {
					failure = errors.Join(failure, fmt.Errorf("worker %d granted token %d while worker %d holds the lease", w, l.Token(), holder))
				}
				if l.Token() <= last {
					failure = errors.Join(failure, fmt.Errorf("worker %d granted token %d after token %d", w, l.Token(), last))
				}
				holder, last = w, l.Token()
				grants++
				mu.Unlock()
				time.Sleep(time.Millisecond)
				if l.Err() != nil {
					fail(fmt.Errorf("worker %d: lease ended while working: %w", w, l.Err()))
				}
				mu.Lock()
				holder = -1
				mu.Unlock()
				if err := l.Release(ctx); err != nil {
					fail(fmt.Errorf("worker %d: Release: %w", w, err))
					return
				}
			}
		}()
	}
	wg.Wait()
	if failure != nil {
		t.Fatal(failure)
	}
	if grants != workers*rounds {
		t.Fatalf("%d grants, want %d", grants, workers*rounds)
	}
}

// testSemaphoreBoundsHolders: a lease.Semaphore over the store admits
// exactly its permits. N permits are granted at once over N connections,
// each on a slot of its own; one more is refused; a released slot goes to
// the next holder with a greater token. Then workers over two connections
// take permits in turns: never more than N hold one at once, no slot has
// two holders, and each slot's tokens grow strictly in grant order. It
// needs nothing beyond Backend (a backend without Watcher is polled).
func testSemaphoreBoundsHolders(t *testing.T, s *suite) {
	const permits, workers, rounds = 2, 6, 2
	n := name(t)
	poll := lease.WithPollInterval(20 * time.Millisecond) // for backends without Watcher
	ctx := ctxT(t)
	var sems []*lease.Semaphore
	for i := range permits + 1 {
		b := s.connect()
		if i == 0 {
			b = s.backend()
		}
		sem, err := lease.NewSemaphore(newManager(t, b, s.long, poll), n, permits)
		if err != nil {
			t.Fatalf("NewSemaphore: %v", err)
		}
		sems = append(sems, sem)
	}
	slots := sems[0].Slots()

	// Full: each permit on a slot of its own, and no more.
	held := map[string]*lease.Lease{}
	for i := range permits {
		l, err := sems[i].TryAcquire(ctx)
		if err != nil {
			t.Fatalf("TryAcquire of permit %d of %d: %v", i+1, permits, err)
		}
		if !slices.Contains(slots, l.Name()) || held[l.Name()] != nil {
			t.Fatalf("permit %d granted on %q; slots %q, held %v", i+1, l.Name(), slots, held)
		}
		held[l.Name()] = l
	}
	if l, err := sems[permits].TryAcquire(ctx); !errors.Is(err, lease.ErrNotAcquired) {
		if l != nil {
			_ = l.Release(ctx)
		}
		t.Fatalf("TryAcquire of a full semaphore = %v (permit %v), want ErrNotAcquired", err, l)
	}
	freed := held[slots[1]]
	if err := freed.Release(ctx); err != nil {
		t.Fatalf("Release: %v", err)
	}
	next, err := sems[permits].TryAcquire(ctx)
	if err != nil {
		t.Fatalf("TryAcquire after a permit was released: %v", err)
	}
	if next.Name() != freed.Name() || next.Token() <= freed.Token() {
		t.Fatalf("after %q (token %d) was released, got %q token %d; want that slot with a greater token", freed.Name(), freed.Token(), next.Name(), next.Token())
	}
	last := map[string]fence.Token{slots[0]: held[slots[0]].Token(), slots[1]: next.Token()}
	for _, l := range []*lease.Lease{held[slots[0]], next} {
		if err := l.Release(ctx); err != nil {
			t.Fatalf("Release: %v", err)
		}
	}

	// Contention over two connections.
	var (
		mu      sync.Mutex
		holding = map[string]int{}
		grants  int
		failure error
	)
	fail := func(err error) {
		mu.Lock()
		failure = errors.Join(failure, err)
		mu.Unlock()
	}
	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			sem := sems[w%2]
			for range rounds {
				l, err := sem.Acquire(ctx)
				if err != nil {
					fail(fmt.Errorf("worker %d: Acquire: %w", w, err))
					return
				}
				mu.Lock()
				if other, ok := holding[l.Name()]; ok {
					failure = errors.Join(failure, fmt.Errorf("worker %d granted %q (token %d) while worker %d holds it", w, l.Name(), l.Token(), other))
				}
				if len(holding) >= permits {
					failure = errors.Join(failure, fmt.Errorf("worker %d granted %q while %d permits are held, the semaphore has %d", w, l.Name(), len(holding), permits))
				}
				if l.Token() <= last[l.Name()] {
					failure = errors.Join(failure, fmt.Errorf("%q granted token %d after token %d", l.Name(), l.Token(), last[l.Name()]))
				}
				holding[l.Name()], last[l.Name()] = w, l.Token()
				grants++
				mu.Unlock()
				time.Sleep(time.Millisecond)
				if err := l.Err(); err != nil {
					fail(fmt.Errorf("worker %d: permit ended while held: %w", w, err))
				}
				mu.Lock()
				delete(holding, l.Name())
				mu.Unlock()
				if err := l.Release(ctx); err != nil {
					fail(fmt.Errorf("worker %d: Release: %w", w, err))
					return
				}
			}
		})
	}
	wg.Wait()
	if failure != nil {
		t.Fatal(failure)
	}
	if grants != workers*rounds {
		t.Fatalf("%d grants, want %d", grants, workers*rounds)
	}
}

// stallLimit is how long a test that waits on progress (progressCtx) lets
// pass without any.
const stallLimit = 30 * time.Second

// progressCtx returns a context that ends when progress has not been called
// for stall (its cause says so), or when the test ends.
func progressCtx(t *testing.T, stall time.Duration) (context.Context, func()) {
	ctx, cancel := context.WithCancelCause(context.Background())
	t.Cleanup(func() { cancel(nil) })
	timer := time.AfterFunc(stall, func() {
		cancel(fmt.Errorf("no progress for %v", stall))
	})
	t.Cleanup(func() { timer.Stop() })
	return ctx, func() { timer.Reset(stall) }
}
