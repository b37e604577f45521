package blobguard_test

import (
	"bytes"
	"errors"
	"strings"
	"testing"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/s3"

	"github.com/fencekit/fencekit/blobguard"
	"github.com/fencekit/fencekit/fence"
)

func mustGet(t *testing.T, g *blobguard.Guard, key string) *blobguard.Object {
	t.Helper()
	obj, err := g.Get(t.Context(), key)
	if err != nil {
		t.Fatalf("Get(%s): %v", key, err)
	}
	return obj
}

func wantStored(t *testing.T, g *blobguard.Guard, key string, token fence.Token, body string) {
	t.Helper()
	obj := mustGet(t, g, key)
	if obj.Token() != token || string(obj.Body) != body {
		t.Fatalf("stored: token %d body %q; want token %d body %q", obj.Token(), obj.Body, token, body)
	}
}

func wantStale(t *testing.T, err error, presented, current fence.Token) {
	t.Helper()
	se, ok := fence.AsStale(err)
	if !ok || !errors.Is(err, fence.ErrStaleToken) {
		t.Fatalf("err = %v; want a *fence.StaleError", err)
	}
	if se.Presented != presented || se.Current != current || !strings.HasPrefix(se.Resource, "s3://") {
		t.Fatalf("stale error %+v; want presented %d current %d", se, presented, current)
	}
}

// TestOutcomes walks one key through every outcome of Put, Get and Delete
// on the real server.
func TestOutcomes(t *testing.T) { forEachReadMode(t, testOutcomes) }

func testOutcomes(t *testing.T, mode blobguard.Option) {
	ctx := t.Context()
	g := newGuard(t, rawClient(baseTransport), mode)
	key := uniqueKey(t, "obj")

	if _, err := g.Get(ctx, key); !errors.Is(err, fence.ErrNotFound) {
		t.Fatalf("Get of a new key: %v; want ErrNotFound", err)
	}

	// Create.
	v1, err := g.Put(ctx, key, 10, strings.NewReader("one"))
	if err != nil {
		t.Fatalf("create: %v", err)
	}
	if v1.Token() != 10 || v1.ETag() == "" {
		t.Fatalf("create returned %+v", v1)
	}
	obj := mustGet(t, g, key)
	if obj.Version != v1 || string(obj.Body) != "one" {
		t.Fatalf("Get after create: %+v %q; want %+v \"one\"", obj.Version, obj.Body, v1)
	}

	// Replace with a newer token, then with the same token (same holder).
	if _, err := g.Put(ctx, key, 12, strings.NewReader("two")); err != nil {
		t.Fatalf("replace: %v", err)
	}
	wantStored(t, g, key, 12, "two")
	if _, err := g.Put(ctx, key, 12, strings.NewReader("two again")); err != nil {
		t.Fatalf("replace with an equal token: %v", err)
	}
	wantStored(t, g, key, 12, "two again")

	// A stale put changes nothing.
	_, err = g.Put(ctx, key, 11, strings.NewReader("stale"))
	wantStale(t, err, 11, 12)
	wantStored(t, g, key, 12, "two again")

	// A stale delete changes nothing.
	_, err = g.Delete(ctx, key, 11)
	wantStale(t, err, 11, 12)
	wantStored(t, g, key, 12, "two again")

	// Delete leaves a tombstone that keeps the token.
	tomb, err := g.Delete(ctx, key, 13)
	if err != nil {
		t.Fatalf("delete: %v", err)
	}
	_, err = g.Get(ctx, key)
	var nf *fence.NotFoundError
	got, ok := blobguard.TombstoneOf(err)
	if !errors.As(err, &nf) || !errors.Is(err, fence.ErrNotFound) || !ok || got != tomb || nf.Tombstone != 13 || nf.Resource != "s3://"+g.Bucket()+"/"+key {
		t.Fatalf("Get after delete: %v (%+v); want a NotFoundError with tombstone %+v", err, nf, tomb)
	}

	// A stale holder can neither bring it back nor delete the tombstone.
	_, err = g.Put(ctx, key, 12, strings.NewReader("resurrected"))
	wantStale(t, err, 12, 13)
	_, err = g.Delete(ctx, key, 12)
	wantStale(t, err, 12, 13)

	// Deleting again with the same token is harmless; a newer holder can
	// write again.
	if _, err := g.Delete(ctx, key, 13); err != nil {
		t.Fatalf("second delete: %v", err)
	}
	if _, err := g.Put(ctx, key, 14, strings.NewReader("three")); err != nil {
		t.Fatalf("put after delete: %v", err)
	}
	wantStored(t, g, key, 14, "three")

	// Deleting a key that never existed writes a tombstone too, so an
	// older token cannot create it afterwards.
	other := uniqueKey(t, "never")
	if _, err := g.Delete(ctx, other, 5); err != nil {
		t.Fatalf("delete of a missing key: %v", err)
	}
	_, err = g.Put(ctx, other, 4, strings.NewReader("late"))
	wantStale(t, err, 4, 5)

	// An empty body is a valid object.
	if _, err := g.Put(ctx, key, 14, bytes.NewReader(nil)); err != nil {
		t.Fatalf("empty body: %v", err)
	}
	wantStored(t, g, key, 14, "")
}

