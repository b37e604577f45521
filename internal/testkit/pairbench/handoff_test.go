package pairbench

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"
)

// memLocks is a BlockingLock over in-process locks, one per name, that
// fails every failEvery-th acquire when failEvery is set.
type memLocks struct {
	failEvery int

	mu    sync.Mutex
	locks map[string]chan struct{}
	calls int
}

func (m *memLocks) lock(ctx context.Context, name string) (func(context.Context) error, error) {
	m.mu.Lock()
	m.calls++
	if m.failEvery > 0 && m.calls%m.failEvery == 0 {
		m.mu.Unlock()
		return nil, errors.New("gave up")
	}
	if m.locks == nil {
		m.locks = map[string]chan struct{}{}
	}
	ch := m.locks[name]
	if ch == nil {
		ch = make(chan struct{}, 1)
		m.locks[name] = ch
	}
	m.mu.Unlock()
	select {
	case ch <- struct{}{}:
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	return func(context.Context) error {
		<-ch
		return nil
	}, nil
}

var testHandoff = Handoff{Groups: 2, Waiters: 2, HoldMin: time.Millisecond, HoldSpread: time.Millisecond, RejoinSpread: time.Millisecond}

// Run measures exactly b.N hand-offs, and with RetryGiveUps counts the
// failed acquires it made again.
func TestHandoffRun(t *testing.T) {
	for _, retry := range []bool{false, true} {
		h := testHandoff
		h.RetryGiveUps = retry
		locks := &memLocks{}
		if retry {
			locks.failEvery = 5
		}
		var res HandoffResult
		var n int
		r := testing.Benchmark(func(b *testing.B) {
			res, n = h.Run(b, func() BlockingLock { return locks.lock }), b.N
		})
		if r.N == 0 || n != r.N {
			t.Fatalf("retry=%v: the benchmark failed (N %d, last b.N %d)", retry, r.N, n)
		}
		if len(res.Samples) != n {
			t.Errorf("retry=%v: %d samples, want b.N = %d", retry, len(res.Samples), n)
		}
		if retry && res.GiveUps == 0 {
			t.Errorf("retry=%v: no give-ups counted, with every 5th acquire failing", retry)
		}
		if !retry && res.GiveUps != 0 {
			t.Errorf("retry=%v: %d give-ups counted", retry, res.GiveUps)
		}
	}
}

// Without RetryGiveUps a failed acquire fails the benchmark.
func TestHandoffRunFailsOnAGiveUp(t *testing.T) {
	locks := &memLocks{failEvery: 3}
	r := testing.Benchmark(func(b *testing.B) {
		testHandoff.Run(b, func() BlockingLock { return locks.lock })
	})
	if r.N != 0 {
		t.Fatalf("the benchmark ran to N = %d with every 3rd acquire failing", r.N)
	}
}
