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
func TestHolderInTheLastSecond(t *testing.T) {
	cl := etcdtest.Start(t, 1)
	cli := cl.Client()
	b := newBackend(t, cli, prefix(t))
	m := testkit.NewManager(t, b, time.Second)
	ctx := testkit.Context(t)
	l, err := m.Acquire(ctx, "job")
	if err != nil {
		t.Fatalf("Acquire: %v", err)
	}
	defer l.Release(ctx)
	var zero int
	for end := time.Now().Add(3 * time.Second); time.Now().Before(end); time.Sleep(50 * time.Millisecond) {
		h, err := b.Holder(ctx, "job")
		if err != nil {
			t.Fatalf("Holder while %q is held with token %d: %v", "job", l.Token(), err)
		}
		if h.Owner != l.Owner() || h.Token != l.Token() {
			t.Fatalf("Holder = %+v; want owner %q token %d", h, l.Owner(), l.Token())
		}
		if h.Remaining > time.Second {
			t.Fatalf("Holder.Remaining %v for a TTL of 1s", h.Remaining)
		}
		if h.Remaining == 0 {
			zero++
		}
	}
	if err := l.Err(); err != nil {
		t.Fatalf("the lease was lost meanwhile: %v", err)
	}
	if err := l.Release(ctx); err != nil {
		t.Fatalf("Release: %v", err)
	}
	if _, err := b.Holder(ctx, "job"); !errors.Is(err, lease.ErrNotHeld) {
		t.Fatalf("Holder after Release: %v; want lease.ErrNotHeld", err)
	}
	t.Logf("%d answers with less than a whole second left", zero)
}
