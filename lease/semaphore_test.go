package lease_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	mrand "math/rand/v2"
	"slices"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/fencekit/fencekit/fence"
	"github.com/fencekit/fencekit/fencecheck"
	"github.com/fencekit/fencekit/lease"
	"github.com/fencekit/fencekit/lease/driver"
	"github.com/fencekit/fencekit/lease/memlease"
)

func newSemaphore(t *testing.T, m *lease.Manager, name string, permits int) *lease.Semaphore {
	t.Helper()
	s, err := lease.NewSemaphore(m, name, permits)
	if err != nil {
		t.Fatalf("NewSemaphore(%q, %d): %v", name, permits, err)
	}
	return s
}

// semaphoreManager is a Manager over b that polls often and stays quiet.
func semaphoreManager(t *testing.T, b lease.Backend, ttl time.Duration, opts ...lease.Option) *lease.Manager {
	t.Helper()
	m, err := lease.NewManager(b, ttl, append([]lease.Option{lease.WithLogger(slog.New(slog.DiscardHandler))}, opts...)...)
	if err != nil {
		t.Fatalf("NewManager: %v", err)
	}
	return m
}

// TestSemaphoreBoundsHolders: workers on several Managers contend for a
// semaphore in virtual time. Never more than N hold a permit at once, the
// semaphore is full at some point (the bound is reached, not just kept),
// every permit is one of its slots, and each slot's tokens grow strictly
// in the order the slot was granted.
func TestSemaphoreBoundsHolders(t *testing.T) {
	for _, tc := range []struct{ permits, workers, rounds int }{{1, 4, 6}, {3, 10, 8}, {5, 7, 5}} {
		t.Run(fmt.Sprintf("permits=%d,workers=%d", tc.permits, tc.workers), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				b := memlease.New()
				ms := []*lease.Manager{semaphoreManager(t, b, 10*time.Second), semaphoreManager(t, b, 10*time.Second)}
				sems := []*lease.Semaphore{newSemaphore(t, ms[0], "crawl", tc.permits), newSemaphore(t, ms[1], "crawl", tc.permits)}
				var (
					mu       sync.Mutex
					holding  = map[string]int{} // slot -> worker
					most     int
					lastTok  = map[string]fence.Token{}
					failures []error
					grants   int
				)
				fail := func(err error) { mu.Lock(); failures = append(failures, err); mu.Unlock() }
				var wg sync.WaitGroup
				for w := range tc.workers {
					wg.Go(func() {
						s := sems[w%len(sems)]
						for range tc.rounds {
							l, err := s.Acquire(context.Background())
							if err != nil {
								fail(fmt.Errorf("worker %d: Acquire: %w", w, err))
								return
							}
							mu.Lock()
							if !slices.Contains(s.Slots(), l.Name()) {
								failures = append(failures, fmt.Errorf("worker %d got %q, not a slot of the semaphore", w, l.Name()))
							}
							if other, ok := holding[l.Name()]; ok {
								failures = append(failures, fmt.Errorf("worker %d granted slot %q while worker %d holds it", w, l.Name(), other))
							}
							if l.Token() <= lastTok[l.Name()] {
								failures = append(failures, fmt.Errorf("slot %q granted token %d after token %d", l.Name(), l.Token(), lastTok[l.Name()]))
							}
							holding[l.Name()], lastTok[l.Name()] = w, l.Token()
							most = max(most, len(holding))
							if len(holding) > tc.permits {
								failures = append(failures, fmt.Errorf("%d holders of a semaphore of %d permits", len(holding), tc.permits))
							}
							grants++
							mu.Unlock()
							time.Sleep(time.Duration(1+mrand.IntN(50)) * time.Millisecond)
							if err := l.Err(); err != nil {
								fail(fmt.Errorf("worker %d: permit ended while held: %w", w, err))
							}
							mu.Lock()
							delete(holding, l.Name())
							mu.Unlock()
							if err := l.Release(context.Background()); err != nil {
								fail(fmt.Errorf("worker %d: Release: %w", w, err))
							}
						}
					})
				}
				wg.Wait()
				if err := errors.Join(failures...); err != nil {
					t.Fatal(err)
				}
				if grants != tc.workers*tc.rounds {
					t.Fatalf("%d grants, want %d", grants, tc.workers*tc.rounds)
				}
				if most != tc.permits {
					t.Fatalf("at most %d holders at once; with %d workers the semaphore of %d permits should have been full", most, tc.workers, tc.permits)
				}
			})
		})
	}
}

