package blobguard_test

import (
	"context"
	"errors"
	"io"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/service/s3"

	"github.com/fencekit/fencekit/blobguard"
	"github.com/fencekit/fencekit/fence"
)

// noIOClient counts calls; bad input must be refused before any.
type noIOClient struct{ calls atomic.Int32 }

func (c *noIOClient) GetObject(context.Context, *s3.GetObjectInput, ...func(*s3.Options)) (*s3.GetObjectOutput, error) {
	c.calls.Add(1)
	return nil, errors.New("noIOClient: no I/O expected")
}

func (c *noIOClient) PutObject(context.Context, *s3.PutObjectInput, ...func(*s3.Options)) (*s3.PutObjectOutput, error) {
	c.calls.Add(1)
	return nil, errors.New("noIOClient: no I/O expected")
}

func (c *noIOClient) DeleteObject(context.Context, *s3.DeleteObjectInput, ...func(*s3.Options)) (*s3.DeleteObjectOutput, error) {
	c.calls.Add(1)
	return nil, errors.New("noIOClient: no I/O expected")
}

func TestNewBadInput(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name   string
		client blobguard.Client
		bucket string
		opts   blobguard.Option
		want   []string // substrings of the error, all reported at once
	}{
		{"nil client", nil, "bucket", nil, []string{"nil client"}},
		{"typed nil client", (*s3.Client)(nil), "bucket", nil, []string{"nil client"}},
		{"empty bucket", &noIOClient{}, "", nil, []string{"empty bucket"}},
		{"short bucket", &noIOClient{}, "ab", nil, []string{"3 to 63"}},
		{"upper-case bucket", &noIOClient{}, "MyBucket", nil, []string{"not allowed"}},
		{"bucket with slash", &noIOClient{}, "a/b", nil, []string{"not allowed"}},
		{"bucket ends with dash", &noIOClient{}, "bucket-", nil, []string{"start and end"}},
		{"everything wrong", nil, "", func(o *blobguard.Options) {
			o.MaxAttempts = -1
			o.MinBackoff = -1
			o.MaxObjectSize = -5
			o.ProbePrefix = "/bad"
		}, []string{"nil client", "empty bucket", "MaxAttempts", "MinBackoff", "MaxObjectSize", "ProbePrefix"}},
		{"backoffs inverted", &noIOClient{}, "bucket", func(o *blobguard.Options) {
			o.MinBackoff, o.MaxBackoff = 2e9, 1e9
		}, []string{"MaxBackoff"}},
		{"object size over S3's limit", &noIOClient{}, "bucket", func(o *blobguard.Options) {
			o.MaxObjectSize = 6 << 30
		}, []string{"MaxObjectSize"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			g, err := blobguard.New(tc.client, tc.bucket, tc.opts)
			if g != nil || !errors.Is(err, fence.ErrInvalidArgument) {
				t.Fatalf("New: %v, %v; want nil and ErrInvalidInput", g, err)
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not mention %q", err, w)
				}
			}
		})
	}
}

// TestOptions: each With helper sets its field, zero values get their
// defaults, later options win, a nil Option is skipped, and bad values
// given through the helpers are all reported at once.
func TestOptions(t *testing.T) {
	t.Parallel()
	g, err := blobguard.New(&noIOClient{}, "bucket")
	if err != nil {
		t.Fatal(err)
	}
	want := blobguard.Options{
		MaxAttempts: blobguard.DefaultMaxAttempts, MinBackoff: blobguard.DefaultMinBackoff, MaxBackoff: blobguard.DefaultMaxBackoff,
		MaxObjectSize: blobguard.DefaultMaxObjectSize, ProbePrefix: blobguard.DefaultProbePrefix,
	}
	if got := g.Options(); got != want {
		t.Fatalf("defaults: %+v; want %+v", got, want)
	}

	g, err = blobguard.New(&noIOClient{}, "bucket",
		blobguard.WithMaxAttempts(7), blobguard.WithMaxAttempts(3), nil,
		blobguard.WithBackoff(time.Millisecond, 50*time.Millisecond),
		blobguard.WithMaxObjectSize(1<<10),
		blobguard.WithProbePrefix("scratch/"),
		blobguard.WithHeaderReads(),
		func(o *blobguard.Options) { o.MaxBackoff = 60 * time.Millisecond },
	)
	if err != nil {
		t.Fatal(err)
	}
	want = blobguard.Options{
		MaxAttempts: 3, MinBackoff: time.Millisecond, MaxBackoff: 60 * time.Millisecond,
		MaxObjectSize: 1 << 10, ProbePrefix: "scratch/", HeaderReads: true,
	}
	if got := g.Options(); got != want {
		t.Fatalf("options: %+v; want %+v", got, want)
	}

	_, err = blobguard.New(&noIOClient{}, "bucket",
		blobguard.WithMaxAttempts(-1), blobguard.WithBackoff(-1, -2),
		blobguard.WithMaxObjectSize(-1), blobguard.WithProbePrefix("//"))
	if !errors.Is(err, fence.ErrInvalidArgument) {
		t.Fatalf("New with bad options: %v; want ErrInvalidInput", err)
	}
	for _, w := range []string{"MaxAttempts", "MinBackoff", "MaxBackoff", "MaxObjectSize", "ProbePrefix"} {
		if !strings.Contains(err.Error(), w) {
			t.Errorf("error %q does not mention %s", err, w)
		}
	}
}

