package lease_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/fencekit/fencekit/lease"
	"github.com/fencekit/fencekit/lease/driver"
	"github.com/fencekit/fencekit/lease/memlease"
)

// lateRenewals is a store that renews at once but answers a renewal only
// renewDelay later (the reply is held up on its way back), and whose
// first release (the give-back of the grant it renewed) takes
// giveBackDelay after the store deleted the grant. It counts the releases
// in flight.
type lateRenewals struct {
	*memlease.Backend
	renewDelay, giveBackDelay time.Duration
	releases                  atomic.Int32 // calls made
	inFlight                  atomic.Int32 // calls not yet returned
}

func (b *lateRenewals) Renew(ctx context.Context, g driver.Grant) error {
	err := b.Backend.Renew(ctx, g)
	time.Sleep(b.renewDelay)
	return err
}

func (b *lateRenewals) RenewBatch(ctx context.Context, gs []driver.Grant, done func(int, error)) {
	errs := make([]error, len(gs))
	b.Backend.RenewBatch(ctx, gs, func(i int, err error) { errs[i] = err })
	time.Sleep(b.renewDelay)
	for i, err := range errs {
		done(i, err)
	}
}

func (b *lateRenewals) Release(ctx context.Context, g driver.Grant) error {
	b.inFlight.Add(1)
	defer b.inFlight.Add(-1)
	err := b.Backend.Release(ctx, g)
	if b.releases.Add(1) == 1 {
		time.Sleep(b.giveBackDelay)
	}
	return err
}

// acquireLate acquires the lease "late" over b, with a TTL of 1 s.
func acquireLate(t *testing.T, b *lateRenewals, opts ...lease.Option) *lease.Lease {
	t.Helper()
	m, err := lease.NewManager(b, time.Second, opts...)
	if err != nil {
		t.Fatal(err)
	}
	l, err := m.TryAcquire(context.Background(), "late")
	if err != nil {
		t.Fatal(err)
	}
	return l
}

// A heartbeat that the store answered after the lease's local deadline
// finds the lease lost here but renewed at the store, and gives the grant
// back. A Release of that lease returns only once that give-back has been
// answered: when Release returns, the Manager sends nothing more for the
// lease, with heartbeats batched or not.
func TestReleaseWaitsForAGiveBackInFlight(t *testing.T) {
	for _, window := range []time.Duration{lease.NoBatching, 0} {
		t.Run(map[bool]string{true: "one by one", false: "batched"}[window == lease.NoBatching], func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				b := &lateRenewals{Backend: memlease.New(), renewDelay: time.Second, giveBackDelay: 500 * time.Millisecond}
				l := acquireLate(t, b, lease.WithRenewBatchWindow(window))
				ctx := context.Background()
				// The first heartbeat goes out at about a third of the
				// TTL, the lease is lost at its deadline, the heartbeat's
				// reply comes a second after it went out, and its
				// give-back is under way for the next half second.
				time.Sleep(1500 * time.Millisecond)
				if !errors.Is(l.Err(), lease.ErrLost) {
					t.Fatalf("Err = %v before the release; want the lease lost at its deadline", l.Err())
				}
				if b.inFlight.Load() != 1 {
					t.Fatalf("%d releases in flight before Release; want the give-back", b.inFlight.Load())
				}
				if err := l.Release(ctx); !errors.Is(err, lease.ErrLost) {
					t.Errorf("Release = %v, want the loss", err)
				}
				if n := b.inFlight.Load(); n != 0 {
					t.Errorf("Release returned with %d request for the lease still in flight (the give-back)", n)
				}
				time.Sleep(time.Second) // the give-back ends before the bubble does
			})
		})
	}
}

// A Renew that the store answered after the lease's local deadline reports
// the loss (the lease ended at its deadline, and the late success does not
// revive it), and returns once the grant it renewed is given back.
func TestRenewAnsweredAfterTheDeadlineReportsTheLoss(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		mem := memlease.New()
		b := &lateRenewals{Backend: mem, renewDelay: 1500 * time.Millisecond}
		l := acquireLate(t, b, lease.WithoutAutoRenew())
		ctx := context.Background()
		err := l.Renew(ctx)
		if !errors.Is(err, lease.ErrLost) || !errors.Is(l.Err(), lease.ErrLost) {
			t.Fatalf("Renew answered after the deadline = %v (Err %v), want the loss", err, l.Err())
		}
		if b.releases.Load() != 1 || b.inFlight.Load() != 0 {
			t.Fatalf("when Renew returned, %d give-backs were sent and %d in flight; want one, answered", b.releases.Load(), b.inFlight.Load())
		}
		if _, err := mem.Holder(ctx, "late"); !errors.Is(err, lease.ErrNotHeld) {
			t.Fatalf("the store still holds the grant the late renewal extended: %v", err)
		}
	})
}
