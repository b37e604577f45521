package redislease_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/fencekit/fencekit/internal/testkit"
	"github.com/fencekit/fencekit/internal/testkit/testenv"
	"github.com/fencekit/fencekit/lease"
	"github.com/fencekit/fencekit/lease/driver"
	"github.com/fencekit/fencekit/lease/redislease/redistest"
)

// slowDialClient is a client of the shared Redis whose new connections take
// dialDelay to open while slow is set (a congested network, a TLS handshake
// to a far region). It keeps a few pooled connections open so that only
// new connections, such as the backend's pub/sub connection, are slow.
func slowDialClient(t *testing.T, slow *atomic.Bool, dialDelay time.Duration) *redis.Client {
	t.Helper()
	opt, err := redis.ParseURL(testenv.RedisURL())
	if err != nil {
		t.Fatal(err)
	}
	opt.ContextTimeoutEnabled = true
	opt.MinIdleConns = 4
	opt.Dialer = func(ctx context.Context, network, addr string) (net.Conn, error) {
		if slow.Load() {
			select {
			case <-time.After(dialDelay):
			case <-ctx.Done():
				return nil, ctx.Err()
			}
		}
		var d net.Dialer
		return d.DialContext(ctx, network, addr)
	}
	c := redis.NewClient(opt)
	t.Cleanup(func() { _ = c.Close() })
	deadline := time.Now().Add(5 * time.Second)
	for c.PoolStats().IdleConns < 4 {
		if time.Now().After(deadline) {
			t.Fatalf("pool did not fill: %+v", c.PoolStats())
		}
		time.Sleep(10 * time.Millisecond)
	}
	return c
}

// TestHostile_CancelledWaiterBreaksOthersWatch: waiter A, whose context
// ends while the backend is subscribing to the lease's release channel,
// hands its own context error to every waiter that joined the same
// subscription meanwhile. Those waiters (whose contexts are fine) fall back
// to polling for their whole wait, so a release wakes them only after a
// jittered PollInterval instead of at once.
//
// Cause: hub.watch (hub.go) stores the first waiter's ps.Subscribe error,
// made under the first waiter's ctx, in the shared channelSubs.err, and
// every waiter on that channelSubs returns it.
func TestHostile_CancelledWaiterBreaksOthersWatch(t *testing.T) {
	var slow atomic.Bool
	c := slowDialClient(t, &slow, 500*time.Millisecond)
	b := newBackend(t, c, redistest.Prefix(t))
	logs := &warnLog{}
	m := newManager(t, b, lease.Options{TTL: 30 * time.Second, PollInterval: 6 * time.Second, Logger: slog.New(logs)})
	const name = "shared-subscribe"
	holder := testkit.TryAcquire(t, m, name)

	slow.Store(true) // the pub/sub connection is not open yet: it will be slow
	aDone := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 150*time.Millisecond)
		defer cancel()
		_, err := m.Acquire(ctx, name)
		aDone <- err
	}()
	time.Sleep(50 * time.Millisecond) // A is subscribing; B joins its subscription
	type result struct {
		l   *lease.Lease
		err error
		at  time.Time
	}
	bDone := make(chan result, 1)
	go func() {
		l, err := m.Acquire(testkit.Context(t), name)
		bDone <- result{l, err, time.Now()}
	}()
	if err := <-aDone; !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("waiter A: %v, want its deadline", err)
	}
	time.Sleep(600 * time.Millisecond)
	slow.Store(false)

	released := time.Now()
	if err := holder.Release(testkit.Context(t)); err != nil {
		t.Fatal(err)
	}
	select {
	case r := <-bDone:
		if r.err != nil {
			t.Fatalf("waiter B: %v", r.err)
		}
		t.Logf("waiter B woke %v after the release", r.at.Sub(released))
		_ = r.l.Release(testkit.Context(t))
	case <-time.After(2 * time.Second):
		r := <-bDone // let it finish: no goroutine left behind
		if r.l != nil {
			_ = r.l.Release(testkit.Context(t))
		}
		t.Fatalf("waiter B, whose context was live, was not woken by the release: it acquired %v after it (PollInterval 6s); warnings: %q",
			r.at.Sub(released), logs.messages())
	}
}

