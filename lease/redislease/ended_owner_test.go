package redislease_test

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"net"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/fencekit/fencekit/internal/testkit"
	"github.com/fencekit/fencekit/internal/testkit/faultnet"
	"github.com/fencekit/fencekit/internal/testkit/testenv"
	"github.com/fencekit/fencekit/lease"
	"github.com/fencekit/fencekit/lease/driver"
	"github.com/fencekit/fencekit/lease/leasetest"
	"github.com/fencekit/fencekit/lease/redislease"
	"github.com/fencekit/fencekit/lease/redislease/redistest"
)

// The tests of this file: how a lease ends at Redis. Release and Abandon
// leave a tombstone per owner, so that a release the client resends after
// its reply was lost is a release, and an acquire request that reaches
// Redis after its owner ended is refused.

// scriptFault returns a Wire for a go-redis client (Options.Dialer) that,
// once armed, faults the first script call whose request carries match, as
// a fault proxy between the client and Redis would: the request reaches
// Redis and is applied, its reply is lost with the connection (the client
// sees an error and, with its default MaxRetries, resends the script on a
// new connection); or, with hold, the request is not sent and the client
// hears nothing until its context ends, and deliver sends it to Redis
// later: the same request, arriving late.
func scriptFault(match []byte, hold bool) *faultnet.Wire {
	return &faultnet.Wire{
		Request: func(b []byte) bool {
			return bytes.Contains(bytes.ToLower(b), []byte("eval")) && bytes.Contains(b, match)
		},
		Hold: hold,
	}
}

