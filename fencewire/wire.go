// Package fencewire is the wire format of a fencing token that crosses a
// service boundary: the Fencing-Token HTTP header field (and the gRPC
// metadata entry of the same name and syntax), and the problem document a
// receiver answers with when it refuses a request. docs/fencing-over-http.md
// is its specification; packages fencehttp and fencegrpc speak it.
//
// A value names the token and the resource it fences (what the receiver
// protects and the job that writes it, fixed in the caller's code), as
// an RFC 9651 structured field Item whose bare item is a String of decimal
// digits and whose one parameter, "resource", is a String or, for names
// outside printable ASCII, a Display String:
//
//	Fencing-Token: "1764636000000001";resource="jobs/nightly"
//	Fencing-Token: "7";resource=%"caf%c3%a9"
//
// The token is a String, not an RFC 9651 Integer, because Integers stop at
// 15 digits and fencekit's tokens are microsecond timestamps (16 digits
// today) in a uint64 (up to 20).
//
// A fencing token is not a credential: anyone who can send a request can
// send any token. See the specification for what a deployment must add.
//
// The package imports only the standard library and fence.
package fencewire

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"unicode/utf8"

	"github.com/fencekit/fencekit/fence"
	"github.com/fencekit/fencekit/internal/names"
)

// HeaderName is the HTTP header field that carries a fencing token.
const HeaderName = "Fencing-Token"

// MetadataKey is the gRPC metadata key that carries a fencing token, in the
// same syntax as the HTTP header (gRPC metadata keys are lower case).
const MetadataKey = "fencing-token"

// MaxResourceLen is the longest resource name a value may carry, in bytes
// of UTF-8 (the same limit as a fencekit lease name).
const MaxResourceLen = 512

// MaxValueLen is the longest field value Parse reads, in bytes. A longer one
// is malformed before it is parsed. It fits the longest valid value: a
// 20-digit token and a 512-byte name written entirely as percent escapes.
const MaxValueLen = 2048

// ErrMalformed is matched by the error Parse returns for a value that does
// not follow the format, and by the error a receiver reports for a repeated
// field.
var ErrMalformed = errors.New("fencewire: malformed fencing token")

// ErrInvalid is matched by the error Format and Value.Validate return for a
// value that cannot be sent: token 0, an empty, too long, non-UTF-8 resource
// name or one with control characters.
var ErrInvalid = errors.New("fencewire: invalid fencing token value")

// Value is a fencing token and the resource it fences.
type Value struct {
	// Resource names the order of tokens the receiver keeps: what it
	// protects and the job that writes it ("inventory/settle-orders"),
	// spelled in the caller's code, the same on every replica, with the
	// lease name taken from the same constant. Not Lease.Name() alone: a
	// replica configured with a mistyped lease name holds a lease of its
	// own, and its calls would go to an order of their own that nothing
	// refuses. See the specification, "Naming the resource".
	Resource string
	// Token is the fencing token; never fence.None on the wire.
	Token fence.Token
}

// Validate returns nil when v can be sent, and otherwise an error matching
// ErrInvalid (and fence.ErrInvalidToken for token 0) that names every
// problem.
func (v Value) Validate() error {
	var errs []error
	if err := v.Token.Validate(); err != nil {
		errs = append(errs, fmt.Errorf("%w: %w", ErrInvalid, err))
	}
	if err := validateResource(v.Resource); err != nil {
		errs = append(errs, fmt.Errorf("%w: %w", ErrInvalid, err))
	}
	return errors.Join(errs...)
}

func validateResource(r string) error {
	return names.Check(nil, "resource name", r, names.Rules{Max: MaxResourceLen, NoControl: true, C1: true})
}

