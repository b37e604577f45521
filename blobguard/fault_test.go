package blobguard_test

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net/http"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/s3"

	"github.com/fencekit/fencekit/blobguard"
	"github.com/fencekit/fencekit/fence"
)

// faultClient returns a client whose requests for key pass through fn; the
// rest go straight to the server.
func faultClient(t *testing.T, key string, fn func(req *http.Request, next http.RoundTripper) (*http.Response, error), optFns ...func(*s3.Options)) *s3.Client {
	next := newTransport(t)
	return rawClient(&faultTransport{next: next, fn: func(req *http.Request, next http.RoundTripper) (*http.Response, error) {
		if req.URL.Path != objectPath(key) {
			return next.RoundTrip(req)
		}
		return fn(req, next)
	}}, optFns...)
}

// Test409Retried: S3 may answer 409 ConditionalRequestConflict to a
// conditional write racing another; versitygw never does, so it is
// injected. The guard backs off and tries again.
func Test409Retried(t *testing.T) {
	t.Parallel()
	key := uniqueKey(t, "obj")
	var puts, injected atomic.Int32
	client := faultClient(t, key, func(req *http.Request, next http.RoundTripper) (*http.Response, error) {
		if req.Method == http.MethodPut && puts.Add(1) <= 2 {
			injected.Add(1)
			return s3Error(req, http.StatusConflict, "ConditionalRequestConflict"), nil
		}
		return next.RoundTrip(req)
	})
	g := newGuard(t, client)
	start := time.Now()
	v, err := g.Put(t.Context(), key, 3, strings.NewReader("after two 409s"))
	if err != nil {
		t.Fatalf("Put: %v", err)
	}
	if injected.Load() != 2 || puts.Load() != 3 {
		t.Fatalf("PUTs: %d sent, %d answered 409; want 3, 2", puts.Load(), injected.Load())
	}
	t.Logf("two 409s cost %v", time.Since(start))
	obj := mustGet(t, g, key)
	if obj.Version != v || string(obj.Body) != "after two 409s" {
		t.Fatalf("stored %+v %q", obj.Version, obj.Body)
	}
}

// Test409Exhausted: a store that answers 409 forever makes the guard give
// up with ErrContention after MaxAttempts writes, having written nothing.
func Test409Exhausted(t *testing.T) {
	t.Parallel()
	key := uniqueKey(t, "obj")
	var puts atomic.Int32
	client := faultClient(t, key, func(req *http.Request, next http.RoundTripper) (*http.Response, error) {
		if req.Method == http.MethodPut {
			puts.Add(1)
			return s3Error(req, http.StatusConflict, "ConditionalRequestConflict"), nil
		}
		return next.RoundTrip(req)
	})
	g := newGuard(t, client, blobguard.WithMaxAttempts(3), blobguard.WithBackoff(0, 20*time.Millisecond))
	_, err := g.Put(t.Context(), key, 3, strings.NewReader("never"))
	if !errors.Is(err, blobguard.ErrContention) {
		t.Fatalf("Put: %v; want ErrContention", err)
	}
	wantOutcomeKnown(t, err)
	if puts.Load() != 3 {
		t.Fatalf("%d PUTs; want 3", puts.Load())
	}
	if _, err := g.Get(t.Context(), key); !errors.Is(err, fence.ErrNotFound) {
		t.Fatalf("Get: %v; want ErrNotFound", err)
	}
}

// Test409ContextEnds: the backoff after a 409 stops with the context, and
// the error says both.
func Test409ContextEnds(t *testing.T) {
	t.Parallel()
	key := uniqueKey(t, "obj")
	client := faultClient(t, key, func(req *http.Request, next http.RoundTripper) (*http.Response, error) {
		if req.Method == http.MethodPut {
			return s3Error(req, http.StatusConflict, "ConditionalRequestConflict"), nil
		}
		return next.RoundTrip(req)
	})
	g := newGuard(t, client, func(o *blobguard.Options) {
		o.MinBackoff = time.Second
		o.MaxBackoff = time.Second
		o.MaxAttempts = 100
	})
	ctx, cancel := context.WithTimeout(t.Context(), 300*time.Millisecond)
	defer cancel()
	_, err := g.Put(ctx, key, 3, strings.NewReader("never"))
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Put: %v; want DeadlineExceeded", err)
	}
	wantOutcomeKnown(t, err)
}

