// Package names checks the text of the names fencekit's packages take from
// their callers (lease names, resource names, object keys, SQL
// identifiers) before any I/O: one set of rules and one wording of the
// errors, each wrapping the caller's sentinel.
package names

import (
	"errors"
	"fmt"
	"strings"
	"unicode/utf8"
)

// Rules says what a name may be. The zero value refuses only the empty
// string, text that is not valid UTF-8 and a NUL byte.
type Rules struct {
	// Max is the longest name, in bytes (or in characters with
	// CountRunes); 0 means no limit.
	Max int
	// CountRunes measures Max in characters rather than bytes.
	CountRunes bool
	// NoControl refuses every C0 control character (U+0000 to U+001F)
	// and U+007F; without it only a NUL byte is refused.
	NoControl bool
	// C1 also refuses, with NoControl, the C1 control characters (U+0080
	// to U+009F): the set unicode.IsControl reports.
	C1 bool
}

// Check returns an error wrapping sentinel (when not nil) if s breaks r,
// and nil otherwise. kind names what s is in the message ("name",
// "resource name", "table name", "key").
func Check(sentinel error, kind, s string, r Rules) error {
	msg := problem(kind, s, r)
	switch {
	case msg == "":
		return nil
	case sentinel == nil:
		return errors.New(msg)
	default:
		return fmt.Errorf("%w: %s", sentinel, msg)
	}
}

// problem returns what is wrong with s, or "".
func problem(kind, s string, r Rules) string {
	if s == "" {
		return "empty " + kind
	}
	if !utf8.ValidString(s) {
		return fmt.Sprintf("%s %q is not valid UTF-8", kind, s)
	}
	if r.Max > 0 {
		n, unit := len(s), "bytes"
		if r.CountRunes {
			n, unit = utf8.RuneCountInString(s), "characters"
		}
		if n > r.Max {
			return fmt.Sprintf("%s is %d %s, longer than %d %s", kind, n, unit, r.Max, unit)
		}
	}
	if !r.NoControl {
		if strings.IndexByte(s, 0) >= 0 {
			return fmt.Sprintf("%s %q contains a NUL byte", kind, s)
		}
		return ""
	}
	for _, c := range s {
		if c == 0 {
			return fmt.Sprintf("%s %q contains a NUL byte", kind, s)
		}
		if c < 0x20 || c == 0x7f || r.C1 && c >= 0x80 && c <= 0x9f {
			return fmt.Sprintf("%s %q contains the control character %U", kind, s, c)
		}
	}
	return ""
}
