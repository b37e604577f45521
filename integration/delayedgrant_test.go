package integration

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/fencekit/fencekit/fence"
	"github.com/fencekit/fencekit/internal/rig/toxi"
	"github.com/fencekit/fencekit/lease"
	"github.com/fencekit/fencekit/lease/driver"
	"github.com/fencekit/fencekit/lease/redislease"
	"github.com/fencekit/fencekit/lease/redislease/redistest"
)

// The delayed-grant tests put toxiproxy (in-process) between a lease
// client and a redis-server owned by the test, and hold back the replies
// from Redis with a latency toxic. The acquire request reaches Redis at
// once and is granted there; only the caller learns of it late. A caller
// whose grant arrives after the grant's TTL must not come away believing
// it holds the lease; one whose grant arrives within it must count the
// lease's validity from when it sent the request, not from when the reply
// came.

// delayedRedis is a test-owned redis-server, a toxiproxy proxy in front of
// it, and clients on both sides.
type delayedRedis struct {
	t      *testing.T
	proxy  *toxi.Proxy
	direct *redis.Client // to redis-server, no delay
	slow   *redis.Client // through the proxy
	prefix string
	// delayName is the latency toxic's, once delay added it.
	delayName string
}

func newDelayedRedis(t *testing.T) *delayedRedis {
	t.Helper()
	srv := redistest.Start(t)
	proxy := toxi.Start(t, srv.Addr)
	d := &delayedRedis{t: t, proxy: proxy, direct: srv.Client(), prefix: redistest.Prefix(t)}
	// No retries: a retried command would be sent again, and the test
	// must see exactly one request per attempt. The read timeout is far
	// above the delays used.
	d.slow = redis.NewClient(&redis.Options{Addr: proxy.Addr, ContextTimeoutEnabled: true, MaxRetries: -1, ReadTimeout: 20 * time.Second})
	t.Cleanup(func() { _ = d.slow.Close() })
	return d
}

// delay holds back every reply from Redis by latency until the toxic is
// removed or the test ends. Call it after the clients and managers are
// made: its cleanup, which removes the toxic, must run before theirs.
func (d *delayedRedis) delay(latency time.Duration) {
	d.t.Helper()
	name, err := d.proxy.Add("latency", "downstream", fmt.Sprintf(`"latency":%d`, latency.Milliseconds()))
	if err != nil {
		d.t.Fatal(err)
	}
	d.delayName = name
	// A latency toxic that still holds data when its connection closes
	// blocks forever (a leaked goroutine); removed while the connections
	// are open, it passes the data on and ends.
	d.t.Cleanup(d.proxy.Reset)
}

// manager returns a Manager over c, with the backend wrapped to record
// every acquire request. The backend is closed when the test ends.
func (d *delayedRedis) manager(c *redis.Client, ttl time.Duration) (*lease.Manager, *recordingBackend) {
	d.t.Helper()
	b, err := redislease.New(c, func(o *redislease.Options) { o.Prefix = d.prefix })
	if err != nil {
		d.t.Fatal(err)
	}
	d.t.Cleanup(func() { _ = b.Close() })
	rb := &recordingBackend{Backend: b}
	m, err := lease.NewManager(rb, ttl)
	if err != nil {
		d.t.Fatal(err)
	}
	return m, rb
}

// warmUp opens the slow client's connection and loads the scripts into
// redis-server before any delay, so that the timed requests are exactly one
// round trip each (no dial, no EVALSHA miss). It holds a lease through one
// automatic renewal, which loads the renew script (the batched heartbeat
// sends EVALSHA and, on NOSCRIPT, loads the script and sends it again: three
// round trips the first time).
func (d *delayedRedis) warmUp(m *lease.Manager) {
	d.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	l, err := m.TryAcquire(ctx, "warm-up")
	if err != nil {
		d.t.Fatalf("warm-up acquire: %v", err)
	}
	time.Sleep(m.Options().RenewInterval * 3 / 2)
	if err := l.Err(); err != nil {
		d.t.Fatalf("warm-up lease: %v", err)
	}
	if err := l.Release(ctx); err != nil {
		d.t.Fatalf("warm-up release: %v", err)
	}
}

