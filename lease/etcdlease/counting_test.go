package etcdlease_test

import (
	"context"
	"sync"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/fencekit/fencekit/internal/testkit"
	"github.com/fencekit/fencekit/lease"
	"github.com/fencekit/fencekit/lease/etcdlease"
	"github.com/fencekit/fencekit/lease/etcdlease/etcdtest"
)

// countingClient counts, by kind, the requests the backend sends: unary
// calls, keep-alives and watch creations.
type countingClient struct {
	*clientv3.Client
	mu sync.Mutex
	n  map[string]int
}

var _ etcdlease.Client = (*countingClient)(nil)

func newCounting(c *clientv3.Client) *countingClient {
	return &countingClient{Client: c, n: map[string]int{}}
}

func (c *countingClient) add(kind string) {
	c.mu.Lock()
	c.n[kind]++
	c.mu.Unlock()
}

// take returns the counts since the last call, and resets them.
func (c *countingClient) take() map[string]int {
	c.mu.Lock()
	defer c.mu.Unlock()
	n := c.n
	c.n = map[string]int{}
	return n
}

func total(n map[string]int) int {
	s := 0
	for _, v := range n {
		s += v
	}
	return s
}

func (c *countingClient) Txn(ctx context.Context) clientv3.Txn {
	c.add("txn")
	return c.Client.Txn(ctx)
}
func (c *countingClient) Get(ctx context.Context, key string, opts ...clientv3.OpOption) (*clientv3.GetResponse, error) {
	c.add("get")
	return c.Client.Get(ctx, key, opts...)
}
func (c *countingClient) Grant(ctx context.Context, ttl int64) (*clientv3.LeaseGrantResponse, error) {
	c.add("grant")
	return c.Client.Grant(ctx, ttl)
}
func (c *countingClient) Revoke(ctx context.Context, id clientv3.LeaseID) (*clientv3.LeaseRevokeResponse, error) {
	c.add("revoke")
	return c.Client.Revoke(ctx, id)
}
func (c *countingClient) KeepAliveOnce(ctx context.Context, id clientv3.LeaseID) (*clientv3.LeaseKeepAliveResponse, error) {
	c.add("keepalive")
	return c.Client.KeepAliveOnce(ctx, id)
}
func (c *countingClient) Watch(ctx context.Context, key string, opts ...clientv3.OpOption) clientv3.WatchChan {
	c.add("watch")
	return c.Client.Watch(ctx, key, opts...)
}

// The requests of each step, and which go out together:
//
//   - the first Acquire of a backend reads the epoch once (a transaction);
//   - an Acquire: LeaseGrant, then the create-if-absent transaction (two
//     round trips), and the held key's watch (a message on the watch
//     stream, not waited for);
//   - a refused attempt keeps its lease: the next attempt sends only the
//     transaction and a keep-alive of that lease, together (one round
//     trip);
//   - Renew: a keep-alive and the key check, together (one round trip);
//   - Release: one transaction (delete the key if it is the grant's, record
//     the owner as ended); the grant's lease, confirmed less than half its
//     TTL ago and holding nothing any more, is kept as a refused attempt's
//     is (no revoke), so that the next Acquire sends the transaction and a
//     keep-alive together (one round trip); the backend's first Release also
//     grants the lease the ended-owner records share (once per
//     EndedOwnerTTL).
func TestRequestsPerStep(t *testing.T) {
	cl := etcdtest.Start(t, 1)
	cc := newCounting(cl.Client())
	b := newBackend(t, cc, prefix(t))
	m := testkit.NewManager(t, b, 5*time.Second, lease.WithoutAutoRenew())
	other := testkit.NewManager(t, newBackend(t, cl.Client(), b.Options().Prefix), 5*time.Second)
	ctx := testkit.Context(t)
	want := func(step string, got map[string]int, kinds map[string]int) {
		t.Helper()
		// The held key's watch and a released grant's revoke start in
		// goroutines of their own, which a loaded machine can run long
		// after the call returned: wait until the step's watches and
		// revokes are counted, so that none of them is counted in the
		// next step instead. The other requests are answered before the
		// call returns, so they are counted already. One that never comes
		// ends the wait at the timeout (30 s: a bound for "never", no
		// measure of promptness), and the counts below report it.
		for deadline := time.Now().Add(30 * time.Second); (got["watch"] < kinds["watch"] || got["revoke"] < kinds["revoke"]) && time.Now().Before(deadline); {
			time.Sleep(time.Millisecond)
			for k, v := range cc.take() {
				got[k] += v
			}
		}
		for k, v := range cc.take() {
			got[k] += v
		}
		for k, v := range kinds {
			if got[k] != v {
				t.Errorf("%s: %d %s requests, want %d (all: %v)", step, got[k], k, v, got)
			}
		}
		if total(got) != total(kinds) {
			t.Errorf("%s: %v, want %v", step, got, kinds)
		}
	}

	l, err := m.TryAcquire(ctx, "job")
	if err != nil {
		t.Fatal(err)
	}
	want("first Acquire", cc.take(), map[string]int{"txn": 2, "grant": 1, "watch": 1})
	if err := l.Renew(ctx); err != nil {
		t.Fatal(err)
	}
	want("Renew", cc.take(), map[string]int{"txn": 1, "keepalive": 1})
	if err := l.Release(ctx); err != nil {
		t.Fatal(err)
	}
	want("first Release", cc.take(), map[string]int{"txn": 1, "grant": 1})
	l, err = m.TryAcquire(ctx, "job")
	if err != nil {
		t.Fatal(err)
	}
	want("Acquire with the released grant's lease", cc.take(), map[string]int{"txn": 1, "keepalive": 1, "watch": 1})
	if err := l.Release(ctx); err != nil {
		t.Fatal(err)
	}
	want("Release", cc.take(), map[string]int{"txn": 1})

	held, err := other.TryAcquire(ctx, "job")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := m.TryAcquire(ctx, "job"); err == nil {
		t.Fatal("acquired a held lease")
	}
	want("refused attempt", cc.take(), map[string]int{"txn": 1, "keepalive": 1})
	if _, err := m.TryAcquire(ctx, "job"); err == nil {
		t.Fatal("acquired a held lease")
	}
	want("refused attempt with the lease of the one before", cc.take(), map[string]int{"txn": 1, "keepalive": 1})
	if err := held.Release(ctx); err != nil {
		t.Fatal(err)
	}
	l, err = m.TryAcquire(ctx, "job")
	if err != nil {
		t.Fatal(err)
	}
	want("Acquire with the lease of a refused attempt", cc.take(), map[string]int{"txn": 1, "keepalive": 1, "watch": 1})
	_ = l.Release(ctx)
}