// TestSDKRetryOwnWrite: the first PUT reaches the server and is applied,
// but the SDK is told 500; it retries the same conditional PUT, which now
// fails 412 against our own write. The guard recognises its nonce and
// reports success, with its write's Version. In the "torn re-read" case
// the re-read that finds the nonce comes back with the ETag of the write
// before it, as a read racing a write can on versitygw: the Version the
// guard returns must still name its own write.
func TestSDKRetryOwnWrite(t *testing.T) { forEachReadMode(t, testSDKRetryOwnWrite) }

func testSDKRetryOwnWrite(t *testing.T, mode blobguard.Option) {
	for _, tc := range []struct {
		name  string
		after func(req *http.Request) (*http.Response, error)
		tear  bool
	}{
		{"500", func(req *http.Request) (*http.Response, error) {
			return s3Error(req, http.StatusInternalServerError, "InternalError"), nil
		}, false},
		{"connection reset", func(*http.Request) (*http.Response, error) {
			return nil, syscall.ECONNRESET
		}, false},
		{"torn re-read", func(req *http.Request) (*http.Response, error) {
			return s3Error(req, http.StatusInternalServerError, "InternalError"), nil
		}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			ctx := t.Context()
			key := uniqueKey(t, "obj")
			seed := newGuard(t, rawClient(baseTransport))
			before, err := seed.Put(ctx, key, 1, strings.NewReader("before"))
			if err != nil {
				t.Fatal(err)
			}
			var puts, statuses, torn atomic.Int32
			var lastStatus atomic.Int32
			client := faultClient(t, key, func(req *http.Request, next http.RoundTripper) (*http.Response, error) {
				if req.Method != http.MethodPut {
					resp, err := next.RoundTrip(req)
					if tc.tear && err == nil && req.Method == http.MethodGet && puts.Load() > 0 && torn.Add(1) == 1 {
						resp.Header.Set("ETag", before.ETag())
					}
					return resp, err
				}
				resp, err := next.RoundTrip(req)
				if puts.Add(1) == 1 {
					if err != nil || resp.StatusCode != http.StatusOK {
						t.Errorf("the forwarded first PUT failed: %v", err)
					}
					discard(resp, err)
					return tc.after(req)
				}
				if err == nil {
					statuses.Add(1)
					lastStatus.Store(int32(resp.StatusCode))
				}
				return resp, err
			})
			g := newGuard(t, client, mode)
			v, err := g.Put(ctx, key, 2, strings.NewReader("mine"))
			if err != nil {
				t.Fatalf("Put: %v", err)
			}
			if puts.Load() != 2 || lastStatus.Load() != http.StatusPreconditionFailed {
				t.Fatalf("PUTs %d, last status %d; want 2 and 412 (the SDK's retry meeting our own write)", puts.Load(), lastStatus.Load())
			}
			if tc.tear && torn.Load() == 0 {
				t.Fatal("no re-read was torn")
			}
			obj := mustGet(t, newGuard(t, rawClient(baseTransport)), key)
			if obj.Version != v || string(obj.Body) != "mine" {
				t.Fatalf("stored %+v %q; Put returned %+v", obj.Version, obj.Body, v)
			}
		})
	}
}

// TestSentThenLostResolved: with SDK retries off, a PUT that was applied
// but whose reply was lost (connection reset) is settled by a re-read.
func TestSentThenLostResolved(t *testing.T) { forEachReadMode(t, testSentThenLostResolved) }

func testSentThenLostResolved(t *testing.T, mode blobguard.Option) {
	key := uniqueKey(t, "obj")
	var puts atomic.Int32
	client := faultClient(t, key, func(req *http.Request, next http.RoundTripper) (*http.Response, error) {
		resp, err := next.RoundTrip(req)
		if req.Method == http.MethodPut && puts.Add(1) == 1 {
			discard(resp, err)
			return nil, syscall.ECONNRESET
		}
		return resp, err
	}, func(o *s3.Options) { o.RetryMaxAttempts = 1 })
	g := newGuard(t, client, mode)
	v, err := g.Put(t.Context(), key, 4, strings.NewReader("mine"))
	if err != nil {
		t.Fatalf("Put: %v", err)
	}
	if puts.Load() != 1 {
		t.Fatalf("%d PUTs; want 1 (the re-read found the write)", puts.Load())
	}
	if obj := mustGet(t, g, key); obj.Version != v {
		t.Fatalf("stored %+v; Put returned %+v", obj.Version, v)
	}
}

