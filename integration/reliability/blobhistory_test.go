package reliability

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	mrand "math/rand/v2"
	"net"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/aws/retry"
	"github.com/aws/aws-sdk-go-v2/service/s3"
	"github.com/aws/smithy-go"

	"github.com/fencekit/fencekit/blobguard"
	"github.com/fencekit/fencekit/fence"
	"github.com/fencekit/fencekit/internal/testkit/testenv"
)

// s3Env returns the S3 settings, failing the test when they are missing.
func s3Env(t testing.TB) testenv.S3 {
	t.Helper()
	env := testenv.S3Config()
	if env.Endpoint == "" || env.AccessKey == "" || env.SecretKey == "" || env.Bucket == "" {
		t.Fatalf("%s, %s, %s and %s must be set: run the tests through ./scripts/test.sh, which starts versitygw",
			testenv.S3EndpointVar, testenv.S3AccessKeyVar, testenv.S3SecretKeyVar, testenv.S3BucketVar)
	}
	return env
}

// s3Client returns a client of the test store over rt, with the SDK's own
// retries (a short backoff cap, so that runs stay quick).
func s3Client(t testing.TB, rt http.RoundTripper) *s3.Client {
	env := s3Env(t)
	c := s3.New(s3.Options{
		Region: "us-east-1", BaseEndpoint: aws.String(env.Endpoint), UsePathStyle: true,
		Credentials: aws.CredentialsProviderFunc(func(context.Context) (aws.Credentials, error) {
			return aws.Credentials{AccessKeyID: env.AccessKey, SecretAccessKey: env.SecretKey, Source: "fencekit reliability"}, nil
		}),
		HTTPClient: &http.Client{Transport: rt},
		Retryer:    retry.NewStandard(func(o *retry.StandardOptions) { o.MaxBackoff = 20 * time.Millisecond }),
	})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	_, err := c.CreateBucket(ctx, &s3.CreateBucketInput{Bucket: aws.String(env.Bucket)})
	var ae smithy.APIError
	if err != nil && !(errors.As(err, &ae) && (ae.ErrorCode() == "BucketAlreadyOwnedByYou" || ae.ErrorCode() == "BucketAlreadyExists")) {
		t.Fatalf("bucket %s: %v", env.Bucket, err)
	}
	return c
}

func newHTTPTransport(t testing.TB) *http.Transport {
	tr := http.DefaultTransport.(*http.Transport).Clone()
	t.Cleanup(tr.CloseIdleConnections)
	return tr
}

// s3Faults is an HTTP transport that injects S3 faults into the requests
// for objects under prefix: replies dropped after the store applied a PUT
// (answered 500 or reset instead, so that the SDK retries the PUT, or held
// back until the caller gives up), 409 ConditionalRequestConflict before a
// PUT reaches the store, and GETs reset.
type s3Faults struct {
	next   http.RoundTripper
	prefix string // request path prefix
	faults *faultCounter
	mu     sync.Mutex
	r      *mrand.Rand
}

func (f *s3Faults) roll() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.r.IntN(100)
}

func (f *s3Faults) RoundTrip(req *http.Request) (*http.Response, error) {
	if !strings.HasPrefix(req.URL.Path, f.prefix) {
		return f.next.RoundTrip(req)
	}
	n := f.roll()
	switch req.Method {
	case http.MethodPut:
		switch {
		case n < 7:
			f.faults.add("s3-put-applied-reply-500")
			resp, err := f.next.RoundTrip(req)
			drain(resp, err)
			return s3ErrorResponse(req, http.StatusInternalServerError, "InternalError"), nil
		case n < 12:
			f.faults.add("s3-put-applied-reply-reset")
			resp, err := f.next.RoundTrip(req)
			drain(resp, err)
			return nil, syscall.ECONNRESET
		case n < 15:
			f.faults.add("s3-put-applied-reply-lost")
			resp, err := f.next.RoundTrip(req)
			drain(resp, err)
			t := time.NewTimer(100 * time.Millisecond)
			defer t.Stop()
			select {
			case <-req.Context().Done():
				return nil, req.Context().Err()
			case <-t.C:
				return nil, &net.OpError{Op: "read", Net: "tcp", Err: os.ErrDeadlineExceeded}
			}
		case n < 21:
			f.faults.add("s3-put-409-injected")
			if req.Body != nil {
				_ = req.Body.Close()
			}
			return s3ErrorResponse(req, http.StatusConflict, "ConditionalRequestConflict"), nil
		}
	case http.MethodGet:
		if n < 3 {
			f.faults.add("s3-get-reset")
			return nil, syscall.ECONNRESET
		}
	}
	return f.next.RoundTrip(req)
}

