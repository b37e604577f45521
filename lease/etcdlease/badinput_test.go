package etcdlease_test

import (
	"errors"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/fencekit/fencekit/internal/testkit"
	"github.com/fencekit/fencekit/lease"
	"github.com/fencekit/fencekit/lease/driver"
	"github.com/fencekit/fencekit/lease/etcdlease"
)

// New reports every bad option at once, before any I/O.
func TestNewRejectsBadOptions(t *testing.T) {
	_, err := etcdlease.New(nil, etcdlease.WithPrefix(""), etcdlease.WithMinTTL(1500*time.Millisecond))
	if !errors.Is(err, etcdlease.ErrInvalidOptions) {
		t.Fatalf("New = %v, want ErrInvalidOptions", err)
	}
	for _, want := range []string{"client is nil", "prefix is empty", "MinTTL is 1.5s"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("New's error %q does not say %q", err, want)
		}
	}
	for _, d := range []time.Duration{0, 500 * time.Millisecond, -time.Second} {
		if _, err := etcdlease.New(&clientv3.Client{}, etcdlease.WithMinTTL(d)); !errors.Is(err, etcdlease.ErrInvalidOptions) {
			t.Errorf("New with MinTTL %v = %v, want ErrInvalidOptions", d, err)
		}
	}
	b, err := etcdlease.New(&clientv3.Client{}, func(o *etcdlease.Options) { o.Prefix = "p/"; o.MinTTL = 3 * time.Second })
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	if lim := b.Limits(); lim.MinTTL != 3*time.Second || lim.Resolution != time.Second || lim.MaxTTL != etcdlease.MaxTTL {
		t.Fatalf("Limits = %+v", lim)
	}
	if b.Key("a/b") != "p/l/a/b" || b.EpochKey() != "p/epoch" {
		t.Fatalf("keys %q, %q", b.Key("a/b"), b.EpochKey())
	}
	// The Manager refuses TTLs the backend cannot honour, before any I/O.
	for _, ttl := range []time.Duration{time.Second, 2500 * time.Millisecond} {
		if _, err := lease.NewManager(b, ttl); !errors.Is(err, lease.ErrInvalidOptions) {
			t.Errorf("NewManager(ttl %v) = %v, want ErrInvalidOptions", ttl, err)
		}
	}
}

// Bad requests get a clear error before any I/O: the client here has no
// connection, and would panic if used. (Names are the Manager's to check:
// the conformance suite's ManagerRefusesInvalidNames.)
func TestAcquireRejectsBadInputBeforeIO(t *testing.T) {
	b, err := etcdlease.New(&clientv3.Client{})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	ctx := testkit.Context(t)
	for _, r := range []driver.Request{
		{Name: "n", Owner: "", TTL: time.Second},
		{Name: "n", Owner: "o", TTL: 0},
		{Name: "n", Owner: "o", TTL: -time.Second},
	} {
		if g, err := b.Acquire(ctx, r); err == nil {
			t.Errorf("Acquire(%+v) = %+v, want an error", r, g)
		}
	}
	// Grants the backend did not make are not held, and nothing is sent.
	forged := driver.Grant{Name: "n", Owner: "o", Token: 7, TTL: time.Second}
	if err := b.Renew(ctx, forged); !errors.Is(err, lease.ErrNotHeld) {
		t.Errorf("Renew(forged) = %v, want ErrNotHeld", err)
	}
	if err := b.Release(ctx, forged); !errors.Is(err, lease.ErrNotHeld) {
		t.Errorf("Release(forged) = %v, want ErrNotHeld", err)
	}
	_ = b.Close()
	if _, err := b.Acquire(ctx, driver.Request{Name: "n", Owner: "o", TTL: 2 * time.Second}); !errors.Is(err, etcdlease.ErrClosed) {
		t.Errorf("Acquire after Close = %v, want ErrClosed", err)
	}
	if _, _, err := b.Watch(ctx, "n"); !errors.Is(err, etcdlease.ErrClosed) {
		t.Errorf("Watch after Close = %v, want ErrClosed", err)
	}
}
