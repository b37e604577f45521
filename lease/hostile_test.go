package lease_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/fencekit/fencekit/fence"
	"github.com/fencekit/fencekit/lease"
)

// slowBatchBackend is a memory store under load: the reply to an acquire
// of the name "a" comes acquireDelay late, batch renewals of two or more
// records are applied at once but answered batchReply late, and releases
// take releaseDelay.
type slowBatchBackend struct {
	*lease.MemoryBackend
	acquireDelay time.Duration
	batchReply   time.Duration
	releaseDelay time.Duration
}

func (s *slowBatchBackend) Acquire(ctx context.Context, rec lease.Record) (fence.Token, error) {
	tok, err := s.MemoryBackend.Acquire(ctx, rec)
	if rec.Name == "a" {
		time.Sleep(s.acquireDelay)
	}
	return tok, err
}

func (s *slowBatchBackend) RenewBatch(ctx context.Context, recs []lease.Record) []error {
	errs := s.MemoryBackend.RenewBatch(ctx, recs)
	if len(recs) >= 2 {
		time.Sleep(s.batchReply)
	}
	return errs
}

func (s *slowBatchBackend) Release(ctx context.Context, rec lease.Record) error {
	time.Sleep(s.releaseDelay)
	return s.MemoryBackend.Release(ctx, rec)
}

// TestHostile_BatchGiveBackDelaysOtherLeases: leases A and B renew in one
// batch; the store applies both renewals at once but the reply is late,
// arriving after A's local deadline and more than 100ms before B's. A is
// lost (right). But the batcher first gives A's grant back, a slow release
// round trip inside the flush loop, and only then hands B its result; B
// reaches its local deadline meanwhile and is lost, although its renewal
// had succeeded at the store and been answered well before that deadline.
//
// Cause: batcher.flush (batch.go) calls it.l.renewed for each item in turn,
// and Lease.renewed (lease.go) calls Manager.releaseQuietly synchronously
// (bounded only by ReleaseTimeout, 5s by default) for a lease lost while
// its renewal was out. In a large batch after a pause, every lost lease
// adds a round trip before the rest are extended.
//
// Timeline (TTL 600ms, deadline = send + 592ms, RenewInterval 200ms,
// window 40ms): A's acquire is sent at 0 and answered at 200 (deadline
// 592, heartbeat 400); B is acquired at about 205 (deadline about 797,
// heartbeat about 405); the batch goes at 440 and is answered at 690;
// A's give-back takes 400ms, so B's result would be applied at 1090.
func TestHostile_BatchGiveBackDelaysOtherLeases(t *testing.T) {
	sb := &slowBatchBackend{MemoryBackend: lease.NewMemoryBackend(),
		acquireDelay: 200 * time.Millisecond, batchReply: 250 * time.Millisecond, releaseDelay: 400 * time.Millisecond}
	m, err := lease.NewManager(sb, lease.Options{TTL: 600 * time.Millisecond, RenewInterval: 200 * time.Millisecond, RenewBatchWindow: 40 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	a, err := m.TryAcquire(ctx, "a")
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(5 * time.Millisecond)
	b, err := m.TryAcquire(ctx, "b")
	if err != nil {
		t.Fatal(err)
	}
	bDeadline := b.Deadline()
	select {
	case <-a.Done():
	case <-time.After(2 * time.Second):
		t.Fatal("A was not lost at its deadline")
	}
	select {
	case <-b.Done():
		t.Errorf("B was lost %v after its deadline, although its batched renewal had been answered about 100ms before that deadline: %v",
			time.Since(bDeadline).Round(time.Millisecond), b.Err())
	case <-time.After(time.Until(bDeadline) + 150*time.Millisecond):
	}
	if !errors.Is(a.Err(), lease.ErrLost) {
		t.Fatalf("A: %v, want lost", a.Err())
	}
	_ = a.Release(ctx)
	_ = b.Release(ctx)
}

// TestHostile_OptionsEdges: NewManager's boundary.
//
// A safety margin above TTL/3 is valid by the documentation ("must be less
// than TTL"), but the default RenewInterval (TTL/3, options.go withDefaults)
// is not recomputed from TTL - SafetyMargin, so NewManager rejects the
// options with an error about a renew interval the caller never set.
// Suggested default: (TTL - SafetyMargin)/3.
//
// Intervals have no lower bound: RenewInterval 100ns, PollInterval 1ns and
// ReleaseTimeout 1ns are accepted, turning the heartbeat and a blocked
// Acquire into busy loops against the store, and making every Release time
// out. Invariant 7 asks for a clear error before any I/O.
func TestHostile_OptionsEdges(t *testing.T) {
	t.Run("valid margin, default renew interval", func(t *testing.T) {
		m, err := lease.NewManager(lease.NewMemoryBackend(), lease.Options{TTL: time.Second, SafetyMargin: 400 * time.Millisecond})
		if err != nil {
			t.Fatalf("TTL 1s with a safety margin of 400ms (less than the TTL, as documented) was refused because of the default renew interval: %v", err)
		}
		if ri, v := m.Options().RenewInterval, time.Second-400*time.Millisecond; ri > v/2 {
			t.Fatalf("default renew interval %v breaks the rule RenewInterval <= (TTL - margin)/2 = %v", ri, v/2)
		}
	})
	for _, tc := range []struct {
		name string
		opts lease.Options
	}{
		{"renew interval 100ns", lease.Options{TTL: time.Second, RenewInterval: 100 * time.Nanosecond}},
		{"poll interval 1ns", lease.Options{TTL: time.Second, PollInterval: time.Nanosecond}},
		{"release timeout 1ns", lease.Options{TTL: time.Second, ReleaseTimeout: time.Nanosecond}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if _, err := lease.NewManager(lease.NewMemoryBackend(), tc.opts); err == nil {
				t.Errorf("NewManager accepted %s: a busy loop against the store (or a release that always times out)", tc.name)
			}
		})
	}
}
