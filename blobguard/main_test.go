package blobguard_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"github.com/fencekit/fencekit/fence"
	"io"
	"net/http"
	"os"
	"regexp"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/aws/retry"
	"github.com/aws/aws-sdk-go-v2/service/s3"
	"github.com/aws/smithy-go"
	"go.uber.org/goleak"

	"github.com/fencekit/fencekit/blobguard"
	"github.com/fencekit/fencekit/internal/testkit/testenv"
)

// s3env is the real S3-compatible server the tests run against. The tests
// never fake the store to prove a property; fakes appear only where the
// real server cannot misbehave on cue (a store that ignores preconditions).
var s3env testenv.S3

// baseTransport is shared by the clients of tests that do not inject
// faults; TestMain closes its idle connections before the leak check.
var baseTransport = http.DefaultTransport.(*http.Transport).Clone()

func TestMain(m *testing.M) {
	s3env = testenv.S3Config()
	var missing []string
	for _, v := range [][2]string{
		{testenv.S3EndpointVar, s3env.Endpoint}, {testenv.S3AccessKeyVar, s3env.AccessKey},
		{testenv.S3SecretKeyVar, s3env.SecretKey}, {testenv.S3BucketVar, s3env.Bucket},
	} {
		if v[1] == "" {
			missing = append(missing, v[0])
		}
	}
	if len(missing) > 0 {
		fmt.Fprintf(os.Stderr, "blobguard tests need a real S3-compatible server; not set: %s.\n"+
			"Run ./scripts/test.sh ./blobguard/... (it builds and starts versitygw),\n"+
			"or ./scripts/s3server.sh run go test ./blobguard/...\n", strings.Join(missing, ", "))
		os.Exit(2)
	}
	if err := ensureBucket(); err != nil {
		fmt.Fprintf(os.Stderr, "blobguard tests: bucket %s at %s: %v\n", s3env.Bucket, s3env.Endpoint, err)
		os.Exit(2)
	}
	code := m.Run()
	baseTransport.CloseIdleConnections()
	if code == 0 {
		if err := goleak.Find(); err != nil {
			fmt.Fprintf(os.Stderr, "goleak: %v\n", err)
			code = 1
		}
	}
	os.Exit(code)
}

func ensureBucket() error {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	_, err := rawClient(baseTransport).CreateBucket(ctx, &s3.CreateBucketInput{Bucket: aws.String(s3env.Bucket)})
	var ae smithy.APIError
	if errors.As(err, &ae) && (ae.ErrorCode() == "BucketAlreadyOwnedByYou" || ae.ErrorCode() == "BucketAlreadyExists") {
		return nil
	}
	return err
}

// rawClient returns an *s3.Client for the test server over rt, with quick
// SDK retries (the SDK's own defaults, but a 20ms backoff cap).
func rawClient(rt http.RoundTripper, optFns ...func(*s3.Options)) *s3.Client {
	return s3.New(s3.Options{
		Region:       "us-east-1",
		BaseEndpoint: aws.String(s3env.Endpoint),
		UsePathStyle: true,
		Credentials: aws.CredentialsProviderFunc(func(context.Context) (aws.Credentials, error) {
			return aws.Credentials{AccessKeyID: s3env.AccessKey, SecretAccessKey: s3env.SecretKey, Source: "fencekit test"}, nil
		}),
		HTTPClient: &http.Client{Transport: rt},
		Retryer: retry.NewStandard(func(o *retry.StandardOptions) {
			o.MaxBackoff = 20 * time.Millisecond
		}),
	}, optFns...)
}

// newTransport returns a fresh transport whose idle connections are closed
// when the test ends.
func newTransport(t testing.TB) *http.Transport {
	tr := http.DefaultTransport.(*http.Transport).Clone()
	t.Cleanup(tr.CloseIdleConnections)
	return tr
}

// newGuard returns a guard over client for the test bucket that has
// already probed the store.
func newGuard(t testing.TB, client blobguard.Client, opts ...blobguard.Option) *blobguard.Guard {
	t.Helper()
	g, err := blobguard.New(client, s3env.Bucket, opts...)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	if err := g.Check(t.Context()); err != nil {
		t.Fatalf("Check: %v", err)
	}
	return g
}

