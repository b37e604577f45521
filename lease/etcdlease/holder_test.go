package etcdlease_test

import (
	"errors"
	"testing"
	"time"

	"github.com/fencekit/fencekit/internal/testkit"
	"github.com/fencekit/fencekit/lease"
	"github.com/fencekit/fencekit/lease/etcdlease/etcdtest"
)

// TestHolderInTheLastSecond: etcd reports a lease's time to live in whole
// seconds, truncated, so a grant with less than a second left reads as 0.
// Holder must still name the holder then (its key keeps every other
// contender out), through a whole TTL of renewals: with a TTL of 1 s the
// renewed lease never has a whole second left when asked.
//
// A starved process can let the Manager's 1 s lease lapse; Holder then
// rightly reports the name free. So an ErrNotHeld counts as wrong only when
// the lease is still valid after the answer came (its local deadline is
// before the store's expiry: the key was there when Holder read it);
// otherwise the lease is acquired again, for at most a few rounds, until
// 3 s of answers were read under live leases. Some answer must have read
// less than a whole second left, or the test tested nothing.
func TestHolderInTheLastSecond(t *testing.T) {
	cl := etcdtest.Start(t, 1)
	cli := cl.Client()
	b := newBackend(t, cli, prefix(t))
	m := testkit.NewManager(t, b, time.Second)
	ctx := testkit.Context(t)
	const rounds = 5
	var zero, answers int
	watched := time.Duration(0)
	released := false
	for round := 0; watched < 3*time.Second; round++ {
		if round == rounds {
			t.Fatalf("the 1 s lease lapsed in each of %d rounds before 3 s of answers (%v read)", rounds, watched)
		}
		l, err := m.Acquire(ctx, "job")
		if err != nil {
			t.Fatalf("Acquire: %v", err)
		}
		start := time.Now()
		lapsed := false
		for time.Since(start) < 3*time.Second-watched && !lapsed {
			h, err := b.Holder(ctx, "job")
			switch {
			case errors.Is(err, lease.ErrNotHeld) && l.Err() != nil:
				t.Logf("round %d: the lease lapsed (%v); again", round, l.Err())
				lapsed = true
				continue
			case err != nil:
				t.Fatalf("Holder while %q is held with token %d: %v", "job", l.Token(), err)
			}
			answers++
			if h.Owner != l.Owner() || h.Token != l.Token() {
				t.Fatalf("Holder = %+v; want owner %q token %d", h, l.Owner(), l.Token())
			}
			if h.Remaining > time.Second {
				t.Fatalf("Holder.Remaining %v for a TTL of 1s", h.Remaining)
			}
			if h.Remaining == 0 {
				zero++
			}
			time.Sleep(50 * time.Millisecond)
		}
		watched += time.Since(start)
		released = false
		if lapsed {
			_ = l.Release(ctx)
			continue
		}
		if err := l.Err(); err != nil {
			// Lost after the last answer: those answers stand.
			t.Logf("round %d: the lease lapsed after the last answer (%v)", round, err)
			continue
		}
		if err := l.Release(ctx); err != nil {
			t.Fatalf("Release: %v", err)
		}
		released = true
	}
	if _, err := b.Holder(ctx, "job"); released && !errors.Is(err, lease.ErrNotHeld) {
		t.Fatalf("Holder after Release: %v; want lease.ErrNotHeld", err)
	}
	if zero == 0 {
		t.Fatalf("none of %d answers read less than a whole second left: the case was not tested", answers)
	}
	t.Logf("%d of %d answers with less than a whole second left", zero, answers)
}
