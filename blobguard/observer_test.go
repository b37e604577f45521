package blobguard_test

import (
	"context"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/service/s3"

	"github.com/fencekit/fencekit/blobguard"
	"github.com/fencekit/fencekit/fence"
	"github.com/fencekit/fencekit/guardtest"
)

type callKey struct{}

// Every Put, PutIf and Delete reports one event with its outcome,
// classified from the error the caller got, against the real store.
func TestObserverSeesEveryWrite(t *testing.T) {
	t.Parallel()
	rec := &guardtest.Recorder{}
	g := newGuard(t, rawClient(baseTransport), blobguard.WithObserver(rec))
	key := uniqueKey(t, "obj")
	call := func(name string) context.Context {
		return context.WithValue(t.Context(), callKey{}, name)
	}
	check := func(call, op string, token fence.Token, err error, want fence.Outcome) {
		t.Helper()
		ev := rec.Take()
		if len(ev) != 1 {
			t.Fatalf("%s: %d events, want 1: %+v", call, len(ev), ev)
		}
		e := ev[0]
		if e.Guard != "blobguard" || e.Class != s3env.Bucket || e.Op != op || e.Token != token || e.Outcome != want || e.Err != err {
			t.Fatalf("%s: event %+v, want blobguard %s %s token %d outcome %s err %v", call, e, s3env.Bucket, op, token, want, err)
		}
		if e.Resource != "s3://"+s3env.Bucket+"/"+key || e.Ctx.Value(callKey{}) != call || e.Duration <= 0 {
			t.Fatalf("%s: event resource %q, context value %v, duration %v", call, e.Resource, e.Ctx.Value(callKey{}), e.Duration)
		}
	}
	v, err := g.Put(call("put"), key, 5, strings.NewReader("a"))
	check("put", "put", 5, err, fence.Accepted)
	_, err = g.Put(call("stale"), key, 4, strings.NewReader("b"))
	check("stale", "put", 4, err, fence.Rejected)
	_, err = g.PutIf(call("put-if"), key, 6, strings.NewReader("c"), v)
	check("put-if", "put-if", 6, err, fence.Accepted)
	_, err = g.Delete(call("delete"), key, fence.None)
	check("delete", "delete", fence.None, err, fence.Failed)

	// Unknown: every PUT is answered 500 without reaching the server.
	bad := newGuard(t, faultClient(t, key, func(req *http.Request, next http.RoundTripper) (*http.Response, error) {
		if req.Method == http.MethodPut {
			return s3Error(req, http.StatusInternalServerError, "InternalError"), nil
		}
		return next.RoundTrip(req)
	}, func(o *s3.Options) { o.RetryMaxAttempts = 1 }), blobguard.WithObserver(rec), func(o *blobguard.Options) {
		o.MaxAttempts = 2
		o.MinBackoff, o.MaxBackoff = time.Millisecond, 2*time.Millisecond
	})
	_, err = bad.Put(call("unknown"), key, 7, strings.NewReader("d"))
	check("unknown", "put", 7, err, fence.Unknown)
}
