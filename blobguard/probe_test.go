package blobguard_test

import (
	"crypto/md5"
	"encoding/hex"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/s3"

	"github.com/fencekit/fencekit/blobguard"
	"github.com/fencekit/fencekit/fence"
)

// laxStore is a tiny in-memory S3 that honours only the conditions it is
// told to, as some S3-compatible stores do (they accept If-Match and
// ignore it). It is the one fake in these tests: the real server cannot
// be made to misbehave this way.
type laxStore struct {
	honourIfNoneMatch, honourIfMatch bool

	mu      sync.Mutex
	objects map[string][]byte
	puts    []string // keys of accepted PUTs
}

func (s *laxStore) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	s.mu.Lock()
	defer s.mu.Unlock()
	key := r.URL.Path
	cur, exists := s.objects[key]
	fail := func(status int, code string) {
		w.Header().Set("Content-Type", "application/xml")
		w.WriteHeader(status)
		_, _ = io.WriteString(w, "<Error><Code>"+code+"</Code></Error>")
	}
	switch r.Method {
	case http.MethodPut:
		body, _ := io.ReadAll(r.Body)
		if s.honourIfNoneMatch && r.Header.Get("If-None-Match") == "*" && exists {
			fail(http.StatusPreconditionFailed, "PreconditionFailed")
			return
		}
		if im := r.Header.Get("If-Match"); s.honourIfMatch && im != "" {
			if !exists {
				fail(http.StatusNotFound, "NoSuchKey")
				return
			}
			if strings.Trim(im, `"`) != md5hex(cur) {
				fail(http.StatusPreconditionFailed, "PreconditionFailed")
				return
			}
		}
		s.objects[key] = body
		s.puts = append(s.puts, key)
		w.Header().Set("ETag", `"`+md5hex(body)+`"`)
	case http.MethodGet:
		if !exists {
			fail(http.StatusNotFound, "NoSuchKey")
			return
		}
		w.Header().Set("ETag", `"`+md5hex(cur)+`"`)
		_, _ = w.Write(cur)
	case http.MethodDelete:
		delete(s.objects, key)
		w.WriteHeader(http.StatusNoContent)
	default:
		fail(http.StatusMethodNotAllowed, "MethodNotAllowed")
	}
}

func md5hex(b []byte) string {
	s := md5.Sum(b)
	return hex.EncodeToString(s[:])
}

// TestProbeRefusesLaxStore: against a store that accepts every
// precondition, or ignores one kind, the guard refuses to run.
func TestProbeRefusesLaxStore(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name                 string
		ifNoneMatch, ifMatch bool
		wantRefused          bool
	}{
		{"ignores all", false, false, true},
		{"ignores If-Match", true, false, true},
		{"ignores If-None-Match", false, true, true},
		{"honours both", true, true, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			store := &laxStore{honourIfNoneMatch: tc.ifNoneMatch, honourIfMatch: tc.ifMatch, objects: map[string][]byte{}}
			srv := httptest.NewServer(store)
			defer srv.Close()
			tr := newTransport(t)
			client := rawClient(tr, func(o *s3.Options) { o.BaseEndpoint = aws.String(srv.URL) })
			g, err := blobguard.New(client, "lax-bucket")
			if err != nil {
				t.Fatal(err)
			}
			ctx := t.Context()
			err = g.Check(ctx)
			if got := errors.Is(err, blobguard.ErrPreconditionsIgnored) && errors.Is(err, fence.ErrSetup); got != tc.wantRefused {
				t.Fatalf("Check: %v; refused %v, want %v", err, got, tc.wantRefused)
			}
			if !tc.wantRefused {
				if err != nil {
					t.Fatalf("Check: %v", err)
				}
				return
			}
			t.Logf("refused: %v", err)
			store.mu.Lock()
			before := len(store.puts)
			store.mu.Unlock()
			// Every call now fails closed, without writing.
			if _, err := g.Put(ctx, "data/obj", 1, strings.NewReader("x")); !errors.Is(err, blobguard.ErrPreconditionsIgnored) {
				t.Fatalf("Put: %v; want ErrPreconditionsIgnored", err)
			}
			if _, err := g.Delete(ctx, "data/obj", 1); !errors.Is(err, blobguard.ErrPreconditionsIgnored) {
				t.Fatalf("Delete: %v; want ErrPreconditionsIgnored", err)
			}
			if _, err := g.Get(ctx, "data/obj"); !errors.Is(err, blobguard.ErrPreconditionsIgnored) {
				t.Fatalf("Get: %v; want ErrPreconditionsIgnored", err)
			}
			store.mu.Lock()
			wrote, left := store.puts[before:], len(store.objects)
			store.mu.Unlock()
			if len(wrote) != 0 || left != 0 {
				t.Fatalf("the refused guard wrote %v; %d objects left behind", wrote, left)
			}
			// A fresh guard probes on first use and refuses as well.
			g2, _ := blobguard.New(client, "lax-bucket")
			if _, err := g2.Put(ctx, "data/obj", 1, strings.NewReader("x")); !errors.Is(err, blobguard.ErrPreconditionsIgnored) {
				t.Fatalf("first Put of a fresh guard: %v; want ErrPreconditionsIgnored", err)
			}
		})
	}
}

// TestProbeRealServer: versitygw v1.8.0 passes the probe, which leaves no
// scratch object behind, and probing on first use works too.
func TestProbeRealServer(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	ct := &countingTransport{next: newTransport(t)}
	prefix := uniqueKey(t, "probe") + "/"
	g, err := blobguard.New(rawClient(ct), s3env.Bucket, blobguard.WithProbePrefix(prefix))
	if err != nil {
		t.Fatal(err)
	}
	key := uniqueKey(t, "obj")
	if _, err := g.Put(ctx, key, 1, strings.NewReader("x")); err != nil {
		t.Fatalf("Put with probe on first use: %v", err)
	}
	probeReqs := ct.all.Load() - 2
	if probeReqs < 5 {
		t.Fatalf("first Put sent %d requests; want the probe's and 2", ct.all.Load())
	}
	ct.reset()
	if _, err := g.Put(ctx, key, 1, strings.NewReader("y")); err != nil || ct.all.Load() != 2 {
		t.Fatalf("second Put: %v, %d requests; want nil, 2 (no second probe)", err, ct.all.Load())
	}
	if err := g.Check(ctx); err != nil {
		t.Fatalf("Check: %v", err)
	}
	out, err := rawClient(baseTransport).ListObjectsV2(ctx, &s3.ListObjectsV2Input{Bucket: aws.String(s3env.Bucket), Prefix: aws.String(prefix)})
	if err != nil {
		t.Fatal(err)
	}
	for _, o := range out.Contents {
		t.Errorf("probe left %s behind", aws.ToString(o.Key))
	}
}
