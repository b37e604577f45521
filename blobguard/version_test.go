package blobguard_test

import (
	"errors"
	"reflect"
	"strings"
	"testing"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/s3"
	"github.com/aws/smithy-go"

	"github.com/fencekit/fencekit/blobguard"
	"github.com/fencekit/fencekit/fence"
)

// forgeVersion builds a Version naming etag with token the way a caller
// could if Version let callers set its fields: it sets every field it is
// allowed to set (an ETag string, a token). Where the type allows none, the
// result is the zero Version.
func forgeVersion(etag string, token fence.Token) blobguard.Version {
	var v blobguard.Version
	rv := reflect.ValueOf(&v).Elem()
	for i := range rv.NumField() {
		f := rv.Field(i)
		if !f.CanSet() {
			continue
		}
		switch f.Kind() {
		case reflect.String:
			f.SetString(etag)
		case reflect.Uint64:
			f.SetUint(uint64(token))
		}
	}
	return v
}

// TestVersionOpaque: no field of a Version can be set outside the package,
// so every Version a caller holds was made by a Guard.
func TestVersionOpaque(t *testing.T) {
	t.Parallel()
	typ := reflect.TypeFor[blobguard.Version]()
	for i := range typ.NumField() {
		if f := typ.Field(i); f.IsExported() {
			t.Errorf("Version has exported field %s: a caller can set it", f.Name)
		}
	}
	if v := forgeVersion(`"0123456789abcdef0123456789abcdef"`, 7); !v.IsZero() {
		t.Errorf("forged a Version %+v", v)
	}
}

// TestPutIfForgedVersion: a stale holder (token 5) learns the current
// ETag from a plain HeadObject after a newer holder wrote token 10, and
// presents it to PutIf with its own token as the version it "read". The
// write must be refused as stale and change nothing.
func TestPutIfForgedVersion(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	raw := rawClient(baseTransport)
	g := newGuard(t, raw)
	key := uniqueKey(t, "obj")
	if _, err := g.Put(ctx, key, 3, strings.NewReader("first")); err != nil {
		t.Fatal(err)
	}
	if _, err := g.Put(ctx, key, 10, strings.NewReader("newer")); err != nil {
		t.Fatal(err)
	}
	head, err := raw.HeadObject(ctx, &s3.HeadObjectInput{Bucket: aws.String(s3env.Bucket), Key: aws.String(key)})
	if err != nil {
		t.Fatal(err)
	}
	forged := forgeVersion(aws.ToString(head.ETag), 5)
	_, err = g.PutIf(ctx, key, 5, strings.NewReader("stale"), forged)
	wantStale(t, err, 5, 10)
	wantStored(t, g, key, 10, "newer")
}

// TestPutIfStaleHolderVersions: every Version a stale holder (token 5) can
// hold after a newer holder wrote token 10 (the one its own write
// returned, the one its earlier Get returned, a fresh Get's, the zero
// Version, the tombstone of an earlier delete) gets its write refused as
// stale, and nothing changes.
func TestPutIfStaleHolderVersions(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	stale := newGuard(t, rawClient(baseTransport))
	newer := newGuard(t, rawClient(baseTransport))
	key := uniqueKey(t, "obj")

	tomb, err := stale.Delete(ctx, key, 4)
	if err != nil {
		t.Fatal(err)
	}
	written, err := stale.Put(ctx, key, 5, strings.NewReader("five"))
	if err != nil {
		t.Fatal(err)
	}
	read := mustGet(t, stale, key).Version
	if _, err := newer.Put(ctx, key, 10, strings.NewReader("ten")); err != nil {
		t.Fatal(err)
	}
	fresh := mustGet(t, stale, key).Version
	for _, tc := range []struct {
		name string
		prev blobguard.Version
	}{
		{"its own write", written},
		{"its earlier read", read},
		{"a read of the newer write", fresh},
		{"the zero Version", blobguard.Version{}},
		{"an older tombstone", tomb},
	} {
		_, err := stale.PutIf(ctx, key, 5, strings.NewReader("stale"), tc.prev)
		if se, ok := fence.AsStale(err); !ok || se.Presented != 5 || se.Current != 10 {
			t.Errorf("PutIf with %s: %v; want stale, presented 5, current 10", tc.name, err)
		}
	}
	wantStored(t, newer, key, 10, "ten")
}

// TestPutIfVersionOfAnotherObject: a Version names a write of one object;
// passed to PutIf for another key or another bucket it is refused before
// any request, even where the two objects hold the same bytes (and so, on
// this server, the same ETag).
func TestPutIfVersionOfAnotherObject(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	raw := rawClient(baseTransport)
	g := newGuard(t, raw)
	src, dst := uniqueKey(t, "src"), uniqueKey(t, "dst")
	if _, err := g.Put(ctx, dst, 10, strings.NewReader("newer")); err != nil {
		t.Fatal(err)
	}
	if _, err := g.Put(ctx, src, 5, strings.NewReader("old")); err != nil {
		t.Fatal(err)
	}
	// A copy of dst's object at src (outside the fence, on a key the
	// stale holder controls) has dst's ETag; src's Version then names it.
	if _, err := raw.CopyObject(ctx, &s3.CopyObjectInput{
		Bucket: aws.String(s3env.Bucket), Key: aws.String(src),
		CopySource: aws.String(s3env.Bucket + "/" + dst),
	}); err != nil {
		t.Fatal(err)
	}
	copied := mustGet(t, g, src).Version
	if e := mustGet(t, g, dst).ETag(); copied.ETag() != e {
		t.Fatalf("the copy got ETag %s, the source has %s; this test assumes a copy keeps the ETag", copied.ETag(), e)
	}

	otherBucket := s3env.Bucket + "-other"
	_, err := raw.CreateBucket(ctx, &s3.CreateBucketInput{Bucket: aws.String(otherBucket)})
	var ae smithy.APIError
	if err != nil && !(errors.As(err, &ae) && ae.ErrorCode() == "BucketAlreadyOwnedByYou") {
		t.Fatal(err)
	}
	og, err := blobguard.New(raw, otherBucket)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := og.Put(ctx, dst, 1, strings.NewReader("elsewhere")); err != nil {
		t.Fatal(err)
	}
	elsewhere := mustGet(t, og, dst).Version

	ct := &countingTransport{next: newTransport(t)}
	counted := newGuard(t, rawClient(ct))
	ct.reset()
	for _, tc := range []struct {
		name string
		prev blobguard.Version
	}{
		{"another key", copied},
		{"another bucket", elsewhere},
	} {
		_, err := counted.PutIf(ctx, dst, 5, strings.NewReader("stale"), tc.prev)
		if !errors.Is(err, fence.ErrInvalidArgument) {
			t.Errorf("PutIf with a Version of %s: %v; want ErrInvalidInput", tc.name, err)
		}
	}
	if n := ct.all.Load(); n != 0 {
		t.Errorf("%d requests sent; want 0", n)
	}
	wantStored(t, g, dst, 10, "newer")
}