// TestStoredForm checks what other S3 clients see: the header in front of
// the body, and the token in user metadata.
func TestStoredForm(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	raw := rawClient(baseTransport)
	g := newGuard(t, raw)
	key := uniqueKey(t, "obj")
	if _, err := g.Put(ctx, key, 77, strings.NewReader("payload")); err != nil {
		t.Fatal(err)
	}
	out, err := raw.GetObject(ctx, &s3.GetObjectInput{Bucket: aws.String(s3env.Bucket), Key: aws.String(key)})
	if err != nil {
		t.Fatal(err)
	}
	defer out.Body.Close()
	var buf bytes.Buffer
	if _, err := buf.ReadFrom(out.Body); err != nil {
		t.Fatal(err)
	}
	b := buf.Bytes()
	if len(b) != blobguard.HeaderSize+len("payload") || string(b[:4]) != "FKBG" || string(b[blobguard.HeaderSize:]) != "payload" {
		t.Fatalf("stored bytes %q", b)
	}
	if out.Metadata[blobguard.MetaToken] != "77" || len(out.Metadata[blobguard.MetaNonce]) != 32 {
		t.Fatalf("metadata %v", out.Metadata)
	}
}

// TestNotFenced: an object written by someone else is neither returned nor
// overwritten, since its token is unknown.
func TestNotFenced(t *testing.T) { forEachReadMode(t, testNotFenced) }

func testNotFenced(t *testing.T, mode blobguard.Option) {
	ctx := t.Context()
	raw := rawClient(baseTransport)
	g := newGuard(t, raw, mode)
	fakeTombstone := append([]byte("FKBG\x01\x01"), make([]byte, 24)...)
	fakeTombstone[13] = 1 // token 1
	for _, tc := range []struct{ name, body string }{
		{"plain", "plain bytes, longer than a header"},
		{"short", "short"},
		{"empty", ""},
		{"tombstone with a body", string(fakeTombstone) + "body"},
	} {
		key := uniqueKey(t, tc.name)
		if _, err := raw.PutObject(ctx, &s3.PutObjectInput{Bucket: aws.String(s3env.Bucket), Key: aws.String(key), Body: strings.NewReader(tc.body)}); err != nil {
			t.Fatal(err)
		}
		if _, err := g.Get(ctx, key); !errors.Is(err, fence.ErrNotFenced) {
			t.Errorf("%s: Get: %v; want ErrNotFenced", tc.name, err)
		}
		if _, err := g.Put(ctx, key, 1, strings.NewReader("x")); !errors.Is(err, fence.ErrNotFenced) {
			t.Errorf("%s: Put: %v; want ErrNotFenced", tc.name, err)
		}
		if _, err := g.Delete(ctx, key, 1); !errors.Is(err, fence.ErrNotFenced) {
			t.Errorf("%s: Delete: %v; want ErrNotFenced", tc.name, err)
		}
		out, err := raw.GetObject(ctx, &s3.GetObjectInput{Bucket: aws.String(s3env.Bucket), Key: aws.String(key)})
		if err != nil {
			t.Fatal(err)
		}
		var buf bytes.Buffer
		_, _ = buf.ReadFrom(out.Body)
		_ = out.Body.Close()
		if buf.String() != tc.body {
			t.Errorf("%s: the object changed: %q", tc.name, buf.String())
		}
	}
}

// TestReadModifyWrite: with the version from Get (or from the last write),
// PutIf writes in exactly one HTTP request; a cold Put takes two.
func TestReadModifyWrite(t *testing.T) { forEachReadMode(t, testReadModifyWrite) }

