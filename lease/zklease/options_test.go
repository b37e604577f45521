package zklease_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/fencekit/fencekit/lease"
	"github.com/fencekit/fencekit/lease/driver"
	"github.com/fencekit/fencekit/lease/zklease"
)

// New reports every problem with its arguments at once, before any I/O.
func TestNewRejectsBadOptions(t *testing.T) {
	_, err := zklease.New([]string{"no-port", ""}, func(o *zklease.Options) {
		o.SessionTimeout = 10 * time.Millisecond
		o.Root = "relative/root/"
		o.Identity = "bad\x00identity"
	})
	if !errors.Is(err, zklease.ErrInvalidOptions) {
		t.Fatalf("New = %v, want ErrInvalidOptions", err)
	}
	for _, want := range []string{`"no-port"`, `""`, "session timeout", "root", "identity"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("the error does not mention %s: %v", want, err)
		}
	}
	for _, tc := range []struct {
		what string
		opt  zklease.Option
	}{
		{"no servers", nil},
		{"root /", zklease.WithRoot("/")},
		{"root with ..", zklease.WithRoot("/a/../b")},
		{"a session timeout that is not whole milliseconds", zklease.WithSessionTimeout(time.Second + time.Microsecond)},
	} {
		servers := []string{"127.0.0.1:1"}
		if tc.opt == nil {
			servers = nil
		}
		if _, err := zklease.New(servers, tc.opt); !errors.Is(err, zklease.ErrInvalidOptions) {
			t.Errorf("%s: New = %v, want ErrInvalidOptions", tc.what, err)
		}
	}
}

// Bad input to the backend's calls is refused before any request: the
// backend points at a port where nothing listens, and every call returns at
// once with a clear error. (Names are the Manager's to check: the
// conformance suite's ManagerRefusesInvalidNames.)
func TestBadInputRefusedBeforeIO(t *testing.T) {
	// Nothing listens there: the backend never gets a session.
	b, err := zklease.New([]string{"127.0.0.1:1"}, zklease.WithSessionTimeout(2*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	// A call that waited for a session would return only when ctx ended
	// (after a minute, a bound for "never": no machine is that slow to
	// refuse without I/O), with ctx's error; one refused before any
	// request returns while ctx is live, with an error of its own.
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	for _, tc := range []struct {
		what string
		req  driver.Request
		want error
	}{
		{"a TTL longer than the session timeout", driver.Request{Name: "n", Owner: "a", TTL: 3 * time.Second}, nil},
		{"a TTL below MinTTL", driver.Request{Name: "n", Owner: "a", TTL: time.Millisecond}, nil},
	} {
		start := time.Now()
		_, err := b.Acquire(ctx, tc.req)
		if err == nil || (tc.want != nil && !errors.Is(err, tc.want)) || ctx.Err() != nil || errors.Is(err, context.DeadlineExceeded) {
			t.Errorf("Acquire with %s = %v after %v; want a clear error before ctx ended", tc.what, err, time.Since(start))
		}
	}
	if err := b.Release(ctx, driver.Grant{Name: "n", Owner: "a", Token: 1}); !errors.Is(err, lease.ErrNotHeld) {
		t.Errorf("Release of a grant zklease did not make = %v, want ErrNotHeld", err)
	}
	if err := b.Renew(ctx, driver.Grant{Name: "n", Owner: "a", Token: 1}); !errors.Is(err, lease.ErrNotHeld) {
		t.Errorf("Renew of a grant zklease did not make = %v, want ErrNotHeld", err)
	}
	if _, err := lease.NewManager(b, 3*time.Second); !errors.Is(err, lease.ErrInvalidOptions) {
		t.Errorf("NewManager with a TTL above the session timeout = %v, want ErrInvalidOptions", err)
	}
}