// TestSemaphoreCrashedHolderFreesSlotAfterTTL: a holder that took every
// permit crashes (no renewal, no release). A waiter gets a permit once the
// first of the crashed holder's grants expires at the store, not before,
// and within a poll interval after; its token on that slot is greater than
// the crashed holder's.
func TestSemaphoreCrashedHolderFreesSlotAfterTTL(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const ttl, permits = 4 * time.Second, 3
		b := memlease.New()
		crashed := semaphoreManager(t, b, ttl, lease.WithoutAutoRenew())
		waiter := semaphoreManager(t, b, ttl, lease.WithPollInterval(200*time.Millisecond))
		s := newSemaphore(t, crashed, "jobs", permits)
		held := map[string]fence.Token{}
		var first time.Time
		for i := range permits {
			l, err := s.TryAcquire(context.Background())
			if err != nil {
				t.Fatalf("TryAcquire %d: %v", i, err)
			}
			if i == 0 {
				first = time.Now()
			}
			held[l.Name()] = l.Token()
			time.Sleep(100 * time.Millisecond) // the grants expire one after another
		}
		ws := newSemaphore(t, waiter, "jobs", permits)
		if _, err := ws.TryAcquire(context.Background()); !errors.Is(err, lease.ErrNotAcquired) {
			t.Fatalf("TryAcquire on a full semaphore = %v, want ErrNotAcquired", err)
		}
		l, err := ws.Acquire(context.Background())
		if err != nil {
			t.Fatalf("Acquire: %v", err)
		}
		defer l.Release(context.Background()) //nolint:errcheck
		got := time.Since(first)
		if got < ttl || got > ttl+waiter.Options().PollInterval {
			t.Fatalf("permit granted %v after the crashed holder's first grant, want between its TTL %v and a poll interval later", got, ttl)
		}
		old, ok := held[l.Name()]
		if !ok || l.Token() <= old {
			t.Fatalf("waiter got %q token %d; the crashed holder had %v", l.Name(), l.Token(), held)
		}
	})
}

// TestSemaphoreAcquireHonoursContext: a waiter on a full semaphore gives up
// when its context ends, with ErrNotAcquired and the context's error, and
// leaves no grant behind: every slot is still the first holder's, and once
// those are released a new waiter gets each slot.
func TestSemaphoreAcquireHonoursContext(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := memlease.New()
		m := semaphoreManager(t, b, 10*time.Second)
		s := newSemaphore(t, m, "exports", 2)
		var held []*lease.Lease
		for range 2 {
			l, err := s.TryAcquire(context.Background())
			if err != nil {
				t.Fatal(err)
			}
			held = append(held, l)
		}
		_, err := s.TryAcquire(context.Background())
		var na *lease.NotAcquiredError
		if !errors.Is(err, lease.ErrNotAcquired) || !errors.As(err, &na) || na.RetryAfter <= 0 || !slices.Contains(s.Slots(), na.Name) {
			t.Fatalf("TryAcquire on a full semaphore = %v, want a *NotAcquiredError of a slot with RetryAfter", err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
		defer cancel()
		start := time.Now()
		_, err = s.Acquire(ctx)
		if !errors.Is(err, lease.ErrNotAcquired) || !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("Acquire past its context = %v, want ErrNotAcquired and DeadlineExceeded", err)
		}
		if waited := time.Since(start); waited != 3*time.Second {
			t.Fatalf("Acquire returned after %v, want at its context's deadline, 3s", waited)
		}
		cancelled, cancelNow := context.WithCancel(context.Background())
		cancelNow()
		if _, err := s.Acquire(cancelled); !errors.Is(err, context.Canceled) {
			t.Fatalf("Acquire with a cancelled context = %v", err)
		}
		for _, l := range held {
			h, err := m.Holder(context.Background(), l.Name())
			if err != nil || h.Owner != l.Owner() || h.Token != l.Token() {
				t.Fatalf("slot %q after the waiters gave up: %+v, %v; want the first holder's grant", l.Name(), h, err)
			}
			if err := l.Release(context.Background()); err != nil {
				t.Fatal(err)
			}
		}
		for range 2 {
			l, err := s.TryAcquire(context.Background())
			if err != nil {
				t.Fatalf("TryAcquire after release: %v", err)
			}
			defer l.Release(context.Background()) //nolint:errcheck
		}
	})
}

