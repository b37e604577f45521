package names

import (
	"errors"
	"strings"
	"testing"
)

var errBad = errors.New("bad")

func TestCheck(t *testing.T) {
	for _, c := range []struct {
		s    string
		r    Rules
		want string // a part of the message, or "" for no error
	}{
		{"ok", Rules{}, ""},
		{"", Rules{}, "empty thing"},
		{"a\xffb", Rules{}, "not valid UTF-8"},
		{"a\x00b", Rules{}, "NUL byte"},
		{"a\x01b", Rules{}, ""},
		{"a\x01b", Rules{NoControl: true}, "control character U+0001"},
		{"a\x7fb", Rules{NoControl: true}, "control character U+007F"},
		{"a\u0085b", Rules{NoControl: true}, ""},
		{"a\u0085b", Rules{NoControl: true, C1: true}, "control character U+0085"},
		{"abcd", Rules{Max: 4}, ""},
		{"abcde", Rules{Max: 4}, "is 5 bytes, longer than 4 bytes"},
		{"ééé", Rules{Max: 4}, "is 6 bytes, longer than 4 bytes"},
		{"ééé", Rules{Max: 4, CountRunes: true}, ""},
		{"ééééé", Rules{Max: 4, CountRunes: true}, "is 5 characters, longer than 4 characters"},
	} {
		err := Check(errBad, "thing", c.s, c.r)
		switch {
		case c.want == "" && err != nil:
			t.Errorf("Check(%q, %+v) = %v, want nil", c.s, c.r, err)
		case c.want != "" && (!errors.Is(err, errBad) || !strings.Contains(err.Error(), c.want)):
			t.Errorf("Check(%q, %+v) = %v, want an error matching the sentinel with %q", c.s, c.r, err, c.want)
		}
	}
	if err := Check(nil, "thing", "", Rules{}); err == nil || err.Error() != "empty thing" {
		t.Errorf("Check without a sentinel = %v, want the bare message", err)
	}
}