func TestCallBadInput(t *testing.T) {
	t.Parallel()
	client := &noIOClient{}
	g, err := blobguard.New(client, "bucket", blobguard.WithMaxObjectSize(8))
	if err != nil {
		t.Fatal(err)
	}
	body := func() io.Reader { return strings.NewReader("ok") }
	type call func(ctx context.Context) error
	put := func(key string, tok fence.Token, b io.Reader) call {
		return func(ctx context.Context) error { _, err := g.Put(ctx, key, tok, b); return err }
	}
	for _, tc := range []struct {
		name      string
		call      call
		wantToken bool // also matches fence.ErrInvalidToken
	}{
		{"Put token 0", put("k", 0, body()), true},
		{"Delete token 0", func(ctx context.Context) error { _, err := g.Delete(ctx, "k", 0); return err }, true},
		{"PutIf token 0", func(ctx context.Context) error {
			_, err := g.PutIf(ctx, "k", 0, body(), blobguard.Version{})
			return err
		}, true},
		{"nil body", put("k", 1, nil), false},
		{"body over MaxObjectSize", put("k", 1, strings.NewReader("123456789")), false},
		{"empty key", put("", 1, body()), false},
		{"Get empty key", func(ctx context.Context) error { _, err := g.Get(ctx, ""); return err }, false},
		{"Delete empty key", func(ctx context.Context) error { _, err := g.Delete(ctx, "", 1); return err }, false},
		{"key over 1024 bytes", put(strings.Repeat("k", 1025), 1, body()), false},
		{"key of 1024 two-byte runes", put(strings.Repeat("é", 513), 1, body()), false},
		{"key not UTF-8", put("bad\xff", 1, body()), false},
		{"key with NUL", put("a\x00b", 1, body()), false},
		{"key with newline", put("a\nb", 1, body()), false},
		{"key with DEL", put("a\x7fb", 1, body()), false},
		{"key with leading slash", put("/a", 1, body()), false},
		{"key with trailing slash", put("a/", 1, body()), false},
		{"key with double slash", put("a//b", 1, body()), false},
		{"key with dot segment", put("a/./b", 1, body()), false},
		{"key with dot-dot segment", put("a/../b", 1, body()), false},
		{"key that is dot-dot", put("..", 1, body()), false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.call(t.Context())
			if !errors.Is(err, fence.ErrInvalidArgument) {
				t.Fatalf("err = %v; want ErrInvalidInput", err)
			}
			if tc.wantToken && !errors.Is(err, fence.ErrInvalidToken) {
				t.Fatalf("err = %v; want fence.ErrInvalidToken too", err)
			}
		})
	}
	if n := client.calls.Load(); n != 0 {
		t.Fatalf("bad input made %d client calls; want 0", n)
	}
	// Keys S3 accepts pass: 1024 bytes, any UTF-8, spaces and punctuation.
	for _, key := range []string{strings.Repeat("k", 1024), "日本/データ.json", "a b/c+d=e&f", "...a/.b/c."} {
		if _, err := g.Put(t.Context(), key, 1, body()); errors.Is(err, fence.ErrInvalidArgument) {
			t.Errorf("Put(%q): %v; want the key accepted", key, err)
		}
	}
}

// TestCancelledContext: a call with a context already done sends nothing
// and is not ambiguous.
func TestCancelledContext(t *testing.T) {
	t.Parallel()
	ct := &countingTransport{next: newTransport(t)}
	g, err := blobguard.New(rawClient(ct), s3env.Bucket)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	_, err = g.Put(ctx, uniqueKey(t, "obj"), 1, strings.NewReader("x"))
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("Put: %v; want context.Canceled", err)
	}
	wantOutcomeKnown(t, err)
	if ct.all.Load() != 0 {
		t.Fatalf("%d requests sent", ct.all.Load())
	}
}
