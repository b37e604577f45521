package redislease_test

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fencekit/fencekit/internal/testkit"
	"github.com/fencekit/fencekit/lease"
	"github.com/fencekit/fencekit/lease/driver"
	"github.com/fencekit/fencekit/lease/redislease"
	"github.com/fencekit/fencekit/lease/redislease/redistest"
)

// slowBatchBackend holds the first heartbeat batch at the store for a
// while, and records when it answered and when a release was sent.
type slowBatchBackend struct {
	*redislease.Backend
	hold          time.Duration
	once          sync.Once
	batchEntered  chan struct{}
	batchAnswered atomic.Int64 // unix nanoseconds of the last done call
	releaseSent   atomic.Int64
}

func (r *slowBatchBackend) RenewBatch(ctx context.Context, gs []driver.Grant, done func(int, error)) {
	first := false
	r.once.Do(func() { first = true })
	if !first {
		r.Backend.RenewBatch(ctx, gs, done)
		return
	}
	close(r.batchEntered)
	time.Sleep(r.hold)
	// A grant's renewal is answered when done is called for it (the
	// Manager acts on it then, not when RenewBatch returns).
	r.Backend.RenewBatch(ctx, gs, func(i int, err error) {
		r.batchAnswered.Store(time.Now().UnixNano())
		done(i, err)
	})
}

func (r *slowBatchBackend) Release(ctx context.Context, g driver.Grant) error {
	r.releaseSent.Store(time.Now().UnixNano())
	return r.Backend.Release(ctx, g)
}

// A heartbeat batch is in flight when Release begins: the release is sent
// only after the batch was answered (so the renewal can never reach the
// store after the release deleted the grant), and the release is reported
// as a release (nil, and ErrReleased as the lease's end), not a loss.
func TestReleaseWaitsForRenewalInFlight(t *testing.T) {
	c := redistest.Shared(t)
	rb := &slowBatchBackend{
		Backend:      newBackend(t, c, redistest.Prefix(t)),
		hold:         300 * time.Millisecond,
		batchEntered: make(chan struct{}),
	}
	m := testkit.NewManager(t, rb, 3*time.Second, lease.WithRenewInterval(200*time.Millisecond), lease.WithRenewBatchWindow(10*time.Millisecond))
	l := testkit.TryAcquire(t, m, "release-while-renewing")
	select {
	case <-rb.batchEntered:
	case <-time.After(5 * time.Second):
		t.Fatal("no heartbeat batch within 5 s")
	}
	err := l.Release(testkit.Context(t))
	if err != nil || !errors.Is(l.Err(), lease.ErrReleased) {
		t.Fatalf("Release while a renewal was in flight = %v (lease ended with %v); want nil and ErrReleased", err, l.Err())
	}
	if sent, back := rb.releaseSent.Load(), rb.batchAnswered.Load(); sent == 0 || back == 0 || sent < back {
		t.Fatalf("release sent at %d, the batch in flight answered at %d: the release must wait for the batch", sent, back)
	}
}