// TestTimeoutAfterSendAmbiguous: the PUT is applied but the reply never
// comes before the caller's deadline. The outcome is unknown, and the guard
// says so: ErrAmbiguous and fence.ErrOutcomeUnknown (and the deadline),
// never success.
func TestTimeoutAfterSendAmbiguous(t *testing.T) { forEachReadMode(t, testTimeoutAfterSendAmbiguous) }

func testTimeoutAfterSendAmbiguous(t *testing.T, mode blobguard.Option) {
	key := uniqueKey(t, "obj")
	client := faultClient(t, key, func(req *http.Request, next http.RoundTripper) (*http.Response, error) {
		resp, err := next.RoundTrip(req)
		if req.Method == http.MethodPut {
			discard(resp, err)
			<-req.Context().Done() // the reply is lost in the network
			return nil, req.Context().Err()
		}
		return resp, err
	})
	g := newGuard(t, client, mode)
	// Long enough that the reads before the PUT and the PUT itself reach
	// the store on a loaded machine: only the reply is lost.
	ctx, cancel := context.WithTimeout(t.Context(), 1500*time.Millisecond)
	defer cancel()
	_, err := g.Put(ctx, key, 4, strings.NewReader("maybe"))
	wantOutcomeUnknown(t, err)
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Put: %v; want DeadlineExceeded too", err)
	}
	// It was in fact applied, which is why success and failure were both
	// wrong answers.
	wantStored(t, newGuard(t, rawClient(baseTransport)), key, 4, "maybe")
}

// TestAmbiguousThenStale: our PUT was applied, its reply lost, and a newer
// holder replaced it before the guard could look. The guard cannot know
// whether its write ever landed: the error matches ErrAmbiguous (and
// fence.ErrOutcomeUnknown) and
// fence.ErrStaleToken.
func TestAmbiguousThenStale(t *testing.T) { forEachReadMode(t, testAmbiguousThenStale) }

func testAmbiguousThenStale(t *testing.T, mode blobguard.Option) {
	ctx := t.Context()
	key := uniqueKey(t, "obj")
	newer := newGuard(t, rawClient(baseTransport))
	var puts atomic.Int32
	client := faultClient(t, key, func(req *http.Request, next http.RoundTripper) (*http.Response, error) {
		resp, err := next.RoundTrip(req)
		if req.Method == http.MethodPut && puts.Add(1) == 1 {
			discard(resp, err)
			if _, err := newer.Put(req.Context(), key, 9, strings.NewReader("newer")); err != nil {
				t.Errorf("newer Put: %v", err)
			}
			return nil, syscall.ECONNRESET
		}
		return resp, err
	}, func(o *s3.Options) { o.RetryMaxAttempts = 1 })
	g := newGuard(t, client, mode)
	_, err := g.Put(ctx, key, 4, strings.NewReader("mine"))
	wantOutcomeUnknown(t, err)
	wantStale(t, err, 4, 9)
	wantStored(t, newer, key, 9, "newer")
}

// TestVanished: the object is removed (behind the guard's back) between
// the guard's read and its If-Match write, which then gets 404. The guard
// reads again and creates the object.
func TestVanished(t *testing.T) { forEachReadMode(t, testVanished) }

