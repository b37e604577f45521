package blobguard_test

import (
	"bytes"
	"context"
	"errors"
	"net"
	"net/http"
	"sync/atomic"
	"testing"

	"github.com/fencekit/fencekit/blobguard"
	"github.com/fencekit/fencekit/fence"
	"github.com/fencekit/fencekit/guardtest"
)

// TestConformance runs the guard conformance suite against the real S3
// server, for Put (reading whole objects, and reading headers only) and
// for PutIf (read-modify-write: Get, then PutIf on the version read). A
// resource is one key; Put and PutIf create a missing key, so there is no
// missing target.
func TestConformance(t *testing.T) {
	t.Parallel()
	for _, variant := range []struct {
		name  string
		putIf bool
		opts  []blobguard.Option
	}{
		{name: "Put"},
		{name: "PutHeaderReads", opts: []blobguard.Option{blobguard.WithHeaderReads()}},
		{name: "PutIf", putIf: true},
	} {
		t.Run(variant.name, func(t *testing.T) {
			t.Parallel()
			guardtest.Run(t, guardtest.Config{
				NewResource: func(t *testing.T) guardtest.Resource {
					r := &confObject{key: uniqueKey(t, "conf"), putIf: variant.putIf}
					r.tr = &confTransport{next: newTransport(t)}
					r.g = newGuard(t, rawClient(r.tr), variant.opts...)
					return r
				},
				CountIO:   func(r guardtest.Resource) int64 { return r.(*confObject).guardIO() },
				LoseReply: func(t *testing.T, r guardtest.Resource) { r.(*confObject).tr.armed.Store(true) },
				Observe: func(t *testing.T, r guardtest.Resource, o fence.WriteObserver) guardtest.Want {
					c := r.(*confObject)
					c.g = newGuard(t, rawClient(c.tr), append(variant.opts, blobguard.WithObserver(o))...)
					op := "put"
					if c.putIf {
						op = "put-if"
					}
					return guardtest.Want{Guard: "blobguard", Class: s3env.Bucket, Op: op, Resource: "s3://" + s3env.Bucket + "/" + c.key}
				},
				Check: func(ctx context.Context, r guardtest.Resource) error { return r.(*confObject).g.Check(ctx) },
				// A guard of a bucket that does not exist.
				NewBroken: func(t *testing.T) guardtest.Resource {
					r := &confObject{key: uniqueKey(t, "conf"), putIf: variant.putIf, tr: &confTransport{next: newTransport(t)}}
					var err error
					if r.g, err = blobguard.New(rawClient(r.tr), "fencekit-missing-bucket", variant.opts...); err != nil {
						t.Fatal(err)
					}
					return r
				},
				Lacks: map[guardtest.Capability]string{
					guardtest.Missing: "Put and PutIf create a key that holds nothing: no key is missing",
				},
			})
		})
	}
}

// confObject is one key, written through one Guard.
type confObject struct {
	key   string
	putIf bool
	g     *blobguard.Guard
	tr    *confTransport
	// readIO counts the requests of the adapter's own Get before PutIf,
	// which are not the guard's I/O (exact when writes do not overlap).
	readIO atomic.Int64
}

// guardIO returns the requests the guard sent on its own.
func (r *confObject) guardIO() int64 { return r.tr.requests.Load() - r.readIO.Load() }

func (r *confObject) Write(ctx context.Context, token fence.Token, value string) error {
	// A lost reply partitions the guard from the store until this call
	// returns.
	defer r.tr.partitioned.Store(false)
	if !r.putIf {
		_, err := r.g.Put(ctx, r.key, token, bytes.NewReader([]byte(value)))
		return err
	}
	var prev blobguard.Version
	before := r.tr.requests.Load()
	obj, err := r.g.Get(ctx, r.key)
	r.readIO.Add(r.tr.requests.Load() - before)
	switch {
	case err == nil:
		prev = obj.Version
	case errors.Is(err, fence.ErrNotFound):
		prev, _ = blobguard.TombstoneOf(err)
	default:
		return err
	}
	_, err = r.g.PutIf(ctx, r.key, token, bytes.NewReader([]byte(value)), prev)
	return err
}

func (r *confObject) Read(ctx context.Context) (string, fence.Token, error) {
	obj, err := r.g.Get(ctx, r.key)
	if errors.Is(err, fence.ErrNotFound) {
		return "", fence.None, nil
	}
	if err != nil {
		return "", fence.None, err
	}
	return string(obj.Body), obj.Token(), nil
}

// confTransport counts the requests it sends, and once armed lets the
// next PUT reach the store, drops the store's answer and fails that
// request and every later one until the write that sent it returns (as a
// network partition right after the store applied the write would).
type confTransport struct {
	next        http.RoundTripper
	requests    atomic.Int64
	armed       atomic.Bool
	partitioned atomic.Bool
}

var errPartitioned = &net.OpError{Op: "read", Net: "tcp", Err: errors.New("connection reset (injected by the test)")}

func (c *confTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	c.requests.Add(1)
	if c.partitioned.Load() {
		if req.Body != nil {
			_ = req.Body.Close()
		}
		return nil, errPartitioned
	}
	if req.Method == http.MethodPut && c.armed.Swap(false) {
		resp, err := c.next.RoundTrip(req)
		discard(resp, err)
		c.partitioned.Store(true)
		return nil, errPartitioned
	}
	return c.next.RoundTrip(req)
}
