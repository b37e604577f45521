package fencecheck_test

import (
	"context"
	"errors"
	"fmt"

	"github.com/fencekit/fencekit/fence"
	"github.com/fencekit/fencekit/fencecheck"
)

func ExampleMemory_Check() {
	ctx := context.Background()
	c := fencecheck.NewMemory()
	fmt.Println(c.Check(ctx, "jobs/report", 33)) // A, holding the lease
	fmt.Println(c.Check(ctx, "jobs/report", 34)) // B, after A's lease expired
	err := c.Check(ctx, "jobs/report", 33)       // A again, after a pause
	fmt.Println(errors.Is(err, fence.ErrStaleToken), err)
	// Output:
	// <nil>
	// <nil>
	// true fence: stale token for jobs/report: presented 33, current 34
}

// Do orders the service's own in-memory state with the checks: the
// change runs while the resource's token is held.
func ExampleMemory_Do() {
	ctx := context.Background()
	c := fencecheck.NewMemory()
	balance := 0
	credit := func(tok fence.Token, amount int) error {
		return c.Do(ctx, "account/7", tok, func() error {
			balance += amount
			return nil
		})
	}
	fmt.Println(credit(5, 10), credit(6, 20))
	fmt.Println(errors.Is(credit(5, 1000), fence.ErrStaleToken), balance)
	// Output:
	// <nil> <nil>
	// true 30
}