func drain(resp *http.Response, err error) {
	if err == nil {
		_, _ = io.Copy(io.Discard, resp.Body)
		_ = resp.Body.Close()
	}
}

func s3ErrorResponse(req *http.Request, status int, code string) *http.Response {
	if req.Body != nil {
		_ = req.Body.Close()
	}
	body := `<?xml version="1.0" encoding="UTF-8"?>` + "\n" +
		`<Error><Code>` + code + `</Code><Message>injected by the reliability suite</Message><RequestId>fk</RequestId></Error>`
	return &http.Response{
		Status: fmt.Sprintf("%d %s", status, http.StatusText(status)), StatusCode: status,
		Proto: "HTTP/1.1", ProtoMajor: 1, ProtoMinor: 1,
		Header: http.Header{"Content-Type": {"application/xml"}}, Body: io.NopCloser(strings.NewReader(body)),
		ContentLength: int64(len(body)), Request: req,
	}
}

func blobExtra(err error) (outcome, bool) {
	switch {
	case errors.Is(err, blobguard.ErrConflict):
		return outConflict, true
	case errors.Is(err, blobguard.ErrContention):
		return outNoChange, true
	}
	return 0, false
}

func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// TestBlobHistoryLinearizable runs concurrent blobguard Put, PutIf and
// Delete calls, with identical and different bodies, and Gets, on a few
// keys from two clients (one direct, reading whole objects; one through a
// fault-injecting transport, reading headers only), with deadlines that
// fire mid-flight, and checks the history against the object model.
func TestBlobHistoryLinearizable(t *testing.T) {
	started := time.Now()
	seed := seedFor(t)
	env := s3Env(t)
	prefix := "reliability/" + randomHex(6) + "/"
	var faults faultCounter
	direct := s3Client(t, newHTTPTransport(t))
	faulty := s3Client(t, &s3Faults{next: newHTTPTransport(t), prefix: "/" + env.Bucket + "/" + prefix, faults: &faults, r: mrand.New(mrand.NewPCG(seed, 77))})
	backoff := blobguard.WithBackoff(time.Millisecond, 20*time.Millisecond)
	gA, err := blobguard.New(direct, env.Bucket, backoff)
	if err != nil {
		t.Fatal(err)
	}
	gB, err := blobguard.New(faulty, env.Bucket, backoff, blobguard.WithHeaderReads())
	if err != nil {
		t.Fatal(err)
	}
	for _, g := range []*blobguard.Guard{gA, gB} {
		if err := g.Check(t.Context()); err != nil {
			t.Fatalf("Check: %v", err)
		}
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		for k := range blobKeys {
			_, _ = direct.DeleteObject(ctx, &s3.DeleteObjectInput{Bucket: aws.String(env.Bucket), Key: aws.String(prefix + "k" + strconv.Itoa(k))})
		}
	})

	workers := 6
	opsPerWorker := envInt("RELIABILITY_HISTORY_OPS", 150)
	h := newHistory()
	var tokens tokenSource
	var wg sync.WaitGroup
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := mrand.New(mrand.NewPCG(seed, uint64(w)))
			g, via := gA, "direct"
			if w%2 == 1 {
				g, via = gB, "faulty-headers"
			}
			tok := &holder{src: &tokens}
			seen := map[string]blobguard.Version{} // the last version this worker learned, per key
			for i := range opsPerWorker {
				key := prefix + "k" + strconv.Itoa(r.IntN(blobKeys))
				ctx, cancel := opContext(r, &faults)
				body := "same"
				if r.IntN(3) == 0 {
					body = fmt.Sprintf("c%d-%d", w, i)
				}
				in := blobInput{Key: key, Token: tok.next(r), Body: body, Via: via}
				call := h.now()
				var out result
				var v blobguard.Version
				var err error
				switch n := r.IntN(20); {
				case n < 7:
					in.Op = opPut
					v, err = g.Put(ctx, key, fence.Token(in.Token), strings.NewReader(body))
				case n < 11:
					in.Op = opPutIf
					prev := seen[key]
					if uint64(prev.Token()) > in.Token {
						in.Token = tok.grant() // a stale PutIf is refused before I/O: nothing to check
					}
					in.PrevETag = prev.ETag()
					v, err = g.PutIf(ctx, key, fence.Token(in.Token), strings.NewReader(body), prev)
				case n < 13:
					in.Op, in.Body = opBlobDelete, ""
					v, err = g.Delete(ctx, key, fence.Token(in.Token))
				default:
					in.Op, in.Body = opGet, ""
					obj, gerr := g.Get(ctx, key)
					ret := h.now()
					cancel()
					switch {
					case gerr == nil:
						seen[key] = obj.Version
						out = result{Outcome: outRead, Value: string(obj.Body), Token: uint64(obj.Token()), ETag: obj.ETag()}
					case errors.Is(gerr, fence.ErrNotFound):
						tomb, _ := blobguard.TombstoneOf(gerr)
						seen[key] = tomb
						out = result{Outcome: outNotFound, Token: uint64(tomb.Token()), ETag: tomb.ETag()}
					default:
						continue // a failed read tells nothing
					}
					h.add(w, in, call, out, ret)
					continue
				}
				ret := h.now()
				cancel()
				out = classify(err, blobExtra)
				if out.Outcome == outOK {
					out.Token, out.ETag = uint64(v.Token()), v.ETag()
					seen[key] = v
				}
				h.add(w, in, call, out, ret)
			}
		}()
	}
	wg.Wait()
	for k := range blobKeys {
		key := prefix + "k" + strconv.Itoa(k)
		call := h.now()
		obj, err := gA.Get(context.Background(), key)
		switch {
		case err == nil:
			h.add(workers, blobInput{Key: key, Op: opGet, Via: "final"}, call, result{Outcome: outRead, Value: string(obj.Body), Token: uint64(obj.Token()), ETag: obj.ETag()}, h.now())
		case errors.Is(err, fence.ErrNotFound):
			tomb, _ := blobguard.TombstoneOf(err)
			h.add(workers, blobInput{Key: key, Op: opGet, Via: "final"}, call, result{Outcome: outNotFound, Token: uint64(tomb.Token()), ETag: tomb.ETag()}, h.now())
		default:
			t.Fatalf("final Get %s: %v", key, err)
		}
	}

	h.check(t, blobModel(knownETags(h)), "blobguard")
	f := historyFigures("blobguard", h, &faults, started)
	f.Seed = seed
	report(t, f)
	if f.Outcomes["ok"] == 0 || f.Outcomes["stale"] == 0 || f.Outcomes["unknown"] == 0 || f.Outcomes["conflict"] == 0 {
		t.Errorf("the run did not exercise every path: %+v", f)
	}
}

const blobKeys = 5

// knownETags returns the ETags of the writes whose callers were told they
// were applied.
func knownETags(h *history) map[string]bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	known := map[string]bool{}
	for _, op := range h.ops {
		if in := op.Input.(blobInput); in.Op != opGet {
			if out := op.Output.(result); out.Outcome == outOK {
				known[normETag(out.ETag)] = true
			}
		}
	}
	return known
}
