// Package pgident validates PostgreSQL identifiers before they are quoted
// (with pgx.Identifier.Sanitize) into a statement. Quotes, semicolons and
// other punctuation are allowed, since quoting neutralises them; what cannot
// be an identifier, or would be silently changed by the server, is refused.
package pgident

import (
	"strings"

	"github.com/fencekit/fencekit/internal/names"
)

// MaxLen is PostgreSQL's identifier limit (NAMEDATALEN-1 bytes). The server
// silently truncates longer names, which could make two names the same, so
// they are refused.
const MaxLen = 63

// Check returns an error wrapping sentinel when s cannot be used as the
// identifier of a kind ("table", "column", "schema"): empty, longer than
// MaxLen bytes, not valid UTF-8, or containing a NUL byte or another control
// character.
func Check(sentinel error, kind, s string) error {
	return names.Check(sentinel, kind+" name", s, names.Rules{Max: MaxLen, NoControl: true})
}

// Quote returns the parts as one quoted, dot-separated PostgreSQL
// identifier ("schema"."table"): each part in double quotes, an embedded
// double quote doubled, NUL bytes dropped (the same text pgx's
// Identifier.Sanitize gives). Check the parts first: Quote never fails.
func Quote(parts ...string) string {
	q := make([]string, len(parts))
	for i, p := range parts {
		q[i] = `"` + strings.ReplaceAll(strings.ReplaceAll(p, `"`, `""`), "\x00", "") + `"`
	}
	return strings.Join(q, ".")
}

// ShellWord quotes s for a POSIX shell when it holds anything but
// letters, digits and . _ -, so that a command naming an identifier in an
// error message (`fencekit migrate up --schema s`) can be pasted as it is.
func ShellWord(s string) string {
	for _, r := range s {
		if !(r == '.' || r == '_' || r == '-' || ('a' <= r && r <= 'z') || ('A' <= r && r <= 'Z') || ('0' <= r && r <= '9')) {
			return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
		}
	}
	return s
}
