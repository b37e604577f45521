package fencewire_test

import (
	"errors"
	"fmt"

	"github.com/fencekit/fencekit/fencewire"
)

func ExampleFormat() {
	for _, v := range []fencewire.Value{
		{Resource: "jobs/nightly", Token: 1764636000000001},
		{Resource: "jobs/café", Token: 7},
	} {
		field, err := fencewire.Format(v)
		if err != nil {
			fmt.Println(err)
			continue
		}
		fmt.Printf("%s: %s\n", fencewire.HeaderName, field)
	}
	// Output:
	// Fencing-Token: "1764636000000001";resource="jobs/nightly"
	// Fencing-Token: "7";resource=%"jobs/caf%c3%a9"
}

func ExampleParse() {
	v, err := fencewire.Parse(`"1764636000000001";resource="jobs/nightly"`)
	fmt.Println(v.Resource, v.Token, err)

	// Two values (a repeated field combined by a proxy) are malformed.
	_, err = fencewire.Parse(`"1";resource="a", "2";resource="a"`)
	fmt.Println(errors.Is(err, fencewire.ErrMalformed))
	// Output:
	// jobs/nightly 1764636000000001 <nil>
	// true
}
