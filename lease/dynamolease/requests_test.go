package dynamolease_test

import (
	"errors"
	"net/http"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fencekit/fencekit/dynamoguard/dynamotest"
	"github.com/fencekit/fencekit/internal/testkit"
	"github.com/fencekit/fencekit/lease"
	"github.com/fencekit/fencekit/lease/driver"
	"github.com/fencekit/fencekit/lease/dynamolease"
)

type countingTransport struct {
	next http.RoundTripper
	n    atomic.Int64
}

func (c *countingTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	c.n.Add(1)
	return c.next.RoundTrip(r)
}

// TestOneRequestEach: acquire (free or held by another), renew and release
// are one request each.
func TestOneRequestEach(t *testing.T) {
	t.Parallel()
	table := newTable(t)
	tr := http.DefaultTransport.(*http.Transport).Clone()
	t.Cleanup(tr.CloseIdleConnections)
	ct := &countingTransport{next: tr}
	b, err := dynamolease.New(dynamotest.ClientVia(t, ct), table)
	if err != nil {
		t.Fatal(err)
	}
	count := func(what string, f func() error, wantErr error) {
		t.Helper()
		n0 := ct.n.Load()
		if err := f(); !errors.Is(err, wantErr) {
			t.Fatalf("%s: %v, want %v", what, err, wantErr)
		}
		if n := ct.n.Load() - n0; n != 1 {
			t.Fatalf("%s sent %d requests, want 1", what, n)
		}
	}
	var g driver.Grant
	count("Acquire of a free lease", func() (err error) {
		g, err = b.Acquire(testkit.Context(t), driver.Request{Name: "n", Owner: "a", TTL: time.Second})
		return err
	}, nil)
	count("Acquire of a held lease", func() error {
		_, err := b.Acquire(testkit.Context(t), driver.Request{Name: "n", Owner: "b", TTL: time.Second})
		return err
	}, lease.ErrNotAcquired)
	count("Renew", func() error { return b.Renew(testkit.Context(t), g) }, nil)
	count("Release", func() error { return b.Release(testkit.Context(t), g) }, nil)
	count("Acquire after a release", func() error {
		_, err := b.Acquire(testkit.Context(t), driver.Request{Name: "n", Owner: "c", TTL: time.Second})
		return err
	}, nil)
}

// TestKeyPrefixesShareATable: two backends with different key prefixes on
// one table hold the same lease name independently.
func TestKeyPrefixesShareATable(t *testing.T) {
	t.Parallel()
	table := newTable(t)
	b1 := newBackend(t, table, dynamolease.WithKeyPrefix("one/"))
	b2 := newBackend(t, table, dynamolease.WithKeyPrefix("two/"))
	if _, err := b1.Acquire(testkit.Context(t), driver.Request{Name: "n", Owner: "a", TTL: time.Second}); err != nil {
		t.Fatal(err)
	}
	if _, err := b2.Acquire(testkit.Context(t), driver.Request{Name: "n", Owner: "b", TTL: time.Second}); err != nil {
		t.Fatalf("the same name under another prefix: %v", err)
	}
	if _, err := newBackend(t, table, dynamolease.WithKeyPrefix("one/")).Acquire(testkit.Context(t), driver.Request{Name: "n", Owner: "c", TTL: time.Second}); !errors.Is(err, lease.ErrNotAcquired) {
		t.Fatalf("the same name under the same prefix = %v, want ErrNotAcquired", err)
	}
}
