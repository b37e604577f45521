package pglease_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/fencekit/fencekit/internal/testkit"
	"github.com/fencekit/fencekit/internal/testkit/faultnet"
	"github.com/fencekit/fencekit/internal/testkit/testenv"
	"github.com/fencekit/fencekit/lease"
	"github.com/fencekit/fencekit/lease/driver"
	"github.com/fencekit/fencekit/lease/pglease"
	"github.com/fencekit/fencekit/lease/pglease/internal/pgtest"
)

// proxiedPool opens a pool whose connections go through a fault proxy in
// front of the server at url, each tagged with application_name app.
func proxiedPool(t *testing.T, url string, app string, maxConns int32) (*pgxpool.Pool, *faultnet.Proxy) {
	t.Helper()
	px := faultnet.StartProxy(t, pgtest.TargetOf(url), nil)
	pool := newPool(t, pgtest.WithHost(url, px.Addr), func(c *pgxpool.Config) {
		c.MaxConns = maxConns
		c.ConnConfig.RuntimeParams["application_name"] = app
	})
	return pool, px
}

// appPIDs returns the server processes of the client connections tagged
// with application_name app.
func appPIDs(t *testing.T, url, app string) []uint32 {
	t.Helper()
	rows, err := connectT(t, url).Query(testkit.Context(t), `SELECT pid FROM pg_stat_activity WHERE application_name = $1`, app)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	var pids []uint32
	for rows.Next() {
		var pid int32
		if err := rows.Scan(&pid); err != nil {
			t.Fatal(err)
		}
		pids = append(pids, uint32(pid))
	}
	return pids
}

// A holder partitioned from the server (it hears nothing) whose session
// the server ends (pg_terminate_backend; an idle_session_timeout, a
// restart or a failover do the same): the next holder must not be granted
// the name while the first still counts its lease valid. Session mode used
// to grant it about 130 ms after the session ended, with the first holder
// valid for most of a TTL more, because the server frees an advisory lock
// with its session; the lock is now paired with an expiry row that a new
// holder waits out, as in table mode. Checked on one monotonic clock: when
// B's Acquire returned (after the grant), A's Err must already be set and
// A's local deadline must have passed.
func TestServerEndedSessionIsWaitedOut(t *testing.T) {
	url := testenv.PostgresURL()
	for _, mode := range modes {
		t.Run(mode.String(), func(t *testing.T) {
			t.Parallel()
			const ttl = 2 * time.Second
			schema := newSchema(t, url)
			app := testkit.UniqueName(t, "a_")
			poolA, px := proxiedPool(t, url, app, 4)
			a := testkit.NewManager(t, newBackend(t, poolA, pglease.WithSchema(schema), pglease.WithMode(mode)), ttl)
			b := testkit.NewManager(t, newBackend(t, newPool(t, url), pglease.WithSchema(schema), pglease.WithMode(mode)), ttl,
				lease.WithPollInterval(50*time.Millisecond))
			name := "partitioned"
			la, err := a.TryAcquire(testkit.Context(t), name)
			if err != nil {
				t.Fatal(err)
			}
			// A hears nothing from now on, and its sessions are ended on
			// the server: in session mode the one holding the lock.
			px.Blackhole()
			ended := time.Now()
			terminate(t, url, appPIDs(t, url, app))

			ctx, cancel := context.WithTimeout(testkit.Context(t), ttl+20*time.Second)
			defer cancel()
			lb, err := b.Acquire(ctx, name)
			granted := time.Now()
			aErr := la.Err() // read at once: A's view when B holds
			if err != nil {
				t.Fatalf("B's Acquire after A's session ended: %v", err)
			}
			defer lb.Release(testkit.Context(t))
			deadline := la.Deadline()
			t.Logf("B granted %v after A's session ended; A's local deadline was %v after it", granted.Sub(ended), deadline.Sub(ended))
			if aErr == nil {
				t.Fatalf("B was granted the lease while A's lease was still valid (A's Err nil), %v after A's session ended and %v before A's local deadline",
					granted.Sub(ended), deadline.Sub(granted))
			}
			if granted.Before(deadline) {
				t.Fatalf("B's Acquire returned %v before A's local deadline", deadline.Sub(granted))
			}
			if !errors.Is(aErr, lease.ErrLost) {
				t.Fatalf("A's Err = %v, want a loss", aErr)
			}
			if lb.Token() <= la.Token() {
				t.Fatalf("token %d after %d", lb.Token(), la.Token())
			}
		})
	}
}