// TestSemaphoreWaiterWokenByRelease: with a Watcher backend a waiter on a
// full semaphore is woken by the release of any slot, at once, long before
// its poll interval.
func TestSemaphoreWaiterWokenByRelease(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := memlease.New()
		m := semaphoreManager(t, b, 20*time.Second, lease.WithPollInterval(10*time.Second))
		s := newSemaphore(t, m, "render", 3)
		var held []*lease.Lease
		for range 3 {
			l, err := s.TryAcquire(context.Background())
			if err != nil {
				t.Fatal(err)
			}
			held = append(held, l)
		}
		got := make(chan *lease.Lease)
		go func() {
			l, err := s.Acquire(context.Background())
			if err != nil {
				panic(err)
			}
			got <- l
		}()
		time.Sleep(time.Second)
		synctest.Wait()
		freed := held[1+mrand.IntN(2)]
		releasedAt := time.Now()
		if err := freed.Release(context.Background()); err != nil {
			t.Fatal(err)
		}
		l := <-got
		if time.Since(releasedAt) != 0 || l.Name() != freed.Name() || l.Token() <= freed.Token() {
			t.Fatalf("waiter got %q token %d %v after the release of %q token %d", l.Name(), l.Token(), time.Since(releasedAt), freed.Name(), freed.Token())
		}
		for _, h := range append(held, l) {
			_ = h.Release(context.Background())
		}
	})
}

// TestSemaphoreStalePermitIsFencedPerSlot: a permit holder paused past its
// deadline has its write rejected by a per-slot fence (fencecheck.Memory,
// keyed by the slot name) once its slot's next holder has written, while
// the other permit's writes go on.
func TestSemaphoreStalePermitIsFencedPerSlot(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := memlease.New()
		paused := semaphoreManager(t, b, 2*time.Second, lease.WithoutAutoRenew())
		live := semaphoreManager(t, b, 2*time.Second)
		ps, ls := newSemaphore(t, paused, "etl", 2), newSemaphore(t, live, "etl", 2)
		checker := fencecheck.NewMemory()
		ctx := context.Background()
		stale, err := ps.TryAcquire(ctx)
		if err != nil {
			t.Fatal(err)
		}
		other, err := ls.TryAcquire(ctx)
		if err != nil {
			t.Fatal(err)
		}
		for _, l := range []*lease.Lease{stale, other} {
			if err := checker.Check(ctx, l.Name(), l.Token()); err != nil {
				t.Fatalf("first write of %q: %v", l.Name(), err)
			}
		}
		time.Sleep(3 * time.Second) // the paused holder's grant expires
		next, err := ls.Acquire(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if next.Name() != stale.Name() {
			t.Fatalf("next permit on %q, want the expired slot %q", next.Name(), stale.Name())
		}
		if err := checker.Check(ctx, next.Name(), next.Token()); err != nil {
			t.Fatalf("new holder's write: %v", err)
		}
		err = checker.Check(ctx, stale.Name(), stale.Token())
		var se *fence.StaleError
		if !errors.As(err, &se) || !errors.Is(err, fence.ErrStaleToken) {
			t.Fatalf("stale permit's write = %v, want a *fence.StaleError", err)
		}
		if err := checker.Check(ctx, other.Name(), other.Token()); err != nil {
			t.Fatalf("the other permit's write after the stale one was refused: %v", err)
		}
		_ = next.Release(ctx)
		_ = other.Release(ctx)
		_ = stale.Release(ctx)
	})
}