// warnLog is a slog.Handler that keeps warnings with their "err" attribute.
type warnLog struct {
	mu   sync.Mutex
	msgs []string
}

func (w *warnLog) Enabled(_ context.Context, l slog.Level) bool { return l >= slog.LevelWarn }
func (w *warnLog) Handle(_ context.Context, r slog.Record) error {
	s := r.Message
	r.Attrs(func(a slog.Attr) bool {
		if a.Key == "err" {
			s += fmt.Sprintf(" (err: %v)", a.Value)
		}
		return true
	})
	w.mu.Lock()
	w.msgs = append(w.msgs, s)
	w.mu.Unlock()
	return nil
}
func (w *warnLog) WithAttrs([]slog.Attr) slog.Handler { return w }
func (w *warnLog) WithGroup(string) slog.Handler      { return w }
func (w *warnLog) messages() []string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return append([]string(nil), w.msgs...)
}

// TestHostile_FailedSubscribeLeaksSubscription: a Watch whose subscribe
// fails (its context ends while the pub/sub connection is being opened)
// leaves the channel subscribed at Redis forever, with no waiter. go-redis's
// PubSub.Subscribe records the channel even when it returns an error, and
// re-subscribes it on the next (re)connect; hub.detach skips Unsubscribe
// when cs.err != nil. A service that waits on many distinct names under
// request deadlines accumulates subscriptions without bound.
func TestHostile_FailedSubscribeLeaksSubscription(t *testing.T) {
	var slow atomic.Bool
	c := slowDialClient(t, &slow, 500*time.Millisecond)
	b := newBackend(t, c, redistest.Prefix(t))
	const names = 5
	slow.Store(true)
	for i := range names {
		ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
		_, _, err := b.Watch(ctx, fmt.Sprintf("leak-%d", i))
		cancel()
		if err == nil {
			t.Fatalf("Watch %d succeeded over a connection that takes 500ms to open", i)
		}
	}
	slow.Store(false)
	// A later, successful Watch on another name opens the connection.
	_, stop, err := b.Watch(testkit.Context(t), "other")
	if err != nil {
		t.Fatal(err)
	}
	stop()
	time.Sleep(200 * time.Millisecond)
	var leaked []string
	for i := range names {
		ch := b.KeysFor(fmt.Sprintf("leak-%d", i)).Channel
		// Sharded pub/sub on Redis 7 (SSUBSCRIBE), classic elsewhere.
		if n := c.PubSubShardNumSub(testkit.Context(t), ch).Val()[ch] + c.PubSubNumSub(testkit.Context(t), ch).Val()[ch]; n != 0 {
			leaked = append(leaked, ch)
		}
	}
	if len(leaked) > 0 {
		t.Fatalf("no one watches, yet %d of %d channels are still subscribed: %q", len(leaked), names, leaked)
	}
}

// TestHostile_NaNCounterStoresPhantomGrant: a token counter that holds
// "nan" (Lua's tonumber accepts it, as it accepts "inf" and "0x10")
// makes acquire.lua compute token = NaN, which passes both of its checks
// (NaN < floor and NaN >= 2^53 are false), so the script stores the grant
// with the token string.format('%d', NaN) = "-9223372036854775808" and
// returns it. The backend rejects the token and reports an error, yet the
// grant stays in Redis under the caller's owner, so every other owner is
// refused for a full TTL by a holder that does not exist; the counter is
// overwritten with a negative number.
//
// Cause: acquire.lua lines 18-25 parse the counter with tonumber and never
// check that the result is a finite integer. Fix: reject
// token ~= token, token ~= math.floor(token), or a counter that does not
// match '^%d+$', with an error reply before any write.
func TestHostile_NaNCounterStoresPhantomGrant(t *testing.T) {
	c := redistest.Shared(t)
	b := newBackend(t, c, redistest.Prefix(t))
	const name = "nan-counter"
	k := b.KeysFor(name)
	if err := c.Set(testkit.Context(t), k.Token, "nan", 0).Err(); err != nil {
		t.Fatal(err)
	}
	g, err := b.Acquire(testkit.Context(t), driver.Request{Name: name, Owner: "a", TTL: 30 * time.Second})
	if err == nil {
		t.Fatalf("Acquire with a corrupt counter granted token %d", g.Token)
	}
	if n := c.Exists(testkit.Context(t), k.Lease).Val(); n != 0 {
		stored := c.Get(testkit.Context(t), k.Lease).Val()
		_, err2 := b.Acquire(testkit.Context(t), driver.Request{Name: name, Owner: "b", TTL: 30 * time.Second})
		t.Fatalf("Acquire failed (%v), yet a grant %v is stored; another owner's Acquire: %v", err, stored, err2)
	}
}