// deliver sends the request w held to Redis at addr on a new connection
// and returns the reply's first line ("-ERR ...", ":<n>").
func deliver(t *testing.T, w *faultnet.Wire, addr string) string {
	t.Helper()
	req := w.Held()
	if req == nil {
		t.Fatal("no request was held")
	}
	c, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		t.Fatalf("dial %s: %v", addr, err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := c.Write(req); err != nil {
		t.Fatalf("deliver the held request: %v", err)
	}
	line, err := bufio.NewReader(c).ReadString('\n')
	if err != nil {
		t.Fatalf("reply to the held request: %v", err)
	}
	return line[:len(line)-2]
}

// faultClient returns a client of the shared Redis, as docs/redis.md makes it
// (ContextTimeoutEnabled, go-redis's default retries), whose connections
// go through w.
func faultClient(t *testing.T, w *faultnet.Wire) *redis.Client {
	t.Helper()
	opt, err := redis.ParseURL(testenv.RedisURL())
	if err != nil {
		t.Fatal(err)
	}
	opt.ContextTimeoutEnabled = true
	opt.Dialer = w.Dial
	c := redis.NewClient(opt)
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// A clean release whose reply is lost, and which go-redis resends on a new
// connection (default MaxRetries), is a release, through Release and
// through Run (leasetest.CheckReleaseReplyLost). (Before the tombstones,
// the resent script found the key its first send had deleted and answered
// "not held": a *LostError "taken over", and a loss counted.)
func TestReleaseReplyLostIsARelease(t *testing.T) {
	prefix := redistest.Prefix(t)
	name := "release-reply-lost"
	// Only release.lua and abandon.lua carry the channel.
	other := newBackend(t, redistest.Shared(t), prefix)
	f := scriptFault([]byte(other.KeysFor(name).Channel), false)
	b := newBackend(t, faultClient(t, f), prefix)
	t.Run("ReleaseAndRun", func(t *testing.T) {
		leasetest.CheckReleaseReplyLost(t, leasetest.ReplyLoss{
			Backend: b, Other: other, Fault: f, Name: name, TTL: 5 * time.Second,
		})
	})

	// A lost lease whose release reply is lost stays lost: the resent
	// release answers what the first one found.
	t.Run("LostStaysLost", func(t *testing.T) {
		m := newManager(t, b, lease.Options{TTL: 5 * time.Second})
		l, err := m.TryAcquire(testkit.Context(t), name)
		if err != nil {
			t.Fatal(err)
		}
		if err := redistest.Shared(t).Del(testkit.Context(t), b.KeysFor(name).Lease).Err(); err != nil {
			t.Fatal(err)
		}
		f.Arm()
		err = l.Release(testkit.Context(t))
		if f.Armed() {
			t.Fatal("the release request was not faulted")
		}
		if !errors.Is(err, lease.ErrLost) {
			t.Fatalf("Release of a lease whose key was deleted, reply lost = %v, want ErrLost", err)
		}
	})
}

// At the backend: once Release or Abandon ended an owner,
// its acquire request is refused when it reaches Redis, for
// driver.EndedOwnerTTL, and the tombstone that refuses it lives that long
// and shares the lease's hash slot.
func TestEndedOwnerRefusedByAcquire(t *testing.T) {
	c := redistest.Shared(t)
	b := newBackend(t, c, redistest.Prefix(t))
	name := "ended-owner"
	ttl := 2 * time.Second
	req := func(owner string) driver.Request { return driver.Request{Name: name, Owner: owner, TTL: ttl} }
	refused := func(t *testing.T, owner string) {
		t.Helper()
		g, err := b.Acquire(testkit.Context(t), req(owner))
		if !errors.Is(err, lease.ErrNotAcquired) {
			t.Fatalf("Acquire by the ended owner %q = %+v, %v; want ErrNotAcquired", owner, g, err)
		}
		if _, err := b.Holder(testkit.Context(t), name); !errors.Is(err, lease.ErrNotHeld) {
			t.Fatalf("a refused acquire must leave the name free; Holder = %v", err)
		}
	}
	tombstone := func(t *testing.T, owner string) time.Duration {
		t.Helper()
		k := b.EndedKeyForTest(name, owner)
		if redislease.SlotOf(k) != redislease.SlotOf(b.KeysFor(name).Lease) {
			t.Fatalf("tombstone %q is not in the lease's hash slot", k)
		}
		d, err := c.PTTL(testkit.Context(t), k).Result()
		if err != nil {
			t.Fatal(err)
		}
		return d
	}
	want := driver.EndedOwnerTTL(ttl)

	t.Run("AfterRelease", func(t *testing.T) {
		g, err := b.Acquire(testkit.Context(t), req("released"))
		if err != nil {
			t.Fatal(err)
		}
		if err := b.Release(testkit.Context(t), g); err != nil {
			t.Fatal(err)
		}
		if d := tombstone(t, "released"); d <= want-time.Second || d > want {
			t.Fatalf("tombstone PTTL %v, want about driver.EndedOwnerTTL = %v", d, want)
		}
		refused(t, "released")
		if err := b.Release(testkit.Context(t), g); err != nil {
			t.Fatalf("the same Release again (a resent request) = %v, want nil", err)
		}
	})
	t.Run("AbandonBeforeTheRequest", func(t *testing.T) {
		if err := b.Abandon(testkit.Context(t), req("late")); err != nil {
			t.Fatal(err)
		}
		if d := tombstone(t, "late"); d <= want-time.Second || d > want {
			t.Fatalf("tombstone PTTL %v, want about %v", d, want)
		}
		refused(t, "late")
	})
	// An Abandon that ends a grant wakes the waiters as a release does,
	// with either kind of notice.
	for _, classic := range []bool{false, true} {
		t.Run(fmt.Sprintf("AbandonAfterTheGrant/classic=%v", classic), func(t *testing.T) {
			wb := b
			if classic {
				var err error
				if wb, err = redislease.New(c, redislease.WithPrefix(b.PrefixForTest()), redislease.WithClassicPubSub()); err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { _ = wb.Close() })
			}
			owner := fmt.Sprintf("ghost-%v", classic)
			g, err := wb.Acquire(testkit.Context(t), req(owner))
			if err != nil {
				t.Fatal(err)
			}
			sig, stop, err := wb.Watch(testkit.Context(t), name)
			if err != nil {
				t.Fatal(err)
			}
			defer stop()
			if err := wb.Abandon(testkit.Context(t), req(owner)); err != nil {
				t.Fatal(err)
			}
			select {
			case <-sig:
			case <-time.After(5 * time.Second):
				t.Fatal("an Abandon that ended a grant did not wake the waiters")
			}
			refused(t, owner)
			if err := wb.Renew(testkit.Context(t), g); !errors.Is(err, lease.ErrNotHeld) {
				t.Fatalf("Renew of the abandoned grant = %v, want ErrNotHeld", err)
			}
			if k := wb.PubSubKind(); classic != (k == "classic") {
				t.Fatalf("pub/sub kind %q, classic %v", k, classic)
			}
		})
	}
	t.Run("NeverEndedIsLost", func(t *testing.T) {
		g := driver.Grant{Name: name, Owner: "never-held", Token: 1, TTL: ttl}
		for i := range 2 {
			if err := b.Release(testkit.Context(t), g); !errors.Is(err, lease.ErrNotHeld) {
				t.Fatalf("Release %d of a grant never made = %v, want ErrNotHeld", i+1, err)
			}
		}
	})
}

// Through a Manager: a blocking Acquire's first request is
// held on its way to Redis until the attempt is abandoned (past the
// lease's validity); the retry, as a new owner, is granted, used and
// released; only then does the first request reach Redis. It must be
// refused, and the name must be free at once for the next contender. (Before
// the tombstones, Redis granted it: a ghost grant with a higher token,
// naming an owner nobody holds, that kept the next contender out for a
// TTL.)
func TestAbandonedAcquireArrivingLateGrantsNothing(t *testing.T) {
	prefix := redistest.Prefix(t)
	name := "abandoned-acquire"
	// Only acquire.lua carries the counter key.
	keys := newBackend(t, redistest.Shared(t), prefix).KeysFor(name)
	f := scriptFault([]byte(keys.Token), true)
	c := faultClient(t, f)
	b := newBackend(t, c, prefix)
	f.Arm()
	ttl := 600 * time.Millisecond
	m := newManager(t, b, lease.Options{TTL: ttl, PollInterval: 50 * time.Millisecond})

	l, err := m.Acquire(testkit.Context(t), name)
	if err != nil {
		t.Fatal(err)
	}
	if f.Cuts() != 1 {
		t.Fatal("the first acquire request was not held: the test proves nothing")
	}
	tok := l.Token()
	if err := l.Release(testkit.Context(t)); err != nil {
		t.Fatalf("Release: %v", err)
	}

	reply := deliver(t, f, c.Options().Addr)
	if reply != ":0" {
		t.Fatalf("the abandoned request, arriving after the release, was answered %q; want :0 (refused)", reply)
	}
	if h, err := b.Holder(testkit.Context(t), name); !errors.Is(err, lease.ErrNotHeld) {
		t.Fatalf("after the late request the name is held by %+v (%v); want free (no ghost grant)", h, err)
	}
	next, err := m.TryAcquire(testkit.Context(t), name)
	if err != nil {
		t.Fatalf("the next contender must get the name at once: %v", err)
	}
	if next.Token() <= tok {
		t.Fatalf("next token %d <= %d", next.Token(), tok)
	}
	if err := next.Release(testkit.Context(t)); err != nil {
		t.Fatal(err)
	}
}
