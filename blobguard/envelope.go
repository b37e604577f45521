package blobguard

import (
	"crypto/md5"
	"crypto/rand"
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"strings"

	"github.com/fencekit/fencekit/fence"
)

// The envelope is a fixed header the guard writes in front of the caller's
// bytes, and strips on Get:
//
//	offset  size  field
//	     0     4  magic "FKBG"
//	     4     1  format version (1)
//	     5     1  flags (bit 0: tombstone, written by Delete)
//	     6     8  fencing token, big-endian, never 0
//	    14    16  nonce, random per write attempt
//	    30     …  the caller's bytes (none in a tombstone)
//
// The nonce makes every stored write's bytes, and so its ETag, unique: two
// writes of identical caller bytes still differ in their ETags, so If-Match
// on an ETag names exactly one write. The token inside the bytes is read
// together with them, so a Get cannot pair an ETag with another write's
// token without the MD5 check in read noticing.
const (
	envMagic   = "FKBG"
	envVersion = 1
	headerLen  = HeaderSize

	flagDeleted = 1 << 0
)

// HeaderSize is the number of bytes the guard stores in front of the
// caller's bytes in every object it writes: magic (4), format version (1),
// flags (1), token (8), nonce (16).
const HeaderSize = 30

// Metadata keys the guard also sets on every object it writes, so that
// people and tools can see the token without parsing the body. The body's
// header, not the metadata, is what the guard trusts.
const (
	MetaToken   = "fencekit-token"
	MetaNonce   = "fencekit-nonce"
	MetaDeleted = "fencekit-deleted"
)

type nonce [16]byte

func newNonce() (nonce, error) {
	var n nonce
	if _, err := rand.Read(n[:]); err != nil {
		return n, fmt.Errorf("blobguard: read random nonce: %w", err)
	}
	return n, nil
}

type header struct {
	token   fence.Token
	nonce   nonce
	deleted bool
}

// putHeader writes h into the first headerLen bytes of b.
func putHeader(b []byte, h header) {
	copy(b[0:4], envMagic)
	b[4] = envVersion
	b[5] = 0
	if h.deleted {
		b[5] = flagDeleted
	}
	binary.BigEndian.PutUint64(b[6:14], uint64(h.token))
	copy(b[14:30], h.nonce[:])
}

// parseEnvelope splits stored bytes into header and payload. Bytes that were
// not written by a guard give an error wrapping fence.ErrNotFenced.
func parseEnvelope(b []byte) (header, []byte, error) {
	var h header
	if len(b) < headerLen || string(b[0:4]) != envMagic {
		return h, nil, fmt.Errorf("%w: no blobguard header", fence.ErrNotFenced)
	}
	if b[4] != envVersion {
		return h, nil, fmt.Errorf("%w: unsupported header version %d", fence.ErrNotFenced, b[4])
	}
	if b[5]&^flagDeleted != 0 {
		return h, nil, fmt.Errorf("%w: unknown header flags %#x", fence.ErrNotFenced, b[5])
	}
	h.deleted = b[5]&flagDeleted != 0
	h.token = fence.Token(binary.BigEndian.Uint64(b[6:14]))
	copy(h.nonce[:], b[14:30])
	if h.token == fence.None {
		return h, nil, fmt.Errorf("%w: header carries token 0", fence.ErrNotFenced)
	}
	payload := b[headerLen:]
	if h.deleted && len(payload) != 0 {
		return h, nil, fmt.Errorf("%w: tombstone with a body", fence.ErrNotFenced)
	}
	return h, payload, nil
}

func metadataFor(h header) map[string]string {
	m := map[string]string{
		MetaToken: h.token.String(),
		MetaNonce: hex.EncodeToString(h.nonce[:]),
	}
	if h.deleted {
		m[MetaDeleted] = "true"
	}
	return m
}

// normETag strips the quotes and weak prefix of an ETag and lowercases it.
func normETag(etag string) string {
	etag = strings.TrimPrefix(strings.TrimSpace(etag), "W/")
	return strings.ToLower(strings.Trim(etag, `"`))
}

// isMD5ETag reports whether a normalised ETag has the shape of an MD5 digest
// (32 hex digits), as S3 gives for single-part uploads without SSE-KMS.
func isMD5ETag(e string) bool {
	if len(e) != 32 {
		return false
	}
	_, err := hex.DecodeString(e)
	return err == nil
}

func md5Hex(b []byte) string {
	s := md5.Sum(b)
	return hex.EncodeToString(s[:])
}
