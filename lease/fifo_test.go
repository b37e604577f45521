package lease_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/fencekit/fencekit/internal/testkit"
	"github.com/fencekit/fencekit/lease"
	"github.com/fencekit/fencekit/lease/driver"
	"github.com/fencekit/fencekit/lease/memlease"
)

// noLine is a memory store that does not keep waiters in line.
type noLine struct{ *memlease.Backend }

func (n noLine) Limits() driver.Limits {
	l := n.Backend.Limits()
	l.Queues = false
	return l
}

func TestFIFOOptionsAreChecked(t *testing.T) {
	_, err := lease.NewManager(noLine{memlease.New()}, time.Second, lease.WithFIFO())
	if !errors.Is(err, lease.ErrInvalidOptions) || !errors.Is(err, errors.ErrUnsupported) {
		t.Fatalf("FIFO over a backend without a line: NewManager = %v, want ErrInvalidOptions and errors.ErrUnsupported", err)
	}
	if _, err := lease.NewManager(noLine{memlease.New()}, time.Second); err != nil {
		t.Fatalf("without FIFO the same backend must do: %v", err)
	}
	_, err = lease.NewManager(memlease.New(), time.Second, lease.WithFIFO(), lease.WithPollInterval(600*time.Millisecond))
	if !errors.Is(err, lease.ErrInvalidOptions) {
		t.Fatalf("FIFO with a poll interval over TTL/2: NewManager = %v, want ErrInvalidOptions", err)
	}
	m, err := lease.NewManager(memlease.New(), time.Second, lease.WithFIFO())
	if err != nil || !m.Options().FIFO {
		t.Fatalf("FIFO over memlease: %v, Options().FIFO = %v", err, m != nil && m.Options().FIFO)
	}
}

// TestFIFOSharesGrantsEquallyInVirtualTime: contenders that each take the
// lease, hold it for a moment and ask again are served in turn with FIFO:
// shares differ by at most one grant, and no contender waits longer than
// one turn of all the others.
func TestFIFOSharesGrantsEquallyInVirtualTime(t *testing.T) {
	for _, contenders := range []int{2, 5, 8} {
		t.Run(fmt.Sprint(contenders), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				const hold, run = time.Millisecond, 2 * time.Second
				m, err := lease.NewManager(memlease.New(), time.Second, lease.WithFIFO())
				if err != nil {
					t.Fatal(err)
				}
				ctx, cancel := context.WithTimeout(context.Background(), run)
				defer cancel()
				grants := make([]int, contenders)
				waits := make([]time.Duration, contenders)
				var wg sync.WaitGroup
				for c := range contenders {
					wg.Go(func() {
						for {
							began := time.Now()
							l, err := m.Acquire(ctx, "fair")
							if err != nil {
								return
							}
							grants[c]++
							waits[c] = max(waits[c], time.Since(began))
							time.Sleep(hold)
							if err := l.Release(context.Background()); err != nil {
								t.Errorf("contender %d: Release: %v", c, err)
								return
							}
						}
					})
				}
				wg.Wait()
				lo, hi := slices.Min(grants), slices.Max(grants)
				if hi-lo > 1 || lo == 0 {
					t.Fatalf("grants per contender %v: with FIFO shares must differ by at most one", grants)
				}
				// A turn of the others: each holds for hold, and the
				// hand-off takes no virtual time.
				if w := slices.Max(waits); w > time.Duration(contenders)*hold {
					t.Fatalf("longest wait %v, more than one turn of %d contenders holding %v each", w, contenders, hold)
				}
			})
		})
	}
}

// fifoManager is a FIFO Manager over a new memory store.
func fifoManager(t *testing.T, ttl time.Duration) (*memlease.Backend, *lease.Manager) {
	t.Helper()
	b := memlease.New()
	m, err := lease.NewManager(b, ttl, lease.WithFIFO())
	if err != nil {
		t.Fatal(err)
	}
	return b, m
}

// TestFIFOAbandonmentInVirtualTime: in virtual time, with memlease, the
// exact moments at which the line moves on: a waiter whose context ends
// leaves at once (the one behind is granted at the release itself); a
// waiter whose process died (it stopped asking) holds the line until its
// place lapses, one TTL after it last asked, and no longer; a holder that
// died (it stopped renewing) holds it until its grant expires.
func TestFIFOAbandonmentInVirtualTime(t *testing.T) {
	const ttl = time.Second
	t.Run("context ended", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			_, m := fifoManager(t, ttl)
			h, err := m.TryAcquire(context.Background(), "n")
			if err != nil {
				t.Fatal(err)
			}
			expectQuitterLeaves(t, h, m, m)
		})
	})
	t.Run("waiter died", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			b, m := fifoManager(t, ttl)
			h, err := m.TryAcquire(context.Background(), "n")
			if err != nil {
				t.Fatal(err)
			}
			// The dead waiter asked once, as a Manager's first attempt
			// would, and never again.
			died := time.Now()
			_, err = b.Acquire(context.Background(), driver.Request{Name: "n", Owner: "dead/1", TTL: ttl, Queue: true})
			if !errors.Is(err, lease.ErrNotAcquired) {
				t.Fatalf("dead waiter's attempt: %v", err)
			}
			next := testkit.AcquireAsync(context.Background(), m, "n")
			synctest.Wait()
			time.Sleep(ttl / 4)
			if err := h.Release(context.Background()); err != nil {
				t.Fatal(err)
			}
			r := <-next
			if r.Err != nil {
				t.Fatal(r.Err)
			}
			// The place lapses at died + ttl; the waiter was told so
			// (RetryAfter) and asks again just after (pollWait: 1 ms
			// plus up to 5 ms of jitter).
			if d := r.At.Sub(died); d < ttl || d > ttl+10*time.Millisecond {
				t.Fatalf("the waiter behind a dead one was granted %v after the dead one last asked, want just after its TTL %v", d, ttl)
			}
			r.Lease.Release(context.Background())
		})
	})
	t.Run("holder died", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			b, m := fifoManager(t, ttl)
			crashed := time.Now()
			if _, err := b.Acquire(context.Background(), driver.Request{Name: "n", Owner: "crashed/1", TTL: ttl}); err != nil {
				t.Fatal(err)
			}
			first := testkit.AcquireAsync(context.Background(), m, "n")
			synctest.Wait()
			second := testkit.AcquireAsync(context.Background(), m, "n")
			synctest.Wait()
			r := <-first
			if r.Err != nil {
				t.Fatal(r.Err)
			}
			if d := r.At.Sub(crashed); d < ttl || d > ttl+10*time.Millisecond {
				t.Fatalf("the first waiter was granted %v after the holder's last renewal, want just after its TTL %v", d, ttl)
			}
			synctest.Wait() // the second waiter is blocked, or done
			select {
			case r2 := <-second:
				t.Fatalf("the second waiter was granted (%v) while the first holds the lease", r2.Err)
			default:
			}
			r.Lease.Release(context.Background())
			if r2 := <-second; r2.Err != nil {
				t.Fatal(r2.Err)
			} else {
				r2.Lease.Release(context.Background())
			}
		})
	})
}

