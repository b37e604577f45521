package fencewire_test

import (
	"context"
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

// FuzzAdmit: whatever field lines a request brings, Admit never panics, a
// request passes only with exactly one well-formed line (its value the
// parse of that line) or with none on a route that requires nothing, and
// every refusal is a Problem of one of the four types with its status.
func FuzzAdmit(f *testing.F) {
	f.Add(`"7";resource="jobs/a"`, "", 1, true)
	f.Add(`"7";resource="jobs/a"`, `"8";resource="jobs/a"`, 2, false)
	f.Add("", "", 0, true)
	f.Add(`"1";resource=%"%ff"`, "", 1, false)
	f.Fuzz(func(t *testing.T, a, b string, n int, require bool) {
		lines := []string{a, b}[:min(max(n, 0), 2)]
		v, ok, p, checkErr := fencewire.Admit(context.Background(), lines, require, nil)
		if checkErr != nil {
			t.Fatalf("a check error without a checker: %v", checkErr)
		}
		switch {
		case ok && p != nil:
			t.Fatalf("Admit(%q) passed and refused at once", lines)
		case ok:
			want, err := fencewire.Parse(a)
			if len(lines) != 1 || err != nil || v != want {
				t.Fatalf("Admit(%q) passed %+v; want a pass only for one well-formed line", lines, v)
			}
		case p == nil:
			if len(lines) != 0 || require {
				t.Fatalf("Admit(%q, require=%v) neither passed nor refused", lines, require)
			}
		case p.Type == fencewire.ProblemMalformed && p.Status == 400 && p.Detail != "":
		case p.Type == fencewire.ProblemMissing && p.Status == 400 && len(lines) == 0:
		default:
			t.Fatalf("Admit(%q) refused with %+v", lines, *p)
		}
	})
}
