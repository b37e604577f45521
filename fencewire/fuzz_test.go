package fencewire_test

import (
	"errors"
	"strings"
	"testing"
	"unicode"
	"unicode/utf8"

	"github.com/fencekit/fencekit/fencewire"
)

// FuzzParse: Parse never panics; it returns either ErrMalformed and the
// zero Value, or a valid Value that Format writes back to a field Parse
// reads as the same Value.
func FuzzParse(f *testing.F) {
	for _, s := range []string{
		`"1764636000000001";resource="jobs/nightly"`,
		`"7";resource=%"caf%c3%a9"`,
		`"18446744073709551615";resource="a\"b\\c"`,
		`"1";resource="r", "2";resource="s"`,
		`"1";resource="r";resource="s"`,
		`"0";resource="r"`, `42;resource="r"`, `"1";resource=%"%ff"`, `"1"`, `;`, `"`, `%"`,
		`"1";resource="` + strings.Repeat("n", fencewire.MaxResourceLen) + `"`,
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		v, err := fencewire.Parse(s)
		if err != nil {
			if !errors.Is(err, fencewire.ErrMalformed) || v != (fencewire.Value{}) {
				t.Fatalf("Parse(%q) = %+v, %v", s, v, err)
			}
			return
		}
		if v.Token == 0 || v.Resource == "" || len(v.Resource) > fencewire.MaxResourceLen || !utf8.ValidString(v.Resource) ||
			strings.IndexFunc(v.Resource, unicode.IsControl) >= 0 {
			t.Fatalf("Parse(%q) accepted an invalid value %+v", s, v)
		}
		again, err := fencewire.Format(v)
		if err != nil {
			t.Fatalf("Format(Parse(%q)) = %v", s, err)
		}
		if back, err := fencewire.Parse(again); err != nil || back != v {
			t.Fatalf("Parse(Format(%+v)) = %+v, %v", v, back, err)
		}
	})
}
