package consensus

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/fencekit/fencekit/internal/rig/guarded"
	"github.com/fencekit/fencekit/internal/testkit"
	"github.com/fencekit/fencekit/internal/testkit/faultnet"
	"github.com/fencekit/fencekit/lease"
)

// The holder is cut off from the cluster, in two ways: its member is
// killed, or its connection is blackholed by a proxy (nothing gets through,
// nothing is closed, the member lives on). Either way the holder cannot
// renew, its lease's context is done from the last confirmed send + TTL on,
// another client (on the other members) acquires after the grant expired,
// with a greater token, and the old holder's writes, made as a stale holder
// would (after its loss, ignoring it), are rejected at PostgreSQL and S3.
func TestHolderMemberIsolated(t *testing.T) {
	for _, mode := range []string{"killed", "blackholed"} {
		for _, ttl := range []time.Duration{time.Second, 3 * time.Second} {
			t.Run(fmt.Sprintf("%s/ttl=%v", mode, ttl), func(t *testing.T) {
				testHolderMemberIsolated(t, ttl, mode == "blackholed")
			})
		}
	}
}

func testHolderMemberIsolated(t *testing.T, ttl time.Duration, blackhole bool) {
	ctx := testkit.Context(t)
	res, drop, err := guarded.Create(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { drop(context.Background()) })
	cl := etcdCluster(t)
	p := etcdPrefix(t)
	lead := cl.Leader()
	x := (lead + 1) % len(cl.Members) // the holder's member: a follower
	var rest []int
	for i := range cl.Members {
		if i != x {
			rest = append(rest, i)
		}
	}
	log := testkit.NewRenewLog()
	holderEndpoint := cl.Endpoints(x)[0]
	var proxy *faultnet.Proxy
	if blackhole {
		proxy = faultnet.StartProxy(t, strings.TrimPrefix(holderEndpoint, "http://"), nil)
		holderEndpoint = "http://" + proxy.Addr
	}
	holderM := testkit.NewManager(t, newEtcdBackend(t, cl.Client(holderEndpoint), p), ttl, lease.WithObserver(log))
	// The other client's own TTL is not under test (when it may acquire
	// depends on the holder's grant alone): a long one keeps its lease
	// through the writes below on a loaded machine, where a 1 s lease's
	// renewals can come too late and fail its final Release.
	otherM := testkit.NewManager(t, newEtcdBackend(t, cl.Client(cl.Endpoints(rest...)...), p), 10*time.Second)

	// Acquire, not TryAcquire: on a starved machine a grant of a 1 s TTL
	// can come back after its validity, and the Manager gives it back;
	// Acquire then asks again, TryAcquire would fail the test.
	la, err := holderM.Acquire(ctx, "job")
	if err != nil {
		t.Fatalf("Acquire: %v", err)
	}
	log.Confirmed(la.Token(), testkit.GrantSent(holderM, la))
	for _, w := range guarded.Write(ctx, res, "A", la.Token()) {
		if !w.Accepted {
			t.Fatalf("the holder's write to %s while it holds the lease: %s", w.Store, w.Err)
		}
	}
	time.Sleep(ttl / 2) // at least one renewal

	isolated := time.Now()
	if blackhole {
		// Nothing passes either way, and no connection is closed.
		proxy.Blackhole()
		// Lifted before the clients close (cleanups run last-in first).
		t.Cleanup(proxy.Restore)
	} else {
		cl.Members[x].Kill()
	}
	// At any moment from the last confirmed send + TTL on, the holder's
	// context must be done. (Its Err reads the clock itself, so a check
	// that runs late still tests the moment it runs.)
	ctxErrAtExpiry := make(chan error, 1)
	var armed sync.Once
	select {
	case <-la.Done():
	case <-time.After(ttl + 10*time.Second):
		t.Fatal("the isolated holder's lease was not lost")
	}
	lostAt := time.Now()
	lastSent := log.Last(la.Token())
	expiry := lastSent.Add(la.TTL())
	armed.Do(func() {
		time.AfterFunc(time.Until(expiry), func() { ctxErrAtExpiry <- la.Context().Err() })
	})
	if dl := la.Deadline(); dl.After(expiry.Add(-holderM.Options().SafetyMargin)) {
		t.Errorf("the holder's local deadline was %v after its last confirmed send + TTL - safety margin", dl.Sub(expiry.Add(-holderM.Options().SafetyMargin)))
	}
	if err := <-ctxErrAtExpiry; err == nil {
		t.Error("the holder's context was not done at its last confirmed send + TTL")
	}
	lb, err := otherM.Acquire(ctx, "job")
	if err != nil {
		t.Fatalf("the other client's Acquire: %v", err)
	}
	acquiredAt := time.Now()
	if acquiredAt.Before(expiry) {
		t.Errorf("the other client acquired %v before the holder's grant could have expired", expiry.Sub(acquiredAt))
	}
	if lb.Token() <= la.Token() {
		t.Fatalf("new token %d <= the isolated holder's %d", lb.Token(), la.Token())
	}
	how := "member killed"
	if blackhole {
		how = "connection blackholed"
	}
	t.Logf("%s, TTL %v: isolated %v after the last confirmed send; the test saw the holder's context done %v before send + TTL; the other client acquired %v after that (%v after send + TTL)",
		how, ttl, isolated.Sub(lastSent).Round(time.Millisecond), expiry.Sub(lostAt).Round(time.Millisecond),
		acquiredAt.Sub(lostAt).Round(time.Millisecond), acquiredAt.Sub(expiry).Round(time.Millisecond))

	for _, w := range guarded.Write(ctx, res, "B", lb.Token()) {
		if !w.Accepted {
			t.Fatalf("the new holder's write to %s: %s", w.Store, w.Err)
		}
	}
	// The old holder writes as if it still held the lease.
	for _, w := range guarded.Write(ctx, res, "A", la.Token()) {
		if w.Accepted || !w.Stale {
			t.Errorf("the isolated holder's stale write to %s: accepted=%v stale=%v (%s); want rejected as stale", w.Store, w.Accepted, w.Stale, w.Err)
		}
	}
	rowBy, rowTok, objBy, objTok, err := guarded.Stored(ctx, res)
	if err != nil {
		t.Fatal(err)
	}
	if rowBy != "B" || rowTok != lb.Token() || objBy != "B" || objTok != lb.Token() {
		t.Fatalf("stored: row by %q (token %d), object by %q (token %d); want B's with token %d", rowBy, rowTok, objBy, objTok, lb.Token())
	}
	if err := la.Release(ctx); !errors.Is(err, lease.ErrLost) {
		t.Fatalf("Release of the lost lease = %v, want ErrLost", err)
	}
	if err := lb.Release(ctx); err != nil {
		t.Fatalf("Release: %v", err)
	}
}
