package lease_test

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/fencekit/fencekit/lease"
	"github.com/fencekit/fencekit/lease/memlease"
)

// At most two exports at once, across every process that uses the same
// semaphore name and number of permits. Each permit is a slot of its own,
// with its own fencing token: fence what the holder writes per slot (key
// it by l.Name()), never a resource all permits share.
func ExampleSemaphore() {
	ctx := context.Background()
	m, err := lease.NewManager(memlease.New(), 10*time.Second) // any backend
	if err != nil {
		panic(err)
	}
	exports, err := lease.NewSemaphore(m, "exports", 2)
	if err != nil {
		panic(err)
	}

	a, _ := exports.Acquire(ctx) // blocks while both permits are held
	b, _ := exports.Acquire(ctx)
	fmt.Println("two permits on two slots:", a.Name() != b.Name())

	_, err = exports.TryAcquire(ctx)
	fmt.Println("a third:", errors.Is(err, lease.ErrNotAcquired))

	// Work under a's context, and fence the slot's own resource with its
	// token, for example a row keyed by a.Name() written through sqlguard.
	slot, first := a.Name(), a.Token()
	_ = a.Release(ctx)

	c, _ := exports.TryAcquire(ctx) // the freed slot, with a greater token
	fmt.Println("same slot:", c.Name() == slot, "greater token:", c.Token() > first)
	_ = b.Release(ctx)
	_ = c.Release(ctx)
	// Output:
	// two permits on two slots: true
	// a third: true
	// same slot: true greater token: true
}
