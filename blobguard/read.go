package blobguard

import (
	"context"
	"errors"
	"fmt"
	"github.com/fencekit/fencekit/fence"
	"github.com/fencekit/fencekit/internal/awsattempt"
	"io"
	"strconv"
	"strings"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/s3"
)

// stored is what read found at a key.
type stored struct {
	exists  bool // an object (live or tombstone) is stored
	deleted bool // it is a tombstone
	etag    string
	header  header
	payload []byte // the caller's bytes: raw without the header
	raw     []byte // the stored bytes
	pooled  bool   // raw is a pooled buffer: release it after use
}

// release hands a pooled buffer back; payload and raw are unusable after.
func (s *stored) release() {
	if s.pooled {
		putBuf(s.raw)
	}
	s.raw, s.payload, s.pooled = nil, nil, false
}

// maxReadAttempts bounds re-reads after an ETag that does not match the
// bytes (a torn read while a write is being published).
const maxReadAttempts = 5

// read fetches the whole object at key and checks it. On a store with MD5
// ETags it checks that the ETag is the MD5 of the bytes, so that the token
// and nonce it returns belong to the write that ETag names.
// pooled says whether the bytes may live in a pooled buffer, which the
// caller then hands back with release.
func (g *Guard) read(ctx context.Context, key string, pooled bool) (stored, error) {
	g.mu.Lock()
	checkMD5 := g.md5ETags
	g.mu.Unlock()
	for i := 1; ; i++ {
		s, err := g.readOnce(ctx, key, pooled)
		if err != nil || !s.exists || !checkMD5 {
			return s, err
		}
		if e := normETag(s.etag); !isMD5ETag(e) || e == md5Hex(s.raw) {
			return s, nil
		}
		s.release()
		if i == maxReadAttempts {
			return stored{}, fmt.Errorf("%w: s3://%s/%s: ETag %s, %d reads", ErrETagMismatch, g.bucket, key, s.etag, i)
		}
	}
}

func (g *Guard) readOnce(ctx context.Context, key string, pooled bool) (stored, error) {
	out, err := g.client.GetObject(ctx, &s3.GetObjectInput{Bucket: aws.String(g.bucket), Key: aws.String(key)})
	if err != nil {
		if awsattempt.APICode(err) == "NoSuchKey" {
			return stored{}, nil
		}
		return stored{}, g.storeErr(fmt.Errorf("blobguard: get s3://%s/%s: %w", g.bucket, key, err))
	}
	defer out.Body.Close()
	raw, err := readAll(out.Body, aws.ToInt64(out.ContentLength), g.opts.MaxObjectSize+headerLen, pooled)
	if errors.Is(err, fence.ErrInvalidArgument) {
		return stored{}, fmt.Errorf("%w: s3://%s/%s is larger than MaxObjectSize (%d bytes)", fence.ErrInvalidArgument, g.bucket, key, g.opts.MaxObjectSize)
	}
	if err != nil {
		return stored{}, fmt.Errorf("blobguard: read s3://%s/%s: %w", g.bucket, key, err)
	}
	s := stored{raw: raw, pooled: pooled}
	s.etag = aws.ToString(out.ETag)
	if s.etag == "" {
		s.release()
		return stored{}, fmt.Errorf("blobguard: get s3://%s/%s: the store returned no ETag", g.bucket, key)
	}
	s.header, s.payload, err = parseEnvelope(raw)
	if err != nil {
		s.release()
		return stored{}, fmt.Errorf("s3://%s/%s: %w", g.bucket, key, err)
	}
	s.exists, s.deleted = true, s.header.deleted
	return s, nil
}

// readForWrite learns what a conditional write must be conditional on: the
// ETag of the stored object and the token and nonce in its header. With
// Options.HeaderReads it fetches only the header (readHeader); otherwise
// the whole object, checked as read checks it.
func (g *Guard) readForWrite(ctx context.Context, key string) (stored, error) {
	if g.opts.HeaderReads {
		return g.readHeader(ctx, key)
	}
	s, err := g.read(ctx, key, true)
	s.release() // only the header and ETag are needed
	return s, err
}

// drainLimit bounds the bytes a header read reads past the header, if the
// store sends more than the range it was asked for.
const drainLimit = 4 << 10

// headerRange is the HTTP Range of the header.
var headerRange = "bytes=0-" + strconv.Itoa(headerLen-1)

// readHeader fetches the header of the object at key with a ranged
// GetObject: HeaderSize bytes and the ETag, whatever the object's size.
// Nothing checks that the ETag belongs to the write whose header came
// back; Options.HeaderReads says when that is safe.
func (g *Guard) readHeader(ctx context.Context, key string) (stored, error) {
	out, err := g.client.GetObject(ctx, &s3.GetObjectInput{
		Bucket: aws.String(g.bucket), Key: aws.String(key), Range: aws.String(headerRange),
	})
	if err != nil {
		switch {
		case awsattempt.APICode(err) == "NoSuchKey":
			return stored{}, nil
		case awsattempt.HTTPStatus(err) == 416 || awsattempt.APICode(err) == "InvalidRange":
			// Only an empty object has no first byte.
			return stored{}, fmt.Errorf("s3://%s/%s: %w: empty object", g.bucket, key, fence.ErrNotFenced)
		}
		return stored{}, g.storeErr(fmt.Errorf("blobguard: get s3://%s/%s: %w", g.bucket, key, err))
	}
	defer out.Body.Close()
	var b [headerLen]byte
	n, err := io.ReadFull(out.Body, b[:])
	if err == nil {
		// Read on to the end of the (ranged) body: an HTTP client reuses
		// a connection only once its response body reached EOF. A store
		// that ignored the Range sent more; that is cut short here.
		_, err = io.CopyN(io.Discard, out.Body, drainLimit)
		if errors.Is(err, io.EOF) {
			err = nil
		}
	}
	if err != nil && !errors.Is(err, io.ErrUnexpectedEOF) && !errors.Is(err, io.EOF) {
		return stored{}, fmt.Errorf("blobguard: read s3://%s/%s: %w", g.bucket, key, err)
	}
	s := stored{etag: aws.ToString(out.ETag)}
	if s.etag == "" {
		return stored{}, fmt.Errorf("blobguard: get s3://%s/%s: the store returned no ETag", g.bucket, key)
	}
	if s.header, _, err = parseEnvelope(b[:n]); err != nil {
		return stored{}, fmt.Errorf("s3://%s/%s: %w", g.bucket, key, err)
	}
	if size, ok := objectSize(out); s.header.deleted && ok && size != headerLen {
		return stored{}, fmt.Errorf("s3://%s/%s: %w: tombstone with a body", g.bucket, key, fence.ErrNotFenced)
	}
	s.exists, s.deleted = true, s.header.deleted
	return s, nil
}

// objectSize returns the size of the whole object a (possibly ranged)
// GetObject answered for, if the answer says.
func objectSize(out *s3.GetObjectOutput) (int64, bool) {
	cr := aws.ToString(out.ContentRange) // "bytes 0-29/1048606"
	if cr == "" {
		return aws.ToInt64(out.ContentLength), out.ContentLength != nil
	}
	i := strings.LastIndexByte(cr, '/')
	if i < 0 {
		return 0, false
	}
	n, err := strconv.ParseInt(cr[i+1:], 10, 64)
	return n, err == nil
}
