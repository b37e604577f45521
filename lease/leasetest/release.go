package leasetest

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fencekit/fencekit/lease"
	"github.com/fencekit/fencekit/lease/driver"
)

// The checks of releases: compare-and-delete on owner and token, the
// Manager's release semantics, and a release racing renewals.

func testReleaseCompares(t *testing.T, s *suite) {
	b := s.backend()
	n := name(t)
	g := mustAcquire(t, b, req(n, "a", s.long))
	other := g
	other.Owner = "b"
	if err := b.Release(ctxT(t), other); !errors.Is(err, lease.ErrNotHeld) {
		t.Fatalf("Release by another owner = %v, want ErrNotHeld", err)
	}
	wrong := g
	wrong.Token = g.Token + 1
	if err := b.Release(ctxT(t), wrong); !errors.Is(err, lease.ErrNotHeld) {
		t.Fatalf("Release by the owner with token %d (granted %d) = %v, want ErrNotHeld", wrong.Token, g.Token, err)
	}
	if _, err := s.connect().Acquire(ctxT(t), req(n, "c", s.long)); !errors.Is(err, lease.ErrNotAcquired) {
		t.Fatalf("after a foreign Release the lease must still be held; Acquire = %v", err)
	}
	release(t, b, g)
	// The same request again (a retry whose first reply was lost) is a
	// release, not a loss, and frees nothing of anyone else's.
	g2 := mustAcquire(t, s.connect(), req(n, "c", s.long))
	if err := b.Release(ctxT(t), g); err != nil {
		t.Fatalf("Release retried after it was applied = %v, want nil (a release, never ErrNotHeld)", err)
	}
	if _, err := s.connect().Acquire(ctxT(t), req(n, "d", s.long)); !errors.Is(err, lease.ErrNotAcquired) {
		t.Fatalf("a retried Release must not free the next holder's grant; Acquire = %v", err)
	}
	release(t, b, g2)
}

func testReleaseSemantics(t *testing.T, s *suite) {
	m := newManager(t, s.backend(), s.long)
	other := newManager(t, s.connect(), s.long)
	n := name(t)

	l, err := m.TryAcquire(ctxT(t), n)
	if err != nil {
		t.Fatalf("TryAcquire: %v", err)
	}
	if _, err := other.TryAcquire(ctxT(t), n); !errors.Is(err, lease.ErrNotAcquired) {
		t.Fatalf("TryAcquire of a held lease = %v, want ErrNotAcquired", err)
	}
	// Release with a context that is already cancelled still releases.
	cancelled, cancel := context.WithCancel(context.Background())
	cancel()
	if err := l.Release(cancelled); err != nil {
		t.Fatalf("Release with a cancelled context: %v", err)
	}
	if !errors.Is(context.Cause(l.Context()), lease.ErrReleased) || !errors.Is(l.Err(), lease.ErrReleased) {
		t.Fatalf("after Release: cause %v, Err %v; want ErrReleased", context.Cause(l.Context()), l.Err())
	}
	select {
	case <-l.Done():
	default:
		t.Fatal("Done not closed after Release")
	}
	// Twice is harmless.
	if err := l.Release(ctxT(t)); err != nil {
		t.Fatalf("second Release: %v", err)
	}
	if err := l.Renew(ctxT(t)); !errors.Is(err, lease.ErrReleased) {
		t.Fatalf("Renew after Release = %v, want ErrReleased", err)
	}
	l2, err := other.TryAcquire(ctxT(t), n)
	if err != nil {
		t.Fatalf("TryAcquire after release: %v", err)
	}
	if l2.Token() <= l.Token() {
		t.Fatalf("token %d after release <= %d", l2.Token(), l.Token())
	}
	if err := l2.Release(ctxT(t)); err != nil {
		t.Fatalf("Release: %v", err)
	}
}

// countingBackend records, per lease name, when the last release was sent
// and how many renew requests were sent after it.
type countingBackend struct {
	lease.Backend
	mu       sync.Mutex
	releases map[string]bool
	late     int
}

func (c *countingBackend) Renew(ctx context.Context, g driver.Grant) error {
	c.mu.Lock()
	if c.releases[g.Name] {
		c.late++
	}
	c.mu.Unlock()
	return c.Backend.Renew(ctx, g)
}

func (c *countingBackend) Release(ctx context.Context, g driver.Grant) error {
	c.mu.Lock()
	c.releases[g.Name] = true
	c.mu.Unlock()
	return c.Backend.Release(ctx, g)
}

// testReleaseRacingRenew: leases renewed as often as the Manager allows,
// released at random moments. A clean release is never reported as a loss,
// and no renew request is sent once the release was sent. (The batch path
// is covered by the lease package's own tests: a wrapper here would hide
// the backend's RenewBatch.)
func testReleaseRacingRenew(t *testing.T, s *suite) {
	cb := &countingBackend{Backend: s.backend(), releases: map[string]bool{}}
	// A long TTL, so that no lease can expire meanwhile: every loss
	// reported is false. Renewals as often as the short TTL would need.
	m := newManager(t, cb, s.long, lease.WithRenewInterval(max(time.Millisecond, s.short/8)), lease.WithRenewBatchWindow(lease.NoBatching))
	base := name(t)
	var lostReleases atomic.Int64
	var wg sync.WaitGroup
	const workers, rounds = 4, 25
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range rounds {
				l, err := m.TryAcquire(ctxT(t), fmt.Sprintf("%s-%d-%d", base, w, i))
				if err != nil {
					t.Errorf("TryAcquire: %v", err)
					return
				}
				time.Sleep(time.Duration(i%5) * m.Options().RenewInterval / 2)
				if err := l.Release(ctxT(t)); err != nil {
					lostReleases.Add(1)
					t.Errorf("a release of a held lease, racing its renewals, returned %v", err)
				}
			}
		}()
	}
	wg.Wait()
	cb.mu.Lock()
	defer cb.mu.Unlock()
	if cb.late > 0 {
		t.Errorf("%d renew requests were sent after their lease's release had been sent", cb.late)
	}
	if n := lostReleases.Load(); n > 0 {
		t.Errorf("%d of %d clean releases were reported as failures", n, workers*rounds)
	}
}
