package options

import "testing"

type opts struct{ a, b int }

type option func(*opts)

func TestApply(t *testing.T) {
	got := Apply([]option{func(o *opts) { o.a = 1 }, nil, func(o *opts) { o.b = o.a + 1 }, func(o *opts) { o.a = 5 }})
	if got != (opts{a: 5, b: 2}) {
		t.Fatalf("Apply = %+v; want the options applied in order, nil skipped", got)
	}
	if Apply[opts, option](nil) != (opts{}) {
		t.Fatal("Apply of no options is not the zero value")
	}
}
