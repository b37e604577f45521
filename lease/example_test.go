package lease_test

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/fencekit/fencekit/lease"
	"github.com/fencekit/fencekit/lease/memlease"
)

func ExampleManager_TryAcquire() {
	ctx := context.Background()
	backend := memlease.New() // lease/redislease in production
	m, err := lease.NewManager(backend, 10*time.Second)
	if err != nil {
		panic(err)
	}

	l, err := m.TryAcquire(ctx, "nightly-invoices")
	if err != nil {
		panic(err)
	}
	fmt.Println("holder 1 got token", l.Token())

	// A second holder fails fast while the lease is held.
	_, err = m.TryAcquire(ctx, "nightly-invoices")
	fmt.Println("holder 2:", errors.Is(err, lease.ErrNotAcquired))

	// Release is compare-and-delete; calling it twice is harmless.
	fmt.Println(l.Release(ctx), l.Release(ctx))

	l2, _ := m.TryAcquire(ctx, "nightly-invoices")
	defer l2.Release(ctx)
	fmt.Println("holder 2 got token", l2.Token())
	// Output:
	// holder 1 got token 1
	// holder 2: true
	// <nil> <nil>
	// holder 2 got token 2
}

func ExampleManager_Acquire() {
	ctx := context.Background()
	m, _ := lease.NewManager(memlease.New(), 10*time.Second)
	first, _ := m.TryAcquire(ctx, "migration")

	got := make(chan *lease.Lease)
	go func() {
		// Blocks until the first holder releases (woken at once), or until
		// the context ends.
		ctx, cancel := context.WithTimeout(ctx, time.Minute)
		defer cancel()
		l, err := m.Acquire(ctx, "migration")
		if err != nil {
			panic(err)
		}
		got <- l
	}()
	first.Release(ctx) // wakes the waiter, or frees the name before it asks
	second := <-got
	defer second.Release(ctx)
	fmt.Println("second holder's token is newer:", second.Token() > first.Token())
	// Output:
	// second holder's token is newer: true
}

func ExampleLease_Context() {
	ctx := context.Background()
	m, _ := lease.NewManager(memlease.New(), 200*time.Millisecond, lease.WithoutAutoRenew())
	l, _ := m.TryAcquire(ctx, "report")

	// Work under the lease's context: it ends when the lease is lost. Here
	// nobody renews, so the lease is lost at its local deadline.
	select {
	case <-l.Context().Done():
		fmt.Println("stopped:", errors.Is(context.Cause(l.Context()), lease.ErrLost))
	case <-time.After(5 * time.Second):
		fmt.Println("still working")
	}
	fmt.Println("release reports the loss:", errors.Is(l.Release(ctx), lease.ErrLost))
	// Output:
	// stopped: true
	// release reports the loss: true
}

func ExampleManager_Run() {
	ctx := context.Background()
	m, _ := lease.NewManager(memlease.New(), 10*time.Second)

	// One replica at a time runs the nightly job; the others wait (or use
	// TryRun to skip it). The token fences the job's writes.
	err := m.Run(ctx, "nightly-invoices", func(ctx context.Context, l *lease.Lease) error {
		fmt.Println("running with token", l.Token())
		return nil // e.g. sqlguard's Table.Update(ctx, pool, key, l.Token(), ...)
	})
	fmt.Println("done:", err)

	// A job that outlives its lease is told so, whatever the job returned.
	short, _ := lease.NewManager(memlease.New(), 100*time.Millisecond, lease.WithoutAutoRenew())
	err = short.Run(ctx, "report", func(ctx context.Context, l *lease.Lease) error {
		<-ctx.Done() // the lease expires: nobody renews it here
		return nil
	})
	fmt.Println("lost:", errors.Is(err, lease.ErrLost))
	// Output:
	// running with token 1
	// done: <nil>
	// lost: true
}

func ExampleElection() {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	m, _ := lease.NewManager(memlease.New(), 10*time.Second, lease.WithIdentity("replica-1"))
	e, _ := lease.NewElection(m, "scheduler-leader",
		lease.WithOnElected(func(l *lease.Lease) { fmt.Println("elected with token", l.Token()) }),
	)

	done := make(chan error)
	go func() {
		done <- e.Run(ctx, func(ctx context.Context, l *lease.Lease) error {
			// Lead until the context ends: leadership lost, Resign, or
			// shutdown. Fence every write with l.Token().
			who, _ := e.Leader(ctx)
			fmt.Println("leader:", who.Identity())
			cancel() // shut down
			<-ctx.Done()
			return nil
		})
	}()
	fmt.Println("Run:", <-done)
	// Output:
	// elected with token 1
	// leader: replica-1
	// Run: context canceled
}