// recordingBackend records when each acquire request was sent and what the
// store answered. It embeds the Redis backend, so the Manager still finds
// its Watcher and BatchRenewer.
type recordingBackend struct {
	*redislease.Backend
	mu    sync.Mutex
	calls []acquireCall
}

type acquireCall struct {
	name           string
	sent, returned time.Time
	deadline       time.Time // of the request's context; zero if none
	token          fence.Token
	err            error
}

// abandonedBy reports whether the call ended without a grant, its context
// having had a deadline at most validity after the call began.
func (c acquireCall) abandonedBy(validity time.Duration) bool {
	return c.err != nil && c.token == 0 && !c.deadline.IsZero() && !c.deadline.After(c.sent.Add(validity))
}

func (b *recordingBackend) Acquire(ctx context.Context, req driver.Request) (driver.Grant, error) {
	sent := time.Now() // after the Manager's own send time
	deadline, _ := ctx.Deadline()
	g, err := b.Backend.Acquire(ctx, req)
	b.mu.Lock()
	b.calls = append(b.calls, acquireCall{name: req.Name, sent: sent, returned: time.Now(), deadline: deadline, token: g.Token, err: err})
	b.mu.Unlock()
	return g, err
}

func (b *recordingBackend) acquires() []acquireCall {
	b.mu.Lock()
	defer b.mu.Unlock()
	return append([]acquireCall(nil), b.calls...)
}

// grants returns the calls in which the store granted the lease name.
// attempts returns the acquire calls for name, answered or not.
func (b *recordingBackend) attempts(name string) []acquireCall {
	var out []acquireCall
	for _, c := range b.acquires() {
		if c.name == name {
			out = append(out, c)
		}
	}
	return out
}

func (b *recordingBackend) grants(name string) []acquireCall {
	var out []acquireCall
	for _, c := range b.acquires() {
		if c.name == name && c.err == nil && c.token != 0 {
			out = append(out, c)
		}
	}
	return out
}

