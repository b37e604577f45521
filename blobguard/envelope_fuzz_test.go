package blobguard

import (
	"bytes"
	"encoding/binary"
	"errors"
	"path"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/fencekit/fencekit/fence"
)

// FuzzParseEnvelope: parsing the stored bytes of an object never panics,
// refuses with fence.ErrNotFenced whatever is not a header the guard writes, and
// accepts every header it does write. An accepted header is exactly the
// one putHeader writes for what was parsed, so no garbage (a stray flag
// bit, another version, token 0, a tombstone with a body) passes as a
// token the guard would then trust.
func FuzzParseEnvelope(f *testing.F) {
	var n nonce
	copy(n[:], "0123456789abcdef")
	for _, h := range []header{{token: 1, nonce: n}, {token: 1<<63 + 5, nonce: n, deleted: true}, {token: 42}} {
		b := make([]byte, headerLen)
		putHeader(b, h)
		f.Add(b)
		if !h.deleted {
			f.Add(append(b, "payload"...))
		} else {
			f.Add(append(b, 'x'))
		}
	}
	f.Add([]byte(""))
	f.Add([]byte("FKBG"))
	f.Add([]byte("FKBG\x02\x00\x00\x00\x00\x00\x00\x00\x00\x01................"))
	f.Add([]byte("FKBG\x01\x02\x00\x00\x00\x00\x00\x00\x00\x01................"))
	f.Add([]byte("FKBG\x01\x00\x00\x00\x00\x00\x00\x00\x00\x00................"))
	f.Add([]byte(`{"written_by":"A"}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		orig := bytes.Clone(b)
		h, payload, err := parseEnvelope(b)
		if !bytes.Equal(b, orig) {
			t.Fatal("parseEnvelope changed its input")
		}
		// What a header the guard writes looks like, from the format's
		// description (envelope.go), not from the parser.
		valid := len(b) >= HeaderSize && string(b[:4]) == "FKBG" && b[4] == 1 && b[5]&^1 == 0 &&
			binary.BigEndian.Uint64(b[6:14]) != 0 && (b[5] == 0 || len(b) == HeaderSize)
		if err != nil {
			if !errors.Is(err, fence.ErrNotFenced) {
				t.Fatalf("error %v does not match fence.ErrNotFenced", err)
			}
			if valid {
				t.Fatalf("a header the guard writes was refused: %v", err)
			}
			return
		}
		if !valid {
			t.Fatalf("garbage accepted as a header: token %d, deleted %v", h.token, h.deleted)
		}
		again := make([]byte, HeaderSize)
		putHeader(again, h)
		if !bytes.Equal(again, b[:HeaderSize]) || !bytes.Equal(payload, b[HeaderSize:]) || h.token == fence.None {
			t.Fatalf("parsed %+v does not write back as %x", h, b[:HeaderSize])
		}
	})
}

// FuzzValidateKey: a key is refused (fence.ErrInvalidArgument, no panic) or it is
// one S3 and path-based stores keep as it is: 1 to 1024 bytes of UTF-8
// without control characters, whose path segments no store rewrites
// (cleaning it as a path changes nothing).
func FuzzValidateKey(f *testing.F) {
	for _, k := range []string{"a", "a/b", "orders/2026/01.json", "ü/ñ é", "a//b", "/a", "a/", "a/./b", "a/../b", ".", "..",
		"a\x00b", "a\nb", "\x7f", "\xff", strings.Repeat("k", 1024), strings.Repeat("k", 1025), "a?b#c%2F", "..a/b..", " "} {
		f.Add(k)
	}
	f.Fuzz(func(t *testing.T, key string) {
		err := validateKey(key)
		if err != nil {
			if !errors.Is(err, fence.ErrInvalidArgument) {
				t.Fatalf("error %v does not match fence.ErrInvalidArgument", err)
			}
			return
		}
		if key == "" || len(key) > 1024 || !utf8.ValidString(key) {
			t.Fatalf("key %q accepted: empty, too long or not UTF-8", key)
		}
		for _, r := range key {
			if r < 0x20 || r == 0x7f {
				t.Fatalf("key %q with control character %U accepted", key, r)
			}
		}
		if path.Clean("/"+key) != "/"+key {
			t.Fatalf("key %q accepted, but a path-based store would store it as %q", key, path.Clean("/" + key)[1:])
		}
	})
}
