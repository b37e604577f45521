package etcdlease_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/fencekit/fencekit/internal/testkit"
	"github.com/fencekit/fencekit/internal/testkit/faultnet"
	"github.com/fencekit/fencekit/lease"
	"github.com/fencekit/fencekit/lease/driver"
	"github.com/fencekit/fencekit/lease/etcdlease"
	"github.com/fencekit/fencekit/lease/etcdlease/etcdtest"
	"github.com/fencekit/fencekit/lease/leasetest"
)

// replyLoss starts a proxy in front of cl's first member and returns it
// with the endpoint to reach the member through it. Armed, the proxy loses
// the reply to the next call that carries the key of name under prefix p:
// the member applies the call, and the connection breaks before its reply
// reaches the client, which sends it again on a new connection.
func replyLoss(t *testing.T, cl *etcdtest.Cluster, p, name string) (*faultnet.Wire, string) {
	t.Helper()
	w := faultnet.GRPC([]byte(newBackend(t, cl.Client(), p).Key(name)))
	px := faultnet.StartProxy(t, strings.TrimPrefix(cl.Endpoints()[0], "http://"), w)
	return w, "http://" + px.Addr
}

// A clean release whose reply is lost (the connection breaks after the
// member applied it) is a release (leasetest.CheckReleaseReplyLost): the
// release is sent again on a new connection. By etcd's client itself when
// it was a Revoke (a "repeatable" call, retried on Unavailable), which then
// found the lease gone (ErrLeaseNotFound) and reported the lease lost, 3 of
// 3 rounds; by the backend now, whose release transaction finds the
// owner's ended record that its first attempt wrote.
func TestReleaseWhoseReplyIsLostIsARelease(t *testing.T) {
	cl := etcdtest.Start(t, 1)
	p := prefix(t)
	loss, endpoint := replyLoss(t, cl, p, "job")
	leasetest.CheckReleaseReplyLost(t, leasetest.ReplyLoss{
		Backend: newBackend(t, cl.Client(endpoint), p),
		Other:   newBackend(t, cl.Client(), p),
		Fault:   loss,
		Name:    "job",
		TTL:     3 * time.Second,
	})
}

// heldClient holds the next transaction it is armed for until released: a
// request delayed in the network, applied by etcd after everything sent
// meanwhile.
type heldClient struct {
	*clientv3.Client
	mu   sync.Mutex
	gate chan struct{}
	held chan struct{}
}

func (c *heldClient) hold() (held <-chan struct{}, release func()) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.gate, c.held = make(chan struct{}), make(chan struct{})
	gate := c.gate
	var once sync.Once
	return c.held, func() { once.Do(func() { close(gate) }) }
}

func (c *heldClient) Txn(ctx context.Context) clientv3.Txn {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.gate == nil {
		return c.Client.Txn(ctx)
	}
	t := &heldTxn{Txn: c.Client.Txn(ctx), gate: c.gate, held: c.held}
	c.gate, c.held = nil, nil
	return t
}

type heldTxn struct {
	clientv3.Txn
	gate, held chan struct{}
}

func (t *heldTxn) If(cs ...clientv3.Cmp) clientv3.Txn   { t.Txn = t.Txn.If(cs...); return t }
func (t *heldTxn) Then(ops ...clientv3.Op) clientv3.Txn { t.Txn = t.Txn.Then(ops...); return t }
func (t *heldTxn) Else(ops ...clientv3.Op) clientv3.Txn { t.Txn = t.Txn.Else(ops...); return t }
func (t *heldTxn) Commit() (*clientv3.TxnResponse, error) {
	close(t.held)
	<-t.gate
	return t.Txn.Commit()
}

// An acquire transaction that reaches etcd after its owner was ended is
// refused, so that it cannot leave a grant nobody holds:
//
//   - "released": an attempt is delayed; a retry with the same owner gets
//     the name, uses it and releases it (what a blocking Acquire did before
//     it abandoned attempts); then the first attempt arrives. It was
//     granted before the release recorded the owner as ended: a ghost grant
//     with a higher token, holding the name for nobody until its TTL.
//   - "abandoned": the delayed attempt's owner is abandoned (what the
//     Manager does now), another owner takes and releases the name, then
//     the attempt arrives.
//
// Either way the name stays free for the next owner.
func TestLateAcquireOfAnEndedOwnerIsRefused(t *testing.T) {
	cl := etcdtest.Start(t, 1)
	p := prefix(t)
	hc := &heldClient{Client: cl.Client()}
	late := newBackend(t, hc, p)
	b := newBackend(t, cl.Client(), p)
	const ttl = 2 * time.Second
	req := func(name, owner string) driver.Request { return driver.Request{Name: name, Owner: owner, TTL: ttl} }
	var owners atomic.Int32
	freeNow := func(t *testing.T, name string) driver.Grant {
		t.Helper()
		g, err := b.Acquire(testkit.Context(t), req(name, fmt.Sprintf("other-%d", owners.Add(1))))
		if err != nil {
			t.Fatalf("the name is not free: %v", err)
		}
		if err := b.Release(testkit.Context(t), g); err != nil {
			t.Fatal(err)
		}
		return g
	}
	// The late backend reads the epoch key once, with its first
	// transaction: do that now, so that the held one is the acquire.
	freeNow(t, "warm")
	if g, err := late.Acquire(testkit.Context(t), req("warm", "warm")); err != nil {
		t.Fatal(err)
	} else if err := late.Release(testkit.Context(t), g); err != nil {
		t.Fatal(err)
	}

	for _, mode := range []string{"released", "abandoned"} {
		t.Run(mode, func(t *testing.T) {
			name := "job-" + mode
			held, release := hc.hold()
			defer release()
			type result struct {
				g   driver.Grant
				err error
			}
			res := make(chan result, 1)
			go func() {
				g, err := late.Acquire(testkit.Context(t), req(name, "first"))
				res <- result{g, err}
			}()
			select {
			case <-held:
			case <-time.After(10 * time.Second):
				t.Fatal("the acquire transaction was not held")
			}
			var used driver.Grant
			if mode == "released" {
				g, err := late.Acquire(testkit.Context(t), req(name, "first"))
				if err != nil {
					t.Fatalf("the retry with the same owner: %v", err)
				}
				if err := late.Release(testkit.Context(t), g); err != nil {
					t.Fatal(err)
				}
				used = g
			} else {
				if err := late.Abandon(testkit.Context(t), req(name, "first")); err != nil {
					t.Fatalf("Abandon: %v", err)
				}
				used = freeNow(t, name)
			}
			release()
			r := <-res
			if !errors.Is(r.err, lease.ErrNotAcquired) {
				if r.err == nil {
					_ = late.Release(testkit.Context(t), r.g)
				}
				t.Fatalf("the late acquire of the ended owner = token %d (the name was used with token %d), %v; want ErrNotAcquired", r.g.Token, used.Token, r.err)
			}
			if next := freeNow(t, name); next.Token <= used.Token {
				t.Fatalf("token %d after %d", next.Token, used.Token)
			}
		})
	}
}