// TestDelayedGrantPastTTLTryAcquire: the reply to TryAcquire arrives after
// the TTL. Redis granted the lease, but by the time the caller hears of it
// the grant has expired and a second client holds the lease: TryAcquire
// must return ErrNotAcquired, and the second client must get the lease
// promptly after the TTL, keep it, and have the greater token.
func TestDelayedGrantPastTTLTryAcquire(t *testing.T) {
	const (
		ttl     = 500 * time.Millisecond
		latency = 1200 * time.Millisecond
	)
	d := newDelayedRedis(t)
	m1, rec1 := d.manager(d.slow, ttl)
	m2, rec2 := d.manager(d.direct, ttl)
	d.warmUp(m1)
	d.delay(latency)
	name := "delayed-grant-try"

	type outcome struct {
		l        *lease.Lease
		err      error
		returned time.Time
	}
	first := make(chan outcome, 1)
	start := time.Now()
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		l, err := m1.TryAcquire(ctx, name)
		first <- outcome{l, err, time.Now()}
	}()
	// The second client, with no delay, waits for the lease: it is
	// refused while the first grant lives and must get it right after.
	// It starts once Redis has made the first grant (its token counter
	// exists; only replies are delayed), however late the first
	// goroutine ran.
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	for tokenKey := rec2.Backend.KeysFor(name).Token; ; {
		n, err := d.direct.Exists(ctx, tokenKey).Result()
		if err != nil {
			t.Fatalf("EXISTS %s: %v", tokenKey, err)
		}
		if n == 1 {
			break
		}
		time.Sleep(time.Millisecond)
	}
	l2, err := m2.Acquire(ctx, name)
	if err != nil {
		t.Fatalf("second client: Acquire: %v", err)
	}
	got2 := time.Now()
	defer l2.Release(context.Background())

	o := <-first
	if o.l != nil {
		o.l.Release(context.Background())
	}
	t.Logf("TTL %v, replies delayed %v: first TryAcquire returned after %v with %v; second client acquired %v after the first request was sent",
		ttl, latency, o.returned.Sub(start).Round(time.Millisecond), o.err, got2.Sub(start).Round(time.Millisecond))
	if o.err == nil || !errors.Is(o.err, lease.ErrNotAcquired) {
		t.Fatalf("first TryAcquire: got lease %v, err %v; want an error matching lease.ErrNotAcquired", o.l != nil, o.err)
	}
	if o.l != nil {
		t.Fatal("first TryAcquire returned a lease along with its error")
	}
	if took := o.returned.Sub(start); took < latency {
		t.Fatalf("first TryAcquire returned after %v, before the %v delay: the toxic did not hold the reply back", took, latency)
	}
	grants := rec1.grants(name)
	if len(grants) != 1 {
		t.Fatalf("the store granted the first client %d times, want exactly 1 (the delayed grant): %+v", len(grants), rec1.acquires())
	}
	if l2.Token() <= grants[0].token {
		t.Errorf("second client's token %d is not greater than the delayed grant's %d", l2.Token(), grants[0].token)
	}
	// No earlier than the first grant's expiry, and as soon as the store
	// let it: the first grant expired at the store a TTL after its script
	// ran, which was before the toxic began to hold its reply back, and
	// every attempt the second client sent after that must have been
	// granted (a refusal then would mean that the first client's late
	// grant, or its giving back, kept the lease from it). How long the
	// waiter sleeps between attempts (the refusal's RetryAfter) is the
	// Manager's own timing, tested in virtual time (lease's fifo tests),
	// not here against the wall clock of a loaded machine.
	if got2.Before(grants[0].sent.Add(ttl - 2*time.Millisecond)) {
		t.Errorf("second client acquired %v after the first request was sent, before the first grant's TTL %v ran out", got2.Sub(grants[0].sent), ttl)
	}
	expired := grants[0].returned.Add(ttl - latency + 2*time.Millisecond) // Redis keeps expiry times in whole ms
	for _, a := range rec2.attempts(name) {
		if a.sent.After(expired) && a.token == 0 {
			t.Errorf("the second client's attempt sent %v after the first grant had expired at the store was refused: %v", a.sent.Sub(expired), a.err)
		}
	}
	// The first client's giving back of its late grant must not have
	// touched the second client's lease.
	if err := l2.Err(); err != nil {
		t.Fatalf("second client's lease ended: %v", err)
	}
	rctx, rcancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer rcancel()
	if err := l2.Renew(rctx); err != nil {
		t.Fatalf("second client's lease cannot be renewed after the first client gave its late grant back: %v", err)
	}
}

