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

func (m *memLedger) Claim(_ context.Context, job, key string, t fence.Token) (bool, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	run := job + "\x00" + key
	if cur := m.newest[run]; cur > t {
		return false, fence.Stale(run, t, cur)
	}
	m.newest[run] = t
	_, done := m.done[run]
	return done, nil
}

func (m *memLedger) MarkDone(_ context.Context, job, key string, t fence.Token) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	run := job + "\x00" + key
	if cur := m.newest[run]; cur > t {
		return fence.Stale(run, t, cur)
	}
	m.newest[run] = t
	if _, ok := m.done[run]; !ok {
		m.done[run] = t
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

// Jobs that share a ledger and a run key each run once: RunOnce names the
// run by its lease name, and ForJob gives jobs under one lease name runs
// of their own.
func TestRunOnceKeepsJobsApartInOneLedger(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		m, _ := lease.NewManager(memlease.New(), time.Second)
		led := &memLedger{newest: map[string]fence.Token{}, done: map[string]fence.Token{}}
		runs := map[string]int{}
		job := func(name string) func(context.Context, *lease.Lease) error {
			return func(context.Context, *lease.Lease) error { runs[name]++; return nil }
		}
		for range 2 {
			for _, c := range []struct {
				lease, job string
				ledger     lease.Ledger
			}{
				{"settle-orders", "settle-orders", led},
				{"send-reminders", "send-reminders", led},
				{"nightly", "invoices", lease.ForJob(led, "invoices")},
				{"nightly", "reports", lease.ForJob(led, "reports")},
			} {
				if _, err := m.RunOnce(context.Background(), c.lease, "2026-12-01", c.ledger, job(c.job)); err != nil {
					t.Fatalf("%s: %v", c.job, err)
				}
			}
		}
		for _, j := range []string{"settle-orders", "send-reminders", "invoices", "reports"} {
			if runs[j] != 1 {
				t.Errorf("job %s ran %d times for 2026-12-01; want once (runs %v)", j, runs[j], runs)
			}
		}
		ran, err := m.RunOnce(context.Background(), "nightly", "2026-12-02", lease.ForJob(led, ""), job("x"))
		if ran || !errors.Is(err, lease.ErrInvalidOptions) {
			t.Errorf("RunOnce through ForJob(ledger, \"\") = %v, %v; want ErrInvalidOptions, nothing run", ran, err)
		}
	})
}