// lossCounter counts the losses a Manager reports.
type lossCounter struct {
	lease.NopObserver
	n atomic.Int64
}

func (c *lossCounter) Lost(lease.LostEvent) { c.n.Add(1) }

// A Release whose reply is lost (the statement ran, its answer never
// came): pgx does not send it again, so the caller gets the store's error
// (an ambiguous outcome), never a loss; calling Release again is a release
// (nil), and the backend's own Release of the same grant returns nil, not
// lease.ErrNotHeld. The name is free for the next holder at once.
func TestReleaseWithLostReplyIsARelease(t *testing.T) {
	url := testenv.PostgresURL()
	for _, mode := range modes {
		t.Run(mode.String(), func(t *testing.T) {
			t.Parallel()
			schema := newSchema(t, url)
			pool, px := proxiedPool(t, url, testkit.UniqueName(t, "r_"), 4)
			ba := newBackend(t, pool, pglease.WithSchema(schema), pglease.WithMode(mode))
			losses := &lossCounter{}
			m := testkit.NewManager(t, ba, 10*time.Second, lease.WithReleaseTimeout(time.Second), lease.WithObserver(losses))
			other := newBackend(t, newPool(t, url), pglease.WithSchema(schema), pglease.WithMode(mode))

			l, err := m.TryAcquire(testkit.Context(t), "lost-reply")
			if err != nil {
				t.Fatal(err)
			}
			px.DropReplies()
			err = l.Release(testkit.Context(t))
			if err == nil {
				t.Fatal("Release with its reply dropped returned nil; want the store's error (outcome unknown)")
			}
			if errors.Is(err, lease.ErrLost) || errors.Is(err, lease.ErrNotHeld) {
				t.Fatalf("Release with its reply dropped = %v; a release that may have been applied is never a loss", err)
			}
			px.Restore()
			if err := l.Release(testkit.Context(t)); err != nil {
				t.Fatalf("Release again = %v, want nil", err)
			}
			if err := l.Err(); !errors.Is(err, lease.ErrReleased) {
				t.Fatalf("Err = %v, want ErrReleased", err)
			}
			if n := losses.n.Load(); n != 0 {
				t.Fatalf("the Manager reported %d losses for a clean release", n)
			}
			ln, err := testkit.NewManager(t, other, 10*time.Second).TryAcquire(testkit.Context(t), "lost-reply")
			if err != nil {
				t.Fatalf("next holder's TryAcquire after the release = %v", err)
			}
			_ = ln.Release(testkit.Context(t))
		})
	}
}

