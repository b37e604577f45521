package fence_test

import (
	"context"
	"errors"
	"fmt"

	"github.com/fencekit/fencekit/fence"
)

// register is a store that enforces fencing tokens the way sqlguard and
// blobguard do: it remembers the newest token it accepted, takes a write
// with that token or a greater one, and rejects an older one.
type register struct {
	newest fence.Token
	value  string
}

func (r *register) write(ctx context.Context, value string) error {
	tok, ok := fence.FromContext(ctx)
	if !ok {
		return fmt.Errorf("write %q: %w: no token in the context", value, fence.ErrInvalidToken)
	}
	if tok < r.newest {
		return fence.Stale("register", tok, r.newest)
	}
	r.newest, r.value = tok, value
	return nil
}

// Tokens come from a lease (package lease: Lease.Token); here, two holders
// of one lease, the first paused past its term while the second was
// granted it with a greater token.
func Example() {
	var r register
	first := fence.NewContext(context.Background(), 1764582012345678)
	second := fence.NewContext(context.Background(), 1764582014351234)

	fmt.Println(r.write(second, "written by the second holder"))
	fmt.Println(r.write(second, "the second holder again")) // the same token: fine

	// The first holder wakes up and writes with its old token.
	err := r.write(first, "written by the first holder")
	if se, ok := fence.AsStale(err); ok {
		fmt.Printf("rejected: presented %d, the store has %d\n", se.Presented, se.Current)
	}
	fmt.Println(errors.Is(err, fence.ErrStaleToken), r.value)
	// Output:
	// <nil>
	// <nil>
	// rejected: presented 1764582012345678, the store has 1764582014351234
	// true the second holder again
}

func ExampleToken_Validate() {
	for _, t := range []fence.Token{fence.None, 42} {
		fmt.Println(t, t.Validate() == nil)
	}
	// Output:
	// 0 false
	// 42 true
}
