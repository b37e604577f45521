package lease_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/fencekit/fencekit/lease"
	"github.com/fencekit/fencekit/lease/driver"
)

// noLine is a memory store that does not keep waiters in line.
type noLine struct{ *lease.MemoryBackend }

func (n noLine) Limits() driver.Limits {
	l := n.MemoryBackend.Limits()
	l.Queues = false
	return l
}

func TestFIFOOptionsAreChecked(t *testing.T) {
	_, err := lease.NewManager(noLine{lease.NewMemoryBackend()}, time.Second, lease.WithFIFO())
	if !errors.Is(err, lease.ErrInvalidOptions) || !errors.Is(err, errors.ErrUnsupported) {
		t.Fatalf("FIFO over a backend without a line: NewManager = %v, want ErrInvalidOptions and errors.ErrUnsupported", err)
	}
	if _, err := lease.NewManager(noLine{lease.NewMemoryBackend()}, time.Second); err != nil {
		t.Fatalf("without FIFO the same backend must do: %v", err)
	}
	_, err = lease.NewManager(lease.NewMemoryBackend(), time.Second, lease.WithFIFO(), lease.WithPollInterval(600*time.Millisecond))
	if !errors.Is(err, lease.ErrInvalidOptions) {
		t.Fatalf("FIFO with a poll interval over TTL/2: NewManager = %v, want ErrInvalidOptions", err)
	}
	m, err := lease.NewManager(lease.NewMemoryBackend(), time.Second, lease.WithFIFO())
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
				m, err := lease.NewManager(lease.NewMemoryBackend(), time.Second, lease.WithFIFO())
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