// The backend alone: a Release whose reply was lost, then the same
// Release again, returns nil (the owner was recorded as ended by the
// first), never lease.ErrNotHeld.
func TestBackendReleaseRetriedAfterLostReply(t *testing.T) {
	url := testenv.PostgresURL()
	for _, mode := range modes {
		t.Run(mode.String(), func(t *testing.T) {
			t.Parallel()
			schema := newSchema(t, url)
			pool, px := proxiedPool(t, url, testkit.UniqueName(t, "r_"), 4)
			b := newBackend(t, pool, pglease.WithSchema(schema), pglease.WithMode(mode))
			other := newBackend(t, newPool(t, url), pglease.WithSchema(schema), pglease.WithMode(mode))
			r := driver.Request{Name: "retried", Owner: "o", TTL: 10 * time.Second}
			g, err := b.Acquire(testkit.Context(t), r)
			if err != nil {
				t.Fatal(err)
			}
			px.DropReplies()
			ctx, cancel := context.WithTimeout(testkit.Context(t), time.Second)
			err = b.Release(ctx, g)
			cancel()
			if err == nil || errors.Is(err, lease.ErrNotHeld) {
				t.Fatalf("Release with its reply dropped = %v, want the store's error", err)
			}
			px.Restore()
			if err := b.Release(testkit.Context(t), g); err != nil {
				t.Fatalf("Release retried = %v, want nil", err)
			}
			if _, err := other.Acquire(testkit.Context(t), r); !errors.Is(err, lease.ErrNotAcquired) {
				t.Fatalf("Acquire by the released owner = %v, want ErrNotAcquired", err)
			}
			g2, err := other.Acquire(testkit.Context(t), driver.Request{Name: "retried", Owner: "next", TTL: 10 * time.Second})
			if err != nil {
				t.Fatalf("next holder: %v", err)
			}
			_ = other.Release(testkit.Context(t), g2)
		})
	}
}

// An acquire request that reaches the server after its sender gave up on
// it and abandoned its owner (and after another holder used and released
// the name) grants nothing: the name is free afterwards, not held by an
// owner nobody holds. The request is held in a proxy and delivered late.
func TestLateAcquireOfAbandonedOwnerIsRefused(t *testing.T) {
	url := testenv.PostgresURL()
	for _, mode := range modes {
		t.Run(mode.String(), func(t *testing.T) {
			t.Parallel()
			schema := newSchema(t, url)
			pool, px := proxiedPool(t, url, testkit.UniqueName(t, "l_"), 1)
			late := newBackend(t, pool, pglease.WithSchema(schema), pglease.WithMode(mode))
			b := newBackend(t, newPool(t, url), pglease.WithSchema(schema), pglease.WithMode(mode))
			const ttl = 10 * time.Second
			// Warm the proxied connection, so that the held request is the
			// statement itself, not pgx's first prepare.
			w, err := late.Acquire(testkit.Context(t), driver.Request{Name: "warm", Owner: "w", TTL: ttl})
			if err != nil {
				t.Fatal(err)
			}
			if err := late.Release(testkit.Context(t), w); err != nil {
				t.Fatal(err)
			}

			r := driver.Request{Name: "late", Owner: "ghost", TTL: ttl}
			px.HoldRequests()
			ctx, cancel := context.WithTimeout(testkit.Context(t), 300*time.Millisecond)
			_, err = late.Acquire(ctx, r)
			cancel()
			if err == nil {
				t.Fatal("Acquire through a proxy that holds requests succeeded")
			}
			if err := b.Abandon(testkit.Context(t), r); err != nil {
				t.Fatalf("Abandon: %v", err)
			}
			g, err := b.Acquire(testkit.Context(t), driver.Request{Name: "late", Owner: "next", TTL: ttl})
			if err != nil {
				t.Fatal(err)
			}
			if err := b.Release(testkit.Context(t), g); err != nil {
				t.Fatal(err)
			}
			px.Restore() // the request arrives now
			if !px.WaitServerSidesClosed(20 * time.Second) {
				t.Fatal("the server did not finish the late request within 20 s")
			}
			if h, err := b.Holder(testkit.Context(t), "late"); !errors.Is(err, lease.ErrNotHeld) {
				t.Fatalf("after the late request of an abandoned owner: Holder = %+v, %v; want nobody", h, err)
			}
			g, err = b.Acquire(testkit.Context(t), driver.Request{Name: "late", Owner: "third", TTL: ttl})
			if err != nil {
				t.Fatalf("the next contender is refused after the late request: %v", err)
			}
			if err := b.Release(testkit.Context(t), g); err != nil {
				t.Fatal(err)
			}
		})
	}
}
