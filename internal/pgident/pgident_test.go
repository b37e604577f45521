package pgident

import "testing"

func TestQuote(t *testing.T) {
	for _, c := range []struct {
		parts []string
		want  string
	}{
		{[]string{"fencekit_leases"}, `"fencekit_leases"`},
		{[]string{"app", "fencekit_leases"}, `"app"."fencekit_leases"`},
		{[]string{`we"ird`, "a.b"}, `"we""ird"."a.b"`},
		{[]string{"nul\x00byte"}, `"nulbyte"`},
		{[]string{`"; DROP TABLE x; --`}, `"""; DROP TABLE x; --"`},
	} {
		if got := Quote(c.parts...); got != c.want {
			t.Errorf("Quote(%q) = %s, want %s", c.parts, got, c.want)
		}
	}
}