var nonKeyChars = regexp.MustCompile(`[^A-Za-z0-9_-]+`)

// uniqueKey returns a key no other test or run uses.
func uniqueKey(t testing.TB, suffix string) string {
	var b [6]byte
	_, _ = rand.Read(b[:])
	return "t/" + nonKeyChars.ReplaceAllString(t.Name(), "_") + "/" + hex.EncodeToString(b[:]) + "/" + suffix
}

// objectPath is the request path of key under path-style addressing.
func objectPath(key string) string { return "/" + s3env.Bucket + "/" + key }

// countingTransport counts the HTTP requests it forwards, by method.
type countingTransport struct {
	next             http.RoundTripper
	gets, puts, dels atomic.Int64
	all              atomic.Int64
}

func (c *countingTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	c.all.Add(1)
	switch req.Method {
	case http.MethodGet, http.MethodHead:
		c.gets.Add(1)
	case http.MethodPut:
		c.puts.Add(1)
	case http.MethodDelete:
		c.dels.Add(1)
	}
	return c.next.RoundTrip(req)
}

func (c *countingTransport) reset() {
	c.gets.Store(0)
	c.puts.Store(0)
	c.dels.Store(0)
	c.all.Store(0)
}

// faultTransport lets a test decide, request by request, what happens.
type faultTransport struct {
	next http.RoundTripper
	fn   func(req *http.Request, next http.RoundTripper) (*http.Response, error)
}

func (f *faultTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	return f.fn(req, f.next)
}

// s3Error synthesises an S3 error response.
func s3Error(req *http.Request, status int, code string) *http.Response {
	if req.Body != nil {
		_ = req.Body.Close()
	}
	body := fmt.Sprintf(`<?xml version="1.0" encoding="UTF-8"?>`+"\n"+
		`<Error><Code>%s</Code><Message>injected by the test</Message><RequestId>test</RequestId></Error>`, code)
	return &http.Response{
		Status: fmt.Sprintf("%d %s", status, http.StatusText(status)), StatusCode: status,
		Proto: "HTTP/1.1", ProtoMajor: 1, ProtoMinor: 1,
		Header:        http.Header{"Content-Type": {"application/xml"}},
		Body:          io.NopCloser(strings.NewReader(body)),
		ContentLength: int64(len(body)),
		Request:       req,
	}
}

// discard drains and closes a response that a fault transport swallows.
func discard(resp *http.Response, err error) {
	if err == nil {
		_, _ = io.Copy(io.Discard, resp.Body)
		_ = resp.Body.Close()
	}
}

// observer reads key in a loop until stopped and records every token it
// saw, in order.
type observer struct {
	stop   chan struct{}
	done   chan struct{}
	mu     sync.Mutex
	tokens []uint64
	errs   []error
}

func observe(ctx context.Context, g *blobguard.Guard, key string) *observer {
	o := &observer{stop: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(o.done)
		for {
			select {
			case <-o.stop:
				return
			default:
			}
			obj, err := g.Get(ctx, key)
			o.mu.Lock()
			switch {
			case err == nil:
				o.tokens = append(o.tokens, uint64(obj.Token()))
			case !errors.Is(err, fence.ErrNotFound):
				o.errs = append(o.errs, err)
			}
			o.mu.Unlock()
		}
	}()
	return o
}

// finish stops the observer and checks that the tokens it saw never
// decreased.
func (o *observer) finish(t *testing.T) {
	t.Helper()
	close(o.stop)
	<-o.done
	for _, err := range o.errs {
		t.Errorf("observer: Get: %v", err)
	}
	for i := 1; i < len(o.tokens); i++ {
		if o.tokens[i] < o.tokens[i-1] {
			t.Errorf("observer: stored token decreased from %d to %d (read %d of %d)", o.tokens[i-1], o.tokens[i], i, len(o.tokens))
		}
	}
	t.Logf("observer: %d reads", len(o.tokens))
}
