package lease_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/fencekit/fencekit/fence"
	"github.com/fencekit/fencekit/lease"
	"github.com/fencekit/fencekit/lease/memlease"
)

// memLedger is a Ledger kept in memory, with the fencing rule of a guard.
type memLedger struct {
	mu     sync.Mutex
	newest map[string]fence.Token
	done   map[string]fence.Token
}

func (m *memLedger) Claim(_ context.Context, key string, t fence.Token) (bool, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if cur := m.newest[key]; cur > t {
		return false, fence.Stale(key, t, cur)
	}
	m.newest[key] = t
	_, done := m.done[key]
	return done, nil
}

func (m *memLedger) MarkDone(_ context.Context, key string, t fence.Token) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if cur := m.newest[key]; cur > t {
		return fence.Stale(key, t, cur)
	}
	m.newest[key] = t
	if _, ok := m.done[key]; !ok {
		m.done[key] = t
	}
	return nil
}

// Replicas that run the same job for the same key run it once, in turn;
// a failed run leaves the key to the next; another key runs again.
func TestRunOnceRunsEachKeyOnce(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := memlease.New()
		led := &memLedger{newest: map[string]fence.Token{}, done: map[string]fence.Token{}}
		var (
			mu   sync.Mutex
			runs = map[string]int{}
		)
		job := func(key string, fail bool) func(context.Context, *lease.Lease) error {
			return func(context.Context, *lease.Lease) error {
				mu.Lock()
				runs[key]++
				mu.Unlock()
				time.Sleep(100 * time.Millisecond)
				if fail {
					return errors.New("job failed")
				}
				return nil
			}
		}
		var wg sync.WaitGroup
		ranCount := 0
		for i := range 3 {
			m, err := lease.NewManager(b, time.Second)
			if err != nil {
				t.Fatal(err)
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				// The first replica's run fails: the next one runs it.
				ran, err := m.RunOnce(context.Background(), "nightly", "day-1", led, job("day-1", i == 0))
				if ran && err == nil {
					mu.Lock()
					ranCount++
					mu.Unlock()
				}
			}()
			synctest.Wait()
		}
		wg.Wait()
		if runs["day-1"] != 2 || ranCount != 1 {
			t.Fatalf("day-1 ran %d times (%d succeeded), want 2 (a failure, then one success)", runs["day-1"], ranCount)
		}
		m, _ := lease.NewManager(b, time.Second)
		ran, err := m.RunOnce(context.Background(), "nightly", "day-2", led, job("day-2", false))
		if !ran || err != nil || runs["day-2"] != 1 {
			t.Fatalf("day-2: ran %v err %v runs %d", ran, err, runs["day-2"])
		}
		ran, err = m.RunOnce(context.Background(), "nightly", "day-2", led, job("day-2", false))
		if ran || err != nil || runs["day-2"] != 1 {
			t.Fatalf("day-2 again: ran %v err %v runs %d; want skipped", ran, err, runs["day-2"])
		}
	})
}

func TestRunOnceRefusesBadInput(t *testing.T) {
	m, _ := lease.NewManager(memlease.New(), time.Second)
	fn := func(context.Context, *lease.Lease) error { t.Error("ran"); return nil }
	led := &memLedger{}
	if _, err := m.RunOnce(context.Background(), "n", "", led, fn); !errors.Is(err, lease.ErrInvalidKey) {
		t.Fatalf("empty key: %v", err)
	}
	if _, err := m.RunOnce(context.Background(), "n", "k", nil, fn); !errors.Is(err, lease.ErrInvalidOptions) {
		t.Fatalf("nil ledger: %v", err)
	}
	if _, err := m.RunOnce(context.Background(), "n", "k", led, nil); !errors.Is(err, lease.ErrInvalidOptions) {
		t.Fatalf("nil fn: %v", err)
	}
	if _, err := m.RunOnce(context.Background(), "", "k", led, fn); !errors.Is(err, lease.ErrInvalidName) {
		t.Fatalf("empty name: %v", err)
	}
}