func testVanished(t *testing.T, mode blobguard.Option) {
	ctx := t.Context()
	key := uniqueKey(t, "obj")
	raw := rawClient(baseTransport)
	seed := newGuard(t, raw)
	if _, err := seed.Put(ctx, key, 1, strings.NewReader("before")); err != nil {
		t.Fatal(err)
	}
	var puts atomic.Int32
	var first404 atomic.Bool
	client := faultClient(t, key, func(req *http.Request, next http.RoundTripper) (*http.Response, error) {
		if req.Method == http.MethodPut && puts.Add(1) == 1 {
			if _, err := raw.DeleteObject(req.Context(), &s3.DeleteObjectInput{Bucket: aws.String(s3env.Bucket), Key: aws.String(key)}); err != nil {
				t.Errorf("DeleteObject: %v", err)
			}
			resp, err := next.RoundTrip(req)
			first404.Store(err == nil && resp.StatusCode == http.StatusNotFound)
			return resp, err
		}
		return next.RoundTrip(req)
	})
	g := newGuard(t, client, mode)
	if _, err := g.Put(ctx, key, 2, strings.NewReader("after")); err != nil {
		t.Fatalf("Put: %v", err)
	}
	if !first404.Load() || puts.Load() != 2 {
		t.Fatalf("first PUT got 404: %v; PUTs %d; want true, 2", first404.Load(), puts.Load())
	}
	wantStored(t, g, key, 2, "after")
}

// TestTornReadRetried: a GET whose ETag does not match its bytes (as a read
// racing a write can give on some stores) is read again; one that never
// matches is an error, not a guess. With header reads nothing can be
// checked, but a write conditional on an ETag that is not the stored one
// fails, so Put gives up with ErrContention and writes nothing.
func TestTornReadRetried(t *testing.T) { forEachReadMode(t, testTornReadRetried) }

func testTornReadRetried(t *testing.T, mode blobguard.Option) {
	ctx := t.Context()
	key := uniqueKey(t, "obj")
	seed := newGuard(t, rawClient(baseTransport))
	if _, err := seed.Put(ctx, key, 1, strings.NewReader("body")); err != nil {
		t.Fatal(err)
	}
	var gets, torn atomic.Int32
	var tearAlways atomic.Bool
	client := faultClient(t, key, func(req *http.Request, next http.RoundTripper) (*http.Response, error) {
		resp, err := next.RoundTrip(req)
		if err == nil && req.Method == http.MethodGet && (gets.Add(1) == 1 || tearAlways.Load()) {
			torn.Add(1)
			resp.Header.Set("ETag", `"00000000000000000000000000000000"`)
		}
		return resp, err
	})
	g := newGuard(t, client, mode, blobguard.WithMaxAttempts(3))
	obj, err := g.Get(ctx, key)
	if err != nil || string(obj.Body) != "body" || torn.Load() != 1 || gets.Load() != 2 {
		t.Fatalf("Get: %v; %d GETs, %d torn; want nil, 2, 1", err, gets.Load(), torn.Load())
	}
	tearAlways.Store(true)
	if _, err := g.Get(ctx, key); !errors.Is(err, blobguard.ErrETagMismatch) {
		t.Fatalf("Get with every read torn: %v; want ErrETagMismatch", err)
	}
	_, err = g.Put(ctx, key, 2, strings.NewReader("x"))
	if headerReads(mode) {
		if !errors.Is(err, blobguard.ErrContention) {
			t.Fatalf("Put with every header read torn: %v; want ErrContention", err)
		}
	} else if !errors.Is(err, blobguard.ErrETagMismatch) {
		t.Fatalf("Put with every read torn: %v; want ErrETagMismatch", err)
	}
	wantStored(t, seed, key, 1, "body")
}

// TestTornReadNewerETag plays out the read a store that publishes an
// object's ETag before its bytes can give (versitygw's posix backend with
// --sidecar does; see TestHeaderReadPairing): a stale holder (token 5)
// reads the ETag of a newer write (token 10) together with the bytes of
// the older one (token 3). Reading whole objects, the guard sees that the
// ETag is not the MD5 of those bytes, reads again, and refuses the write
// as stale. (With HeaderReads such a store would defeat the fence, which
// is why that option is only for stores that never do this.)
func TestTornReadNewerETag(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	raw := rawClient(baseTransport)
	seed := newGuard(t, raw)
	key := uniqueKey(t, "obj")
	if _, err := seed.Put(ctx, key, 3, strings.NewReader("older")); err != nil {
		t.Fatal(err)
	}
	out, err := raw.GetObject(ctx, &s3.GetObjectInput{Bucket: aws.String(s3env.Bucket), Key: aws.String(key)})
	if err != nil {
		t.Fatal(err)
	}
	older, err := io.ReadAll(out.Body)
	_ = out.Body.Close()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := seed.Put(ctx, key, 10, strings.NewReader("newer")); err != nil {
		t.Fatal(err)
	}
	var torn atomic.Int32
	client := faultClient(t, key, func(req *http.Request, next http.RoundTripper) (*http.Response, error) {
		resp, err := next.RoundTrip(req)
		if err == nil && req.Method == http.MethodGet && torn.Add(1) == 1 {
			// The newer write's ETag, the older write's bytes.
			discard(resp, nil)
			resp.Body = io.NopCloser(bytes.NewReader(older))
			resp.ContentLength = int64(len(older))
			resp.Header.Set("Content-Length", strconv.Itoa(len(older)))
		}
		return resp, err
	})
	g := newGuard(t, client)
	_, err = g.Put(ctx, key, 5, strings.NewReader("stale"))
	wantStale(t, err, 5, 10)
	if torn.Load() < 2 {
		t.Fatalf("%d GETs; want the torn one and a re-read", torn.Load())
	}
	wantStored(t, seed, key, 10, "newer")
}