// TestHostile_SecondReleaseForgetsLoss: the store let a held lease go (the
// key was evicted, or expired while the release was on its way). The first
// Release reports it lost, as documented, but the lease keeps ErrReleased
// as its end: Err() and context.Cause say "released", and a second Release
// returns nil, so a deferred Release after an explicit one (or the other
// way round) contradicts the first answer. Invariant 4: releasing a lost
// lease reports that it was lost; releasing twice is harmless.
//
// Cause: Lease.Release (lease.go) sets state = released and endErr =
// ErrReleased before the store call, and when the store answers ErrNotHeld
// it sets storeReleased = true and returns a fresh LostError without
// recording it in endErr; the next call takes the "done" path and returns
// nil for endErr == ErrReleased.
func TestHostile_SecondReleaseForgetsLoss(t *testing.T) {
	c := redistest.Shared(t)
	b := newBackend(t, c, redistest.Prefix(t))
	m := newManager(t, b, lease.Options{TTL: 30 * time.Second})
	l := testkit.TryAcquire(t, m, "evicted")
	if err := c.Del(testkit.Context(t), b.KeysFor("evicted").Lease).Err(); err != nil {
		t.Fatal(err)
	}
	first := l.Release(testkit.Context(t))
	if !errors.Is(first, lease.ErrLost) {
		t.Fatalf("first Release = %v, want ErrLost", first)
	}
	second := l.Release(testkit.Context(t))
	if !errors.Is(second, lease.ErrLost) || !errors.Is(l.Err(), lease.ErrLost) {
		t.Fatalf("after the first Release reported %q: second Release = %v, Err() = %v, context cause = %v; want ErrLost throughout",
			first, second, l.Err(), context.Cause(l.Context()))
	}
}

// TestLeaseKeyWithoutTTLIsAnError: a lease key that some other writer set
// without a TTL ("5:other", as fencekit would write it, but never
// expiring) holds the lease forever. PTTL answers -1 for it, which the
// refusal's "-pttl - 1" turned into 0, reported as "the store returned
// token 0". Acquire must say what is wrong instead, and change nothing.
func TestLeaseKeyWithoutTTLIsAnError(t *testing.T) {
	c := redistest.Shared(t)
	b := newBackend(t, c, redistest.Prefix(t))
	const name = "no-ttl"
	k := b.KeysFor(name)
	if err := c.Set(testkit.Context(t), k.Lease, "5:other", 0).Err(); err != nil {
		t.Fatal(err)
	}
	_, err := b.Acquire(testkit.Context(t), driver.Request{Name: name, Owner: "a", TTL: 30 * time.Second})
	var na *lease.NotAcquiredError
	if err == nil || errors.As(err, &na) || !strings.Contains(err.Error(), "has no TTL") {
		t.Fatalf("Acquire over a lease key without a TTL: %v; want an error saying the key has no TTL", err)
	}
	if v := c.Get(testkit.Context(t), k.Lease).Val(); v != "5:other" {
		t.Fatalf("the lease key now holds %q", v)
	}
	if n := c.Exists(testkit.Context(t), k.Token).Val(); n != 0 {
		t.Fatalf("the token counter was written")
	}
}