// TestNewSemaphoreRefusesBadInput: every problem is reported at once,
// before any I/O, each matching its sentinel.
func TestNewSemaphoreRefusesBadInput(t *testing.T) {
	m := semaphoreManager(t, memlease.New(), time.Second)
	long := strings.Repeat("n", driver.MaxNameLen-len("#permit/9"))
	for _, tc := range []struct {
		m       *lease.Manager
		name    string
		permits int
		want    []error
	}{
		{m, "ok", 0, []error{lease.ErrInvalidOptions}},
		{m, "ok", -3, []error{lease.ErrInvalidOptions}},
		{m, "ok", lease.MaxPermits + 1, []error{lease.ErrInvalidOptions}},
		{m, "", 2, []error{lease.ErrInvalidName}},
		{m, "bad\x00", 2, []error{lease.ErrInvalidName}},
		{m, "x#permit/3", 2, []error{lease.ErrInvalidName}},
		{m, long + "x", 10, []error{lease.ErrInvalidName}}, // "#permit/9" one byte over
		{nil, "", 0, []error{lease.ErrInvalidOptions, lease.ErrInvalidName}},
	} {
		s, err := lease.NewSemaphore(tc.m, tc.name, tc.permits)
		if s != nil || err == nil {
			t.Errorf("NewSemaphore(%q, %d) = %v, %v; want an error", tc.name, tc.permits, s, err)
			continue
		}
		for _, want := range tc.want {
			if !errors.Is(err, want) {
				t.Errorf("NewSemaphore(%q, %d) = %v; want it to match %v", tc.name, tc.permits, err, want)
			}
		}
	}
	if s, err := lease.NewSemaphore(m, long, 10); err != nil || s.Slots()[9] != long+"#permit/9" || len(s.Slots()[9]) != driver.MaxNameLen {
		t.Fatalf("NewSemaphore with the longest name that fits: %v", err)
	}
	if s, err := lease.NewSemaphore(m, "ok", lease.MaxPermits); err != nil || s.Permits() != lease.MaxPermits {
		t.Fatalf("NewSemaphore with MaxPermits: %v", err)
	}
}

// TestSlotNamesAreReserved: a plain lease cannot take a slot's name, so a
// lease of the Manager's own never counts against (or steals) a permit;
// names merely like it stay valid, and Holder reads a slot.
func TestSlotNamesAreReserved(t *testing.T) {
	m := semaphoreManager(t, memlease.New(), time.Second)
	ctx := context.Background()
	for _, n := range []string{lease.SlotName("jobs", 0), "jobs#permit/17", "#permit/0"} {
		if _, err := m.TryAcquire(ctx, n); !errors.Is(err, lease.ErrInvalidName) {
			t.Errorf("TryAcquire(%q) = %v, want ErrInvalidName", n, err)
		}
		if err := lease.ValidateName(n); !errors.Is(err, lease.ErrInvalidName) {
			t.Errorf("ValidateName(%q) = %v, want ErrInvalidName", n, err)
		}
	}
	for _, n := range []string{"jobs#permit/", "jobs#permit/1x", "jobs#permit", "jobs/permit/1", "jobs#permit/1/x"} {
		l, err := m.TryAcquire(ctx, n)
		if err != nil {
			t.Errorf("TryAcquire(%q) = %v, want a lease", n, err)
			continue
		}
		_ = l.Release(ctx)
	}
	s := newSemaphore(t, m, "jobs", 1)
	l, err := s.TryAcquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Release(ctx) //nolint:errcheck
	if h, err := m.Holder(ctx, l.Name()); err != nil || h.Token != l.Token() {
		t.Fatalf("Holder(%q) = %+v, %v", l.Name(), h, err)
	}
}

// lostReplyBackend applies the first acquire request it gets and then
// answers it with an error, as a store whose reply was lost: the caller
// cannot know the slot was granted.
type lostReplyBackend struct {
	*memlease.Backend
	once sync.Once
}

func (b *lostReplyBackend) Acquire(ctx context.Context, req driver.Request) (driver.Grant, error) {
	g, err := b.Backend.Acquire(ctx, req)
	lost := false
	b.once.Do(func() { lost = err == nil })
	if lost {
		return driver.Grant{}, errors.New("connection reset by peer")
	}
	return g, err
}

// TestSemaphoreAbandonsSlotsOfUnknownOutcome: a slot whose acquire reply
// was lost while another slot was granted is abandoned at the store, so it
// is free for the next holder instead of taken for a TTL by a grant nobody
// holds (docs/design.md, invariant 4: no ghost grants).
func TestSemaphoreAbandonsSlotsOfUnknownOutcome(t *testing.T) {
	for _, try := range []bool{true, false} {
		t.Run(fmt.Sprintf("try=%v", try), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				b := &lostReplyBackend{Backend: memlease.New()}
				m := semaphoreManager(t, b, time.Minute)
				s := newSemaphore(t, m, "pool", 2)
				ctx := context.Background()
				acquire := s.Acquire
				if try {
					acquire = s.TryAcquire
				}
				l, err := acquire(ctx)
				if err != nil {
					t.Fatal(err)
				}
				defer l.Release(ctx) //nolint:errcheck
				for _, slot := range s.Slots() {
					h, err := m.Holder(ctx, slot)
					switch {
					case slot == l.Name() && (err != nil || h.Token != l.Token()):
						t.Fatalf("Holder(%q) = %+v, %v; want the permit's grant", slot, h, err)
					case slot != l.Name() && !errors.Is(err, lease.ErrNotHeld):
						t.Fatalf("Holder(%q) = %+v, %v; want the lost reply's grant abandoned", slot, h, err)
					}
				}
				other, err := s.TryAcquire(ctx)
				if err != nil {
					t.Fatalf("the other slot is not free: %v", err)
				}
				_ = other.Release(ctx)
			})
		})
	}
}