func testReadModifyWrite(t *testing.T, mode blobguard.Option) {
	ctx := t.Context()
	ct := &countingTransport{next: newTransport(t)}
	g := newGuard(t, rawClient(ct), mode)
	other := newGuard(t, rawClient(baseTransport), mode)
	key := uniqueKey(t, "obj")

	ct.reset()
	v, err := g.PutIf(ctx, key, 5, strings.NewReader("v1"), blobguard.Version{})
	if err != nil {
		t.Fatalf("PutIf create: %v", err)
	}
	if n := ct.all.Load(); n != 1 {
		t.Fatalf("create with PutIf sent %d requests; want 1", n)
	}

	ct.reset()
	obj := mustGet(t, g, key)
	if n := ct.all.Load(); n != 1 {
		t.Fatalf("Get sent %d requests; want 1", n)
	}
	ct.reset()
	v2, err := g.PutIf(ctx, key, 5, strings.NewReader(string(obj.Body)+"+v2"), obj.Version)
	if err != nil {
		t.Fatalf("PutIf: %v", err)
	}
	if n, p := ct.all.Load(), ct.puts.Load(); n != 1 || p != 1 {
		t.Fatalf("read-modify-write sent %d requests (%d PUTs); want 1", n, p)
	}
	if v2.ETag() == v.ETag() || v2.Token() != 5 {
		t.Fatalf("PutIf returned %+v after %+v", v2, v)
	}
	wantStored(t, g, key, 5, "v1+v2")

	// Chained: the version a write returns is good for the next one.
	ct.reset()
	v3, err := g.PutIf(ctx, key, 6, strings.NewReader("v3"), v2)
	if err != nil || ct.all.Load() != 1 {
		t.Fatalf("chained PutIf: %v, %d requests", err, ct.all.Load())
	}

	// Cold put: one GET and one PUT.
	ct.reset()
	v4, err := g.Put(ctx, key, 6, strings.NewReader("v4"))
	if err != nil {
		t.Fatalf("Put: %v", err)
	}
	if g, p := ct.gets.Load(), ct.puts.Load(); g != 1 || p != 1 || ct.all.Load() != 2 {
		t.Fatalf("cold Put sent %d GET, %d PUT, %d in all; want 1, 1, 2", g, p, ct.all.Load())
	}

	// Someone with an equal token wrote since v3 was read: conflict.
	if _, err := other.Put(ctx, key, 6, strings.NewReader("other")); err != nil {
		t.Fatal(err)
	}
	if _, err := g.PutIf(ctx, key, 6, strings.NewReader("lost update"), v4); !errors.Is(err, blobguard.ErrConflict) {
		t.Fatalf("PutIf over a changed object: %v; want ErrConflict", err)
	}
	wantStored(t, g, key, 6, "other")

	// A newer holder wrote: stale, with the stored token.
	v9, err := other.Put(ctx, key, 9, strings.NewReader("newer"))
	if err != nil {
		t.Fatal(err)
	}
	_, err = g.PutIf(ctx, key, 7, strings.NewReader("stale"), v3)
	wantStale(t, err, 7, 9)
	wantStored(t, g, key, 9, "newer")

	// A prev newer than the token is stale without any request.
	ct.reset()
	_, err = g.PutIf(ctx, key, 8, strings.NewReader("x"), v9)
	wantStale(t, err, 8, 9)
	if n := ct.all.Load(); n != 0 {
		t.Fatalf("stale prev sent %d requests; want 0", n)
	}

	// Create over a tombstone in one request, with the tombstone's version.
	if _, err := other.Delete(ctx, key, 10); err != nil {
		t.Fatal(err)
	}
	_, err = g.Get(ctx, key)
	tomb, ok := blobguard.TombstoneOf(err)
	if !ok {
		t.Fatalf("Get after delete: %v", err)
	}
	ct.reset()
	if _, err := g.PutIf(ctx, key, 10, strings.NewReader("reborn"), tomb); err != nil || ct.all.Load() != 1 {
		t.Fatalf("PutIf over the tombstone: %v, %d requests; want nil, 1", err, ct.all.Load())
	}
	wantStored(t, g, key, 10, "reborn")

	// "Expect no object" also accepts a tombstone it has not seen.
	if _, err := other.Delete(ctx, key, 11); err != nil {
		t.Fatal(err)
	}
	if _, err := g.PutIf(ctx, key, 11, strings.NewReader("again"), blobguard.Version{}); err != nil {
		t.Fatalf("PutIf(absent) over a tombstone: %v", err)
	}
	// ... but not a live object.
	if _, err := g.PutIf(ctx, key, 11, strings.NewReader("x"), blobguard.Version{}); !errors.Is(err, blobguard.ErrConflict) {
		t.Fatalf("PutIf(absent) over a live object: %v; want ErrConflict", err)
	}
}
