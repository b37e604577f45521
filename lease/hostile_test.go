package lease_test

import (
	"context"
	"errors"
	"fmt"
	mrand "math/rand/v2"
	"sync"
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

// jitterBackend answers every renewal and release after a random delay of
// up to max (the store acts first), so replies cross the deadline timer,
// Release and the batcher in every order.
type jitterBackend struct {
	*lease.MemoryBackend
	max time.Duration
}

func (j *jitterBackend) sleep() { time.Sleep(mrand.N(j.max)) }

func (j *jitterBackend) Renew(ctx context.Context, rec lease.Record) error {
	err := j.MemoryBackend.Renew(ctx, rec)
	j.sleep()
	return err
}

func (j *jitterBackend) RenewBatch(ctx context.Context, recs []lease.Record) []error {
	errs := j.MemoryBackend.RenewBatch(ctx, recs)
	j.sleep()
	return errs
}

func (j *jitterBackend) Release(ctx context.Context, rec lease.Record) error {
	j.sleep()
	return j.MemoryBackend.Release(ctx, rec)
}

// TestHostile_ReleaseRenewDeadlineRaces: leases with a 20ms TTL whose
// replies are delayed up to 15ms, renewed by heartbeat (batched and not)
// and by hand from several goroutines, released from several goroutines at
// random moments. Run with -race. After Release: the lease has ended, its
// context carries the same error, a second Release agrees with the first,
// Renew never succeeds, and the store lets another owner in at once.
func TestHostile_ReleaseRenewDeadlineRaces(t *testing.T) {
	mem := lease.NewMemoryBackend()
	jb := &jitterBackend{MemoryBackend: mem, max: 15 * time.Millisecond}
	ms := []*lease.Manager{}
	for _, o := range []lease.Options{
		{TTL: 20 * time.Millisecond},
		{TTL: 20 * time.Millisecond, RenewBatchWindow: lease.NoBatching},
		{TTL: 20 * time.Millisecond, DisableAutoRenew: true},
	} {
		m, err := lease.NewManager(jb, o)
		if err != nil {
			t.Fatal(err)
		}
		ms = append(ms, m)
	}
	other, err := lease.NewManager(mem, lease.Options{TTL: time.Second, DisableAutoRenew: true})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	var wg sync.WaitGroup
	for w := range 12 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 40 {
				name := fmt.Sprintf("race-%d-%d", w, i)
				l, err := ms[(w+i)%len(ms)].TryAcquire(ctx, name)
				if err != nil {
					continue // the grant arrived after its deadline: refused
				}
				time.Sleep(mrand.N(25 * time.Millisecond))
				var rwg sync.WaitGroup
				results := make([]error, 3)
				for k := range 3 {
					rwg.Add(1)
					go func() {
						defer rwg.Done()
						if k == 0 {
							_ = l.Renew(ctx)
						}
						results[k] = l.Release(ctx)
					}()
				}
				renewErr := l.Renew(ctx)
				rwg.Wait()
				end := l.Err()
				if end == nil {
					t.Errorf("%s: Err() is nil after Release", name)
					continue
				}
				if cause := context.Cause(l.Context()); cause != end {
					t.Errorf("%s: context cause %v, Err %v", name, cause, end)
				}
				for _, r := range results {
					if r != nil && !errors.Is(r, lease.ErrLost) {
						t.Errorf("%s: Release = %v", name, r)
					}
				}
				if err := l.Renew(ctx); err == nil {
					t.Errorf("%s: Renew succeeded after Release (earlier concurrent Renew: %v)", name, renewErr)
				}
				l2, err := other.TryAcquire(ctx, name)
				if err != nil {
					t.Errorf("%s: after Release (%v) another owner cannot acquire: %v", name, results, err)
					continue
				}
				if l2.Token() <= l.Token() {
					t.Errorf("%s: token %d after %d", name, l2.Token(), l.Token())
				}
				_ = l2.Release(ctx)
			}
		}()
	}
	wg.Wait()
}