// TestDelayedGrantPastTTLAcquire: a blocking Acquire whose every reply
// arrives after the TTL must not return a lease whose deadline has passed.
// It abandons each attempt once the lease's validity has passed (the
// grant could not be used) and tries again with the same owner: under a
// lasting delay it ends with ErrNotAcquired and the context's error; when
// the delay is lifted it returns a lease that is valid when it returns, its
// deadline counted from the send time of the attempt that succeeded.
func TestDelayedGrantPastTTLAcquire(t *testing.T) {
	const (
		ttl     = 400 * time.Millisecond
		latency = 800 * time.Millisecond
	)
	t.Run("delay lasts", func(t *testing.T) {
		d := newDelayedRedis(t)
		m, rec := d.manager(d.slow, ttl)
		d.warmUp(m)
		d.delay(latency)
		ctx, cancel := context.WithTimeout(context.Background(), 4*time.Second)
		defer cancel()
		const name = "delayed-grant-lasting"
		l, err := m.Acquire(ctx, name)
		if l != nil {
			l.Release(context.Background())
			t.Fatalf("Acquire returned a lease (token %d, deadline in %v) although every grant arrived past its TTL", l.Token(), time.Until(l.Deadline()))
		}
		if !errors.Is(err, lease.ErrNotAcquired) || !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("Acquire: got %v; want an error matching lease.ErrNotAcquired and context.DeadlineExceeded", err)
		}
		// Every attempt was abandoned at the validity, before its late
		// reply, and the store did grant the lease (only replies are
		// delayed): the delayed path was exercised.
		calls := rec.attempts(name)
		if len(calls) == 0 {
			t.Fatal("no acquire attempt was made")
		}
		validity := m.Options().TTL - m.Options().SafetyMargin
		for _, c := range calls {
			if !c.abandonedBy(validity) {
				t.Errorf("an attempt ended after %v with token %d, %v, its context's deadline %v after it began; want every attempt abandoned, by a deadline at most the validity %v",
					c.returned.Sub(c.sent), c.token, c.err, c.deadline.Sub(c.sent), validity)
			}
		}
		tokenKey := rec.Backend.KeysFor(name).Token
		if n, err := d.direct.Exists(context.Background(), tokenKey).Result(); err != nil || n != 1 {
			t.Fatalf("EXISTS %s = %d, %v: the store never granted the lease, so the test did not exercise a late grant", tokenKey, n, err)
		}
		t.Logf("TTL %v, replies delayed %v: %d attempts abandoned at the validity (each grant the store made expired by itself); Acquire ended with: %v", ttl, latency, len(calls), err)
	})
	t.Run("delay lifted", func(t *testing.T) {
		d := newDelayedRedis(t)
		m, rec := d.manager(d.slow, ttl)
		d.warmUp(m)
		d.delay(latency)
		lifted := make(chan time.Time, 1)
		go func() {
			time.Sleep(2500 * time.Millisecond)
			// RemoveToxic is safe to call from another goroutine; no
			// t.Fatal off the test goroutine.
			err := d.proxy.Remove(d.delayName)
			if err != nil {
				t.Errorf("toxiproxy: remove latency toxic: %v", err)
			}
			lifted <- time.Now()
		}()
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		const name = "delayed-grant-lifted"
		l, err := m.Acquire(ctx, name)
		// Read at once: a grant sent just before the delay was lifted may
		// be kept with little validity left, and end soon after (or even
		// before this goroutine runs again, on a loaded machine: then it
		// must have ended at its deadline, not before).
		var (
			errAtReturn error
			readAt      time.Time
		)
		if err == nil {
			errAtReturn = l.Err()
			readAt = time.Now()
		}
		liftedAt := <-lifted
		if err != nil {
			t.Fatalf("Acquire after the delay was lifted: %v", err)
		}
		defer l.Release(context.Background())
		if errAtReturn != nil && readAt.Before(l.Deadline()) {
			t.Fatalf("Acquire returned a lease that ended before its deadline: %v", errAtReturn)
		}
		grants := rec.grants(name)
		abandoned := 0
		for _, c := range rec.attempts(name) {
			if c.abandonedBy(m.Options().TTL - m.Options().SafetyMargin) {
				abandoned++
			}
		}
		if abandoned == 0 {
			t.Fatalf("no attempt was abandoned before the one kept: the test did not exercise the delayed path (calls %+v)", rec.attempts(name))
		}
		var kept *acquireCall
		for i := range grants {
			if grants[i].token == l.Token() {
				kept = &grants[i]
			}
		}
		if kept == nil {
			t.Fatalf("the lease's token %d is not one the store granted: %+v", l.Token(), grants)
		}
		o := m.Options()
		if limit := kept.sent.Add(o.TTL - o.SafetyMargin); l.Deadline().After(limit) {
			t.Errorf("deadline is %v after send + TTL - margin of the granting request", l.Deadline().Sub(limit))
		}
		if took := kept.returned.Sub(kept.sent); took > ttl {
			t.Errorf("the lease kept is a grant whose reply took %v, more than the TTL %v", took, ttl)
		}
		// The Manager checks a grant's validity after the backend returned
		// it (kept.returned): the lease handed out had not passed its
		// deadline then.
		if !kept.returned.Before(l.Deadline()) {
			t.Errorf("Acquire returned a lease whose grant came back %v after its deadline", kept.returned.Sub(l.Deadline()))
		}
		t.Logf("TTL %v, replies delayed %v until %v: %d attempts abandoned at the validity; the lease (token %d) came %v after the delay was lifted, valid for %v more",
			ttl, latency, liftedAt.Format("15:04:05.000"), abandoned, l.Token(), kept.returned.Sub(liftedAt).Round(time.Millisecond), l.Deadline().Sub(kept.returned).Round(time.Millisecond))
	})
}

