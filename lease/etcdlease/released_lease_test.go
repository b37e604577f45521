package etcdlease_test

import (
	"errors"
	"testing"
	"time"

	"github.com/fencekit/fencekit/internal/testkit"
	"github.com/fencekit/fencekit/lease/driver"
)

// A Release that deletes its key keeps the grant's etcd lease, which holds
// nothing any more, for the next attempt (no revoke, no LeaseGrant for
// that attempt). The released grant can then never touch it again: a
// second Release of it, or a Renew, reports what it did before and leaves
// alone the grant now made on that lease.
func TestReleasedLeaseServesTheNextGrant(t *testing.T) {
	cl := cluster(t)
	admin := cl.Client()
	cc := newCounting(cl.Client())
	b := newBackend(t, cc, prefix(t))
	ctx := testkit.Context(t)
	const ttl = 5 * time.Second
	leaseOf := func(name string) int64 {
		t.Helper()
		resp, err := admin.Get(ctx, b.Key(name))
		if err != nil || len(resp.Kvs) != 1 {
			t.Fatalf("reading the key of %q: %v, %d keys", name, err, len(resp.Kvs))
		}
		return resp.Kvs[0].Lease
	}

	g1, err := b.Acquire(ctx, driver.Request{Name: "first", Owner: "a", TTL: ttl})
	if err != nil {
		t.Fatal(err)
	}
	l1 := leaseOf("first")
	if err := b.Release(ctx, g1); err != nil {
		t.Fatal(err)
	}
	cc.take()
	g2, err := b.Acquire(ctx, driver.Request{Name: "second", Owner: "b", TTL: ttl})
	if err != nil {
		t.Fatal(err)
	}
	if l2 := leaseOf("second"); l2 != l1 {
		t.Fatalf("the next grant is on etcd lease %x, want the released grant's %x", l2, l1)
	}
	if n := cc.take(); n["grant"] != 0 || n["keepalive"] != 1 {
		t.Fatalf("the next grant sent %v, want no LeaseGrant and one keep-alive", n)
	}

	if err := b.Release(ctx, g1); err != nil {
		t.Fatalf("the first grant's Release again = %v, want nil (released before)", err)
	}
	if err := b.Renew(ctx, g1); !errors.Is(err, driver.ErrNotHeld) {
		t.Fatalf("Renew of the released grant = %v, want ErrNotHeld", err)
	}
	time.Sleep(100 * time.Millisecond) // a revoke in the background would be through
	if err := b.Renew(ctx, g2); err != nil {
		t.Fatalf("Renew of the grant on the kept lease = %v, want nil: its lease was revoked", err)
	}
	if n := cc.take(); n["revoke"] != 0 {
		t.Fatalf("%d revoke(s) sent for the kept lease", n["revoke"])
	}
	if leaseOf("second") != l1 {
		t.Fatal("the second grant's key lost its lease")
	}
	if err := b.Release(ctx, g2); err != nil {
		t.Fatal(err)
	}
}