// Format returns v as a field value, or an error matching ErrInvalid. The
// resource is written as a String when it is printable ASCII and as a
// Display String otherwise.
func Format(v Value) (string, error) {
	if err := v.Validate(); err != nil {
		return "", err
	}
	var b strings.Builder
	b.Grow(len(v.Resource) + 40)
	b.WriteByte('"')
	b.WriteString(strconv.FormatUint(uint64(v.Token), 10))
	b.WriteString(`";resource=`)
	if printableASCII(v.Resource) {
		b.WriteByte('"')
		for i := 0; i < len(v.Resource); i++ {
			if c := v.Resource[i]; c == '"' || c == '\\' {
				b.WriteByte('\\')
			}
			b.WriteByte(v.Resource[i])
		}
		b.WriteByte('"')
	} else {
		const hex = "0123456789abcdef"
		b.WriteString(`%"`)
		for i := 0; i < len(v.Resource); i++ {
			c := v.Resource[i]
			if c == '%' || c == '"' || c < 0x20 || c > 0x7e {
				b.WriteByte('%')
				b.WriteByte(hex[c>>4])
				b.WriteByte(hex[c&0xf])
			} else {
				b.WriteByte(c)
			}
		}
		b.WriteByte('"')
	}
	return b.String(), nil
}

func printableASCII(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] < 0x20 || s[i] > 0x7e {
			return false
		}
	}
	return true
}

// Parse reads a field value. It returns an error matching ErrMalformed,
// saying what is wrong, unless s is exactly one Item of this format: a
// String of 1 to 20 decimal digits without a leading zero that is a token
// from 1 to 2^64-1, and one parameter "resource" (a String or Display String
// holding a valid resource name), with no other parameter; spaces around
// the value are allowed. Parse never panics (a fuzz target checks it).
func Parse(s string) (Value, error) {
	if len(s) > MaxValueLen {
		return Value{}, fmt.Errorf("%w: the value is %d bytes, the limit is %d", ErrMalformed, len(s), MaxValueLen)
	}
	p := parser{s: strings.Trim(s, " ")}
	v, err := p.item()
	if err != nil {
		return Value{}, fmt.Errorf("%w: %v", ErrMalformed, err)
	}
	return v, nil
}

type parser struct {
	s string
	i int
}

func (p *parser) eof() bool { return p.i >= len(p.s) }

func (p *parser) item() (Value, error) {
	digits, err := p.str()
	if err != nil {
		return Value{}, fmt.Errorf("token: %v", err)
	}
	tok, err := parseToken(digits)
	if err != nil {
		return Value{}, err
	}
	v := Value{Token: tok}
	seen := false
	for !p.eof() && p.s[p.i] == ';' {
		p.i++
		for !p.eof() && p.s[p.i] == ' ' {
			p.i++
		}
		key := p.key()
		if key == "" {
			return Value{}, fmt.Errorf("a parameter key is missing at byte %d", p.i)
		}
		if key != "resource" {
			return Value{}, fmt.Errorf("unknown parameter %q", key)
		}
		if seen {
			return Value{}, errors.New(`parameter "resource" is repeated`)
		}
		seen = true
		if p.eof() || p.s[p.i] != '=' {
			return Value{}, errors.New(`parameter "resource" has no value`)
		}
		p.i++
		var name string
		if !p.eof() && p.s[p.i] == '%' {
			p.i++
			name, err = p.displayStr()
		} else {
			name, err = p.str()
		}
		if err != nil {
			return Value{}, fmt.Errorf("resource: %v", err)
		}
		v.Resource = name
	}
	if !p.eof() {
		return Value{}, fmt.Errorf("unexpected %q at byte %d (one value only: a repeated field is malformed)", p.s[p.i], p.i)
	}
	if !seen {
		return Value{}, errors.New(`parameter "resource" is missing`)
	}
	if err := validateResource(v.Resource); err != nil {
		return Value{}, err
	}
	return v, nil
}

// parseToken reads the token's digits: 1 to 20, no leading zero, not 0,
// at most 2^64-1.
func parseToken(d string) (fence.Token, error) {
	switch {
	case d == "":
		return 0, errors.New("token is empty")
	case len(d) > 20:
		return 0, fmt.Errorf("token has %d digits, the limit is 20", len(d))
	case d[0] == '0':
		return 0, errors.New("token is 0 or has a leading zero")
	}
	for i := 0; i < len(d); i++ {
		if d[i] < '0' || d[i] > '9' {
			return 0, fmt.Errorf("token %q is not decimal digits", d)
		}
	}
	n, err := strconv.ParseUint(d, 10, 64)
	if err != nil {
		return 0, fmt.Errorf("token %s is above 2^64-1", d)
	}
	return fence.Token(n), nil
}

