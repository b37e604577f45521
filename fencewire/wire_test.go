package fencewire_test

import (
	"errors"
	"math"
	"strings"
	"testing"

	"github.com/fencekit/fencekit/fence"
	"github.com/fencekit/fencekit/fencewire"
)

func TestFormatParseRoundTrip(t *testing.T) {
	for _, v := range []fencewire.Value{
		{Resource: "jobs/nightly", Token: 1},
		{Resource: "jobs/nightly", Token: 1764636000000001},
		{Resource: `quote " and backslash \ ; , =`, Token: math.MaxUint64},
		{Resource: "café ✓ 🔒", Token: 42},
		{Resource: "100% \"done\"", Token: 7},
		{Resource: strings.Repeat("é", fencewire.MaxResourceLen/2), Token: math.MaxUint64},
	} {
		s, err := fencewire.Format(v)
		if err != nil {
			t.Fatalf("Format(%+v) = %v", v, err)
		}
		if len(s) > fencewire.MaxValueLen {
			t.Errorf("Format(%+v) is %d bytes, above MaxValueLen", v, len(s))
		}
		got, err := fencewire.Parse(s)
		if err != nil {
			t.Fatalf("Parse(%q) = %v", s, err)
		}
		if got != v {
			t.Errorf("Parse(Format(%+v)) = %+v (field %q)", v, got, s)
		}
		// Spaces around the value are allowed (RFC 9651 parsing).
		if got, err := fencewire.Parse("  " + s + " "); err != nil || got != v {
			t.Errorf("Parse with spaces around %q = %+v, %v", s, got, err)
		}
	}
}

func TestFormatExact(t *testing.T) {
	for v, want := range map[fencewire.Value]string{
		{Resource: "jobs/nightly", Token: 1764636000000001}: `"1764636000000001";resource="jobs/nightly"`,
		{Resource: `a"b\c`, Token: 9}:                       `"9";resource="a\"b\\c"`,
		{Resource: "café", Token: 7}:                        `"7";resource=%"caf%c3%a9"`,
		{Resource: "ü 100%", Token: 7}:                      `"7";resource=%"%c3%bc 100%25"`,
	} {
		if got, err := fencewire.Format(v); err != nil || got != want {
			t.Errorf("Format(%+v) = %q, %v; want %q", v, got, err, want)
		}
	}
}

func TestFormatRefusesInvalid(t *testing.T) {
	for _, v := range []fencewire.Value{
		{Resource: "r", Token: 0},
		{Resource: "", Token: 1},
		{Resource: strings.Repeat("n", fencewire.MaxResourceLen+1), Token: 1},
		{Resource: "\xff", Token: 1},
		{Resource: "new\nline", Token: 1},
	} {
		s, err := fencewire.Format(v)
		if !errors.Is(err, fencewire.ErrInvalid) || s != "" {
			t.Errorf("Format(%+v) = %q, %v; want an error matching ErrInvalid", v, s, err)
		}
		if v.Token == 0 && !errors.Is(err, fence.ErrInvalidToken) {
			t.Errorf("Format with token 0 = %v; want fence.ErrInvalidToken too", err)
		}
	}
}

func TestParseRefusesMalformed(t *testing.T) {
	for _, s := range []string{
		``,
		`42;resource="r"`,                      // an Integer, not a String
		`"0";resource="r"`,                     // token 0
		`"042";resource="r"`,                   // leading zero
		`"18446744073709551616";resource="r"`,  // 2^64
		`"123456789012345678901";resource="r"`, // 21 digits
		`"-1";resource="r"`,
		`"1 ";resource="r"`,
		`"1"`,                                // no resource
		`"1";resource`,                       // resource without value (Boolean true)
		`"1";resource=""`,                    // empty name
		`"1";resource=r`,                     // a Token, not a String
		`"1";resource="r";resource="s"`,      // repeated parameter
		`"1";resource="r";scope="x"`,         // unknown parameter
		`"1";Resource="r"`,                   // keys are lower case
		`"1";resource="r", "2";resource="s"`, // two values: a combined repeated field
		`"1";resource="r",`,                  //
		`"1";resource="a\nb"`,                // bad escape
		"\"1\";resource=\"a\tb\"",            // not printable
		`"1";resource=%"caf%C3%A9"`,          // upper-case hex
		`"1";resource=%"%ff"`,                // not UTF-8
		`"1";resource=%"a%0ab"`,              // a control character
		`"1";resource=%"%c3"`,                // cut UTF-8
		`"1";resource=%"%c"`,                 // cut escape
		`"1";resource="unterminated`,         //
		`"1";resource="` + strings.Repeat("n", fencewire.MaxResourceLen+1) + `"`,
		`"1";resource="` + strings.Repeat("n", fencewire.MaxValueLen) + `"`,
	} {
		v, err := fencewire.Parse(s)
		if !errors.Is(err, fencewire.ErrMalformed) {
			t.Errorf("Parse(%q) = %+v, %v; want an error matching ErrMalformed", s, v, err)
		}
		if v != (fencewire.Value{}) {
			t.Errorf("Parse(%q) returned %+v with its error; want the zero Value", s, v)
		}
	}
}

func TestProblemErr(t *testing.T) {
	err := fencewire.StaleProblem(fence.Stale("jobs/a", 5, math.MaxUint64)).Err()
	se, ok := fence.AsStale(err)
	if !ok || se.Resource != "jobs/a" || se.Presented != 5 || se.Current != math.MaxUint64 {
		t.Fatalf("stale problem's error = %#v; want the StaleError back", err)
	}
	if err := (fencewire.Problem{Type: fencewire.ProblemMalformed, Detail: "x"}).Err(); !errors.Is(err, fencewire.ErrRejected) || !errors.Is(err, fencewire.ErrMalformed) {
		t.Errorf("malformed problem's error = %v", err)
	}
	if err := (fencewire.Problem{Type: fencewire.ProblemMissing}).Err(); !errors.Is(err, fencewire.ErrRejected) || errors.Is(err, fencewire.ErrMalformed) {
		t.Errorf("missing problem's error = %v", err)
	}
	if err := (fencewire.Problem{Type: fencewire.ProblemUnavailable}).Err(); !errors.Is(err, fencewire.ErrUnavailable) {
		t.Errorf("unavailable problem's error = %v", err)
	}
	if err := (fencewire.Problem{Type: "about:blank"}).Err(); err != nil {
		t.Errorf("another problem's error = %v; want nil", err)
	}
}