// slowQuitter is a memory store that answers the owners of the Manager
// named "quitter" slowly: each Abandon reaches the store after abandonIn,
// and, with hold set, each acquire reply after the request has been
// applied is held until the caller's context ends. Both honour ctx.
type slowQuitter struct {
	*memlease.Backend
	abandonIn time.Duration
	hold      bool
	abandons  atomic.Int32 // the quitter's Abandon requests
}

func quitting(owner string) bool { return strings.HasPrefix(owner, "quitter/") }

func (s *slowQuitter) Acquire(ctx context.Context, r driver.Request) (driver.Grant, error) {
	g, err := s.Backend.Acquire(ctx, r)
	if s.hold && quitting(r.Owner) {
		<-ctx.Done()
		return driver.Grant{}, ctx.Err()
	}
	return g, err
}

func (s *slowQuitter) Abandon(ctx context.Context, r driver.Request) error {
	if quitting(r.Owner) {
		s.abandons.Add(1)
		select {
		case <-time.After(s.abandonIn):
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	return s.Backend.Abandon(ctx, r)
}

// A FIFO waiter whose context ends leaves the line even when the store
// takes its time to answer the Abandon (longer than PollInterval, before
// the place would lapse), and even when the Abandon of a request in flight
// at that moment, bounded by that request's own time, did not get its
// answer (it is sent again); when that Abandon was answered, it is the
// only one. Each time the waiter behind is granted at the release itself,
// not one TTL later when the place would lapse. In virtual time.
func TestFIFOWaiterLeavesTheLineOfASlowStore(t *testing.T) {
	const ttl = time.Second // PollInterval 500 ms, ReleaseTimeout 5 s
	for _, c := range []struct {
		name      string
		abandonIn time.Duration
		hold      bool
		abandons  int32
	}{
		{"waiting", 800 * time.Millisecond, false, 1},
		{"request in flight, its abandonment unanswered", 100 * time.Millisecond, true, 2},
		{"request in flight, its abandonment answered", 10 * time.Millisecond, true, 1},
	} {
		t.Run(c.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				b := &slowQuitter{Backend: memlease.New(), abandonIn: c.abandonIn, hold: c.hold}
				manager := func(id string) *lease.Manager {
					m, err := lease.NewManager(b, ttl, lease.WithFIFO(), lease.WithIdentity(id))
					if err != nil {
						t.Fatal(err)
					}
					return m
				}
				h, err := manager("holder").TryAcquire(context.Background(), "n")
				if err != nil {
					t.Fatal(err)
				}
				expectQuitterLeaves(t, h, manager("quitter"), manager("next"))
				if n := b.abandons.Load(); n != c.abandons {
					t.Fatalf("the quitter sent %d Abandon requests, want %d", n, c.abandons)
				}
			})
		})
	}
}

// expectQuitterLeaves runs, in a synctest bubble, a blocked Acquire by
// quitter behind h, then one by next behind it, ends the quitter's
// context, and once its Acquire has returned releases h: next must be
// granted at that very moment.
func expectQuitterLeaves(t *testing.T, h *lease.Lease, quitter, next *lease.Manager) {
	t.Helper()
	qctx, quit := context.WithCancel(context.Background())
	quitting := testkit.AcquireAsync(qctx, quitter, "n")
	synctest.Wait()
	behind := testkit.AcquireAsync(context.Background(), next, "n")
	synctest.Wait()
	quit()
	if r := <-quitting; !errors.Is(r.Err, lease.ErrNotAcquired) || !errors.Is(r.Err, context.Canceled) {
		t.Fatalf("cancelled waiter: %v", r.Err)
	}
	released := time.Now()
	if err := h.Release(context.Background()); err != nil {
		t.Fatal(err)
	}
	r := <-behind
	if r.Err != nil {
		t.Fatal(r.Err)
	}
	if d := r.At.Sub(released); d != 0 {
		t.Fatalf("the waiter behind one that gave up was granted %v after the release, want at once", d)
	}
	r.Lease.Release(context.Background())
}
