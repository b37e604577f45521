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

func TestShellWord(t *testing.T) {
	for in, want := range map[string]string{
		"app_1.v-2": "app_1.v-2",
		"my schema": "'my schema'",
		"it's":      `'it'\''s'`,
		"$(rm -rf)": "'$(rm -rf)'",
	} {
		if got := ShellWord(in); got != want {
			t.Errorf("ShellWord(%q) = %s, want %s", in, got, want)
		}
	}
}