// TestHardErrorNotRetried: an error that is neither a lost race nor an
// unknown outcome (here 403) is returned at once.
func TestHardErrorNotRetried(t *testing.T) {
	t.Parallel()
	key := uniqueKey(t, "obj")
	var puts atomic.Int32
	client := faultClient(t, key, func(req *http.Request, next http.RoundTripper) (*http.Response, error) {
		if req.Method == http.MethodPut {
			puts.Add(1)
			return s3Error(req, http.StatusForbidden, "AccessDenied"), nil
		}
		return next.RoundTrip(req)
	})
	g := newGuard(t, client)
	_, err := g.Put(t.Context(), key, 1, strings.NewReader("x"))
	if err == nil || errors.Is(err, fence.ErrStaleToken) || puts.Load() != 1 {
		t.Fatalf("Put: %v after %d PUTs; want a plain error after 1", err, puts.Load())
	}
	wantOutcomeKnown(t, err)
}

// TestRetryFailureAfterAppliedWriteAmbiguous: the first PUT reaches the
// store and is applied, its reply is lost (the SDK is told 500) and a newer
// holder replaces the object; the SDK's retry of the PUT then fails with
// something other than 412: a 409 ConditionalRequestConflict, or a plain
// 403. Either way the first try was applied, so the call may not report a
// clean rejection or failure: its outcome is unknown (the reliability
// suite's history check found the 409 case reported as stale).
func TestRetryFailureAfterAppliedWriteAmbiguous(t *testing.T) {
	for _, tc := range []struct {
		name   string
		status int
		code   string
	}{
		{"409", http.StatusConflict, "ConditionalRequestConflict"},
		{"403", http.StatusForbidden, "AccessDenied"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			ctx := t.Context()
			key := uniqueKey(t, "obj")
			newer := newGuard(t, rawClient(baseTransport))
			if _, err := newer.Put(ctx, key, 1, strings.NewReader("first")); err != nil {
				t.Fatal(err)
			}
			var puts atomic.Int32
			client := faultClient(t, key, func(req *http.Request, next http.RoundTripper) (*http.Response, error) {
				if req.Method != http.MethodPut {
					return next.RoundTrip(req)
				}
				switch puts.Add(1) {
				case 1:
					resp, err := next.RoundTrip(req)
					if err != nil || resp.StatusCode != http.StatusOK {
						t.Errorf("the forwarded first PUT failed: %v", err)
					}
					discard(resp, err)
					if _, err := newer.Put(req.Context(), key, 9, strings.NewReader("newer")); err != nil {
						t.Errorf("newer Put: %v", err)
					}
					return s3Error(req, http.StatusInternalServerError, "InternalError"), nil
				case 2:
					return s3Error(req, tc.status, tc.code), nil
				}
				return next.RoundTrip(req)
			})
			g := newGuard(t, client, blobguard.WithBackoff(time.Millisecond, 5*time.Millisecond))
			_, err := g.Put(ctx, key, 4, strings.NewReader("mine"))
			wantOutcomeUnknown(t, err)
			if puts.Load() < 2 {
				t.Fatalf("%d PUTs; want the SDK's retry", puts.Load())
			}
			wantStored(t, newer, key, 9, "newer")
		})
	}
}
