package lease_test

import (
	"context"
	"errors"
	"fmt"
	mrand "math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/fencekit/fencekit/lease"
	"github.com/fencekit/fencekit/lease/driver"
	"github.com/fencekit/fencekit/lease/memlease"
)

// slowBatchBackend is a memory store under load: a batch renewal of two or
// more leases is applied at once but answered at replyAt, and a release
// takes releaseDelay.
type slowBatchBackend struct {
	*memlease.Backend
	replyAt      atomic.Pointer[time.Time] // a batch of two or more is answered then
	delayed      atomic.Int32              // batches held until replyAt
	releaseDelay time.Duration
}

func (s *slowBatchBackend) RenewBatch(ctx context.Context, recs []driver.Grant, done func(int, error)) {
	errs := make([]error, len(recs))
	s.Backend.RenewBatch(ctx, recs, func(i int, err error) { errs[i] = err })
	if at := s.replyAt.Load(); at != nil && len(recs) >= 2 {
		s.delayed.Add(1)
		time.Sleep(time.Until(*at))
	}
	for i, err := range errs {
		done(i, err)
	}
}

func (s *slowBatchBackend) Release(ctx context.Context, rec driver.Grant) error {
	time.Sleep(s.releaseDelay)
	return s.Backend.Release(ctx, rec)
}

// TestHostile_BatchGiveBackDelaysOtherLeases: leases A and B renew in one
// batch; the store applies both renewals at once but the reply comes late,
// after A's local deadline and well before B's. A is lost (right), and its
// grant, which the store had just renewed, is given back. That give-back (a
// release round trip, 800ms here) must not delay B's result past B's
// deadline: B's renewal succeeded and was answered in time.
//
// Timeline (TTL 6s, deadline = send + 5.938s, RenewInterval 2s, window
// 450ms): A acquired at 0, B at 400ms; heartbeats at 2s and 2.4s go out in
// one batch at about 2.4s; the reply is held until halfway between the two
// deadlines (about 6.14s), 200ms before B's: room for a loaded machine's
// late goroutines, and much less than the give-back takes.
func TestHostile_BatchGiveBackDelaysOtherLeases(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		sb := &slowBatchBackend{Backend: memlease.New(), releaseDelay: 800 * time.Millisecond}
		m, err := lease.NewManager(sb, 6*time.Second, lease.WithRenewInterval(2*time.Second), lease.WithRenewBatchWindow(450*time.Millisecond))
		if err != nil {
			t.Fatal(err)
		}
		ctx := context.Background()
		a, err := m.TryAcquire(ctx, "a")
		if err != nil {
			t.Fatal(err)
		}
		time.Sleep(240 * time.Millisecond)
		b, err := m.TryAcquire(ctx, "b")
		if err != nil {
			t.Fatal(err)
		}
		aDeadline, bDeadline := a.Deadline(), b.Deadline()
		replyAt := aDeadline.Add(bDeadline.Sub(aDeadline) / 2)
		sb.replyAt.Store(&replyAt)
		select {
		case <-a.Done():
		case <-time.After(time.Until(aDeadline) + 2*time.Second):
			t.Fatal("A was not lost at its deadline")
		}
		select {
		case <-b.Done():
			t.Errorf("B was lost %v after its deadline, although its batched renewal had been answered %v before that deadline: %v",
				time.Since(bDeadline).Round(time.Millisecond), bDeadline.Sub(replyAt).Round(time.Millisecond), b.Err())
		case <-time.After(time.Until(bDeadline) + 150*time.Millisecond):
		}
		if !errors.Is(a.Err(), lease.ErrLost) {
			t.Fatalf("A: %v, want lost", a.Err())
		}
		if sb.delayed.Load() == 0 {
			t.Fatal("A's and B's heartbeats never went out in one batch: the test did not exercise the give-back")
		}
		_ = a.Release(ctx)
		if err := b.Release(ctx); err != nil {
			t.Fatalf("B: %v", err)
		}
	})
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
		m, err := lease.NewManager(memlease.New(), time.Second, lease.WithSafetyMargin(400*time.Millisecond))
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
			if _, err := lease.NewManager(memlease.New(), tc.opts.TTL, withOptions(tc.opts)); err == nil {
				t.Errorf("NewManager accepted %s: a busy loop against the store (or a release that always times out)", tc.name)
			}
		})
	}
}

// jitterBackend answers every renewal and release after a random delay of
// up to max (the store acts first), so replies cross the deadline timer,
// Release and the batcher in every order.
type jitterBackend struct {
	*memlease.Backend
	max time.Duration
}

func (j *jitterBackend) sleep() { time.Sleep(mrand.N(j.max)) }

func (j *jitterBackend) Renew(ctx context.Context, rec driver.Grant) error {
	err := j.Backend.Renew(ctx, rec)
	j.sleep()
	return err
}

func (j *jitterBackend) RenewBatch(ctx context.Context, recs []driver.Grant, done func(int, error)) {
	errs := make([]error, len(recs))
	j.Backend.RenewBatch(ctx, recs, func(i int, err error) { errs[i] = err })
	j.sleep()
	for i, err := range errs {
		done(i, err)
	}
}

func (j *jitterBackend) Release(ctx context.Context, rec driver.Grant) error {
	j.sleep()
	return j.Backend.Release(ctx, rec)
}

// TestHostile_ReleaseRenewDeadlineRaces: leases with a 20ms TTL whose
// replies are delayed up to 15ms, renewed by heartbeat (batched and not)
// and by hand from several goroutines, released from several goroutines at
// random moments. Run with -race. After Release: the lease has ended, its
// context carries the same error, a second Release agrees with the first,
// Renew never succeeds, and the store lets another owner in at once.
//
// It runs in virtual time (testing/synctest): the delays are the test's
// own, every interleaving they make is reproducible from the random seed,
// and a loaded machine cannot stretch them. (Concurrent Release calls wait
// on a channel, not on a mutex held across the store's I/O, so the bubble
// can advance its clock while they wait.)
func TestHostile_ReleaseRenewDeadlineRaces(t *testing.T) {
	synctest.Test(t, testReleaseRenewDeadlineRaces)
}

func testReleaseRenewDeadlineRaces(t *testing.T) {
	mem := memlease.New()
	jb := &jitterBackend{Backend: mem, max: 15 * time.Millisecond}
	ms := []*lease.Manager{}
	for _, o := range []lease.Options{
		{TTL: 20 * time.Millisecond},
		{TTL: 20 * time.Millisecond, RenewBatchWindow: lease.NoBatching},
		{TTL: 20 * time.Millisecond, DisableAutoRenew: true},
	} {
		m, err := lease.NewManager(jb, o.TTL, withOptions(o))
		if err != nil {
			t.Fatal(err)
		}
		ms = append(ms, m)
	}
	other, err := lease.NewManager(mem, time.Second, lease.WithoutAutoRenew())
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