// TestSemaphoreRun: Run holds a permit for the work and releases it after,
// also when the work fails; the work's error is returned.
func TestSemaphoreRun(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		m := semaphoreManager(t, memlease.New(), 10*time.Second)
		s := newSemaphore(t, m, "workers", 1)
		ctx := context.Background()
		boom := errors.New("boom")
		var slot string
		err := s.Run(ctx, func(ctx context.Context, l *lease.Lease) error {
			slot = l.Name()
			if _, err := s.TryAcquire(ctx); !errors.Is(err, lease.ErrNotAcquired) {
				t.Errorf("TryAcquire while Run holds the only permit = %v", err)
			}
			if tok, ok := fence.FromContext(ctx); !ok || tok != l.Token() {
				t.Errorf("the work's context carries token %d, %v; want %d", tok, ok, l.Token())
			}
			return boom
		})
		if !errors.Is(err, boom) || slot != s.Slots()[0] {
			t.Fatalf("Run = %v on %q", err, slot)
		}
		l, err := s.TryAcquire(ctx)
		if err != nil {
			t.Fatalf("the permit was not released after Run: %v", err)
		}
		_ = l.Release(ctx)
		if err := s.Run(ctx, nil); !errors.Is(err, lease.ErrInvalidOptions) {
			t.Fatalf("Run(nil) = %v", err)
		}
	})
}

// setupFailingBackend refuses every acquire as a store that is not set up.
type setupFailingBackend struct{ *memlease.Backend }

func (setupFailingBackend) Acquire(context.Context, driver.Request) (driver.Grant, error) {
	return driver.Grant{}, &driver.SetupError{Fix: "run fencekit migrate up"}
}

// noWatchBackend's Watch always fails: waiters must poll.
type noWatchBackend struct{ *memlease.Backend }

func (noWatchBackend) Watch(context.Context, string) (<-chan struct{}, func(), error) {
	return nil, nil, errors.New("pub/sub unavailable")
}

// TestSemaphoreAcquireStopsOnSetupError: a store that is not set up ends
// Acquire at once with ErrSetup, not at its context's end.
func TestSemaphoreAcquireStopsOnSetupError(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		m := semaphoreManager(t, setupFailingBackend{memlease.New()}, time.Second)
		s := newSemaphore(t, m, "jobs", 3)
		start := time.Now()
		if _, err := s.Acquire(context.Background()); !errors.Is(err, lease.ErrSetup) || time.Since(start) != 0 {
			t.Fatalf("Acquire = %v after %v, want ErrSetup at once", err, time.Since(start))
		}
		if _, err := s.TryAcquire(context.Background()); !errors.Is(err, lease.ErrSetup) {
			t.Fatalf("TryAcquire = %v, want ErrSetup", err)
		}
	})
}

// TestSemaphoreWaiterPollsWhenWatchFails: when the store cannot watch, a
// waiter still gets a released slot, within a poll interval.
func TestSemaphoreWaiterPollsWhenWatchFails(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const poll = 500 * time.Millisecond
		m := semaphoreManager(t, noWatchBackend{memlease.New()}, time.Minute, lease.WithPollInterval(poll))
		s := newSemaphore(t, m, "jobs", 2)
		var held []*lease.Lease
		for range 2 {
			l, err := s.TryAcquire(context.Background())
			if err != nil {
				t.Fatal(err)
			}
			held = append(held, l)
		}
		got := make(chan *lease.Lease)
		go func() {
			l, err := s.Acquire(context.Background())
			if err != nil {
				panic(err)
			}
			got <- l
		}()
		time.Sleep(3 * poll)
		releasedAt := time.Now()
		if err := held[0].Release(context.Background()); err != nil {
			t.Fatal(err)
		}
		l := <-got
		if waited := time.Since(releasedAt); waited > poll || l.Name() != held[0].Name() {
			t.Fatalf("waiter got %q %v after the release of %q; want that slot within the poll interval %v", l.Name(), waited, held[0].Name(), poll)
		}
		_ = l.Release(context.Background())
		_ = held[1].Release(context.Background())
	})
}
