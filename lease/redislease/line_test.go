package redislease_test

import (
	"errors"
	"testing"
	"time"

	"github.com/fencekit/fencekit/internal/testkit"
	"github.com/fencekit/fencekit/lease"
	"github.com/fencekit/fencekit/lease/driver"
	"github.com/fencekit/fencekit/lease/redislease"
	"github.com/fencekit/fencekit/lease/redislease/redistest"
)

// The line of waiters lives in the lease's hash slot (so that one script
// serves it on a Cluster), in the order the waiters came, and no longer
// than its longest place: a line whose waiters all died leaves nothing
// behind.
func TestLineKeysShareTheSlotAndLapse(t *testing.T) {
	prefix := redistest.Prefix(t)
	b := newBackend(t, redistest.Shared(t), prefix)
	rc := redistest.Shared(t)
	name := "line-keys"
	k := b.KeysFor(name)
	for _, key := range []string{k.Line, k.Places, k.Token} {
		if redislease.SlotOf(key) != redislease.SlotOf(k.Lease) {
			t.Fatalf("key %q is in slot %d, the lease %q in %d", key, redislease.SlotOf(key), k.Lease, redislease.SlotOf(k.Lease))
		}
	}
	h, err := b.Acquire(testkit.Context(t), driver.Request{Name: name, Owner: "holder", TTL: 10 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	ttl := 300 * time.Millisecond
	owners := []string{"w-c", "w-a", "w-b"} // arrival order, not the owners' order
	for _, o := range owners {
		_, err := b.Acquire(testkit.Context(t), driver.Request{Name: name, Owner: o, TTL: ttl, Queue: true})
		if !errors.Is(err, lease.ErrNotAcquired) {
			t.Fatalf("queued Acquire of %s = %v, want ErrNotAcquired", o, err)
		}
	}
	line, err := rc.ZRange(testkit.Context(t), k.Line, 0, -1).Result()
	if err != nil {
		t.Fatal(err)
	}
	if len(line) != len(owners) || line[0] != owners[0] || line[1] != owners[1] || line[2] != owners[2] {
		t.Fatalf("line %v, want %v", line, owners)
	}
	for _, key := range []string{k.Line, k.Places} {
		if pttl := rc.PTTL(testkit.Context(t), key).Val(); pttl <= 0 || pttl > ttl {
			t.Fatalf("%s lives %v, want (0, %v]", key, pttl, ttl)
		}
	}
	// The waiters die: the line's keys go with their places.
	time.Sleep(ttl + 100*time.Millisecond)
	if n := rc.Exists(testkit.Context(t), k.Line, k.Places).Val(); n != 0 {
		t.Fatalf("%d line keys left %v after every place lapsed", n, ttl)
	}
	if err := b.Release(testkit.Context(t), h); err != nil {
		t.Fatal(err)
	}
}

// A refusal while the name is free but kept for earlier waiters says so,
// with the time left of the first one's place.
func TestLineRefusalSaysWhoIsAhead(t *testing.T) {
	b := newBackend(t, redistest.Shared(t), redistest.Prefix(t))
	name := "line-ahead"
	h, err := b.Acquire(testkit.Context(t), driver.Request{Name: name, Owner: "holder", TTL: 10 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	long := 10 * time.Second
	for _, o := range []string{"first", "second"} {
		if _, err := b.Acquire(testkit.Context(t), driver.Request{Name: name, Owner: o, TTL: long, Queue: true}); !errors.Is(err, lease.ErrNotAcquired) {
			t.Fatalf("%s: %v", o, err)
		}
	}
	if err := b.Release(testkit.Context(t), h); err != nil {
		t.Fatal(err)
	}
	_, err = b.Acquire(testkit.Context(t), driver.Request{Name: name, Owner: "third", TTL: long, Queue: true})
	var na *lease.NotAcquiredError
	if !errors.As(err, &na) || na.Ahead != 2 || na.RetryAfter <= 0 || na.RetryAfter > long {
		t.Fatalf("third waiter's refusal = %#v (%v), want 2 ahead and RetryAfter in (0, %v]", na, err, long)
	}
}