// key reads an RFC 9651 key: lcalpha or "*", then lcalpha, digits, "_",
// "-", "." or "*".
func (p *parser) key() string {
	start := p.i
	for !p.eof() {
		c := p.s[p.i]
		first := p.i == start
		if c >= 'a' && c <= 'z' || c == '*' || !first && (c >= '0' && c <= '9' || c == '_' || c == '-' || c == '.') {
			p.i++
			continue
		}
		break
	}
	return p.s[start:p.i]
}

// str reads an RFC 9651 String: printable ASCII in double quotes, with
// backslash escaping only '"' and '\'.
func (p *parser) str() (string, error) {
	if p.eof() || p.s[p.i] != '"' {
		return "", fmt.Errorf("a String (in double quotes) is expected at byte %d", p.i)
	}
	p.i++
	// Without escapes the String is a substring of the field: no copy.
	for j := p.i; j < len(p.s) && p.s[j] >= 0x20 && p.s[j] <= 0x7e && p.s[j] != '\\'; j++ {
		if p.s[j] == '"' {
			v := p.s[p.i:j]
			p.i = j + 1
			return v, nil
		}
	}
	var b strings.Builder
	for !p.eof() {
		c := p.s[p.i]
		p.i++
		switch {
		case c == '"':
			return b.String(), nil
		case c == '\\':
			if p.eof() || p.s[p.i] != '"' && p.s[p.i] != '\\' {
				return "", fmt.Errorf("bad escape at byte %d", p.i-1)
			}
			b.WriteByte(p.s[p.i])
			p.i++
		case c < 0x20 || c > 0x7e:
			return "", fmt.Errorf("byte 0x%02x at %d is not printable ASCII", c, p.i-1)
		default:
			b.WriteByte(c)
		}
	}
	return "", errors.New("a String is not closed")
}

// displayStr reads an RFC 9651 Display String after its '%': printable
// ASCII in double quotes where '%' starts two lower-case hex digits, the
// bytes together valid UTF-8.
func (p *parser) displayStr() (string, error) {
	if p.eof() || p.s[p.i] != '"' {
		return "", fmt.Errorf(`a Display String (%%"...") is expected at byte %d`, p.i)
	}
	p.i++
	var b []byte
	for !p.eof() {
		c := p.s[p.i]
		p.i++
		switch {
		case c == '"':
			if !utf8.Valid(b) {
				return "", errors.New("a Display String is not valid UTF-8")
			}
			return string(b), nil
		case c == '%':
			if p.i+2 > len(p.s) {
				return "", errors.New("a percent escape is cut short")
			}
			h, ok1 := unhex(p.s[p.i])
			l, ok2 := unhex(p.s[p.i+1])
			if !ok1 || !ok2 {
				return "", fmt.Errorf("bad percent escape at byte %d (two lower-case hex digits expected)", p.i-1)
			}
			b = append(b, h<<4|l)
			p.i += 2
		case c < 0x20 || c > 0x7e:
			return "", fmt.Errorf("byte 0x%02x at %d is not printable ASCII", c, p.i-1)
		default:
			b = append(b, c)
		}
	}
	return "", errors.New("a Display String is not closed")
}

func unhex(c byte) (byte, bool) {
	switch {
	case c >= '0' && c <= '9':
		return c - '0', true
	case c >= 'a' && c <= 'f':
		return c - 'a' + 10, true
	}
	return 0, false
}

type ctxKey struct{}

// NewContext returns a copy of ctx that carries v, for a client transport
// (fencehttp.Transport, fencegrpc's client interceptors) to send. It also
// stores v.Token with fence.NewContext, so that code reading only the token
// sees it. It does not validate v; the transport does, before sending.
func NewContext(ctx context.Context, v Value) context.Context {
	return context.WithValue(fence.NewContext(ctx, v.Token), ctxKey{}, v)
}

// FromContext returns the value stored by NewContext, and whether one was
// there. A value stored with token 0 is returned as it is (unlike
// fence.FromContext), so that a transport refuses it instead of sending
// the request without a token. A receiver's middleware stores the value it
// received (always valid) this way.
func FromContext(ctx context.Context) (Value, bool) {
	v, ok := ctx.Value(ctxKey{}).(Value)
	return v, ok
}