// TestDelayedGrantWithinTTL: the reply is held back, but less than the TTL.
// The grant is accepted, and its local deadline is counted from when the
// request was sent, not from when the reply arrived: deadline <= send +
// TTL - margin, which is at least the delay earlier than reply + TTL -
// margin. Renewals under the same delay keep the lease.
func TestDelayedGrantWithinTTL(t *testing.T) {
	// The first renewal goes out a renew interval (TTL/3) after the reply
	// arrived and must be answered, delay included, before send + TTL -
	// margin: 1.5s leaves it ~400ms of room on a loaded machine.
	const (
		ttl     = 1500 * time.Millisecond
		latency = 300 * time.Millisecond
	)
	d := newDelayedRedis(t)
	m, rec := d.manager(d.slow, ttl)
	d.warmUp(m)
	d.delay(latency)
	o := m.Options()

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	before := time.Now()
	const name = "delayed-grant-within"
	l, err := m.TryAcquire(ctx, name)
	after := time.Now()
	if err != nil {
		t.Fatalf("TryAcquire with replies delayed %v (TTL %v): %v", latency, ttl, err)
	}
	defer l.Release(context.Background())
	if took := after.Sub(before); took < latency {
		t.Fatalf("TryAcquire took %v, less than the %v delay: the toxic did not hold the reply back", took, latency)
	}
	grants := rec.grants(name)
	if len(grants) != 1 || grants[0].token != l.Token() {
		t.Fatalf("want one grant with the lease's token %d, got %+v", l.Token(), grants)
	}
	sent := grants[0].sent
	validity := o.TTL - o.SafetyMargin
	dl := l.Deadline()
	t.Logf("TTL %v, margin %v, reply delayed %v: TryAcquire took %v; deadline = send + %v (reply + %v)",
		ttl, o.SafetyMargin, latency, after.Sub(before).Round(time.Millisecond), dl.Sub(sent).Round(time.Millisecond), dl.Sub(after).Round(time.Millisecond))
	if dl.After(sent.Add(validity)) {
		t.Errorf("deadline is %v after send + TTL - margin", dl.Sub(sent.Add(validity)))
	}
	if dl.Before(before.Add(validity)) {
		t.Errorf("deadline is %v before the call's start + TTL - margin: too short", before.Add(validity).Sub(dl))
	}
	if limit := after.Add(validity - latency); dl.After(limit) {
		t.Errorf("deadline is %v after reply + TTL - margin - delay: it was counted from the reply, not the send", dl.Sub(limit))
	}
	// Renewals (their replies delayed too) keep the lease past its first
	// deadline.
	time.Sleep(time.Until(dl) + ttl/2)
	if err := l.Err(); err != nil {
		t.Fatalf("the lease ended although renewals under a %v delay fit in the TTL %v: %v", latency, ttl, err)
	}
	if !l.Deadline().After(dl) {
		t.Errorf("the deadline did not move after renewals: still %v", l.Deadline())
	}
}