// A Watch whose confirmation never comes (the member's connection is
// blackholed after the client connected) returns ctx's error because ctx
// ended, and leaves nothing running, each of several rounds. Checked by
// mechanism, not by how long it took: the etcd watch request is out and
// Watch is still waiting when the test cancels ctx (it cannot have returned
// for any other reason before); it then returns ctx's own error, not a
// subscription or an error of the watch; and by the time it returns, the
// context of the etcd watch it started is cancelled (no other waiter
// shares it), so its goroutine ends and Close, which waits for every
// goroutine of its watches, returns. The Manager bounds each Watch by its
// PollInterval; this is the backend's side of that promise.
func TestWatchWithoutConfirmationHonoursContext(t *testing.T) {
	cl := etcdtest.Start(t, 1)
	p := prefix(t)
	proxy := faultnet.StartProxy(t, strings.TrimPrefix(cl.Endpoints()[0], "http://"), nil)
	cli := &watchRecorder{Client: cl.Client("http://" + proxy.Addr), started: make(chan context.Context, 8)}
	b, err := etcdlease.New(cli, etcdlease.WithPrefix(p), etcdlease.WithMinTTL(time.Second))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = b.Close() })
	// Connected first, so that the watch request goes out on a live
	// connection and only its answer is missing.
	if _, err := cli.Get(testkit.Context(t), "warm"); err != nil {
		t.Fatal(err)
	}
	// Nothing passes either way from now on, and no connection closes;
	// lifted before the clients close (cleanups run last-in first).
	proxy.Blackhole()
	t.Cleanup(proxy.Restore)
	// hang bounds the waits for what, with the bug, never happens at all
	// (Watch returning after ctx ended, Close returning): a test that
	// would otherwise hang fails instead. It is no measure of promptness.
	const hang = 30 * time.Second
	type result struct {
		sig  <-chan struct{}
		stop func()
		err  error
	}
	for round := 1; round <= 3; round++ {
		ctx, cancel := context.WithCancel(context.Background())
		res := make(chan result, 1)
		go func() {
			sig, stop, err := b.Watch(ctx, "job")
			res <- result{sig, stop, err}
		}()
		var wctx context.Context
		select {
		case wctx = <-cli.started:
		case r := <-res:
			cancel()
			if r.err == nil {
				r.stop()
			}
			t.Fatalf("round %d: Watch returned (%v, %v) before it started an etcd watch", round, r.sig, r.err)
		}
		// The etcd watch is requested; its confirmation cannot come.
		select {
		case r := <-res:
			cancel()
			if r.err == nil {
				r.stop()
			}
			t.Fatalf("round %d: Watch returned (%v, %v) before its ctx ended, through a blackholed connection", round, r.sig, r.err)
		default:
		}
		cancel()
		var r result
		select {
		case r = <-res:
		case <-time.After(hang):
			t.Fatalf("round %d: Watch had not returned %v after its ctx ended: it waits for the confirmation", round, hang)
		}
		if r.err == nil {
			r.stop()
			t.Fatalf("round %d: Watch through a blackholed connection returned a subscription (%v)", round, r.sig)
		}
		if !errors.Is(r.err, context.Canceled) || r.err != ctx.Err() {
			t.Errorf("round %d: Watch = %v, want its ctx's error %v", round, r.err, ctx.Err())
		}
		if wctx.Err() == nil {
			t.Errorf("round %d: Watch returned with the etcd watch it started still running (its last waiter left)", round)
		}
	}
	if n := len(cli.started); n != 0 {
		t.Errorf("%d etcd watch(es) more than the rounds' started", n)
	}
	closed := make(chan struct{})
	go func() { _ = b.Close(); close(closed) }()
	select {
	case <-closed:
	case <-time.After(hang):
		t.Fatalf("Close had not returned after %v: a watch's goroutine is still waiting for the confirmation", hang)
	}
}

// watchRecorder passes the context of every etcd watch the backend starts
// to started.
type watchRecorder struct {
	*clientv3.Client
	started chan context.Context
}

func (c *watchRecorder) Watch(ctx context.Context, key string, opts ...clientv3.OpOption) clientv3.WatchChan {
	c.started <- ctx
	return c.Client.Watch(ctx, key, opts...)
}
