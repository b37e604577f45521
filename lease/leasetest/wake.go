package leasetest

import (
	"testing"
	"time"

	"github.com/fencekit/fencekit/lease"
	"github.com/fencekit/fencekit/lease/driver"
)

// The checks of waking waiters: a watch signals a release, and a
// Manager's blocked Acquire wakes at once.

func testWatchSignalsRelease(t *testing.T, s *suite) {
	b := s.backend()
	w, ok := b.(driver.Watcher)
	s.need(t, Watch, ok)
	n := name(t)
	g := mustAcquire(t, b, req(n, "a", s.long))
	sig, stop, err := w.Watch(ctxT(t), n)
	if err != nil {
		t.Fatalf("Watch: %v", err)
	}
	defer stop()
	release(t, s.connect(), g)
	select {
	case <-sig:
	case <-time.After(5 * time.Second):
		t.Fatal("no signal within 5s of a release")
	}
}

func testWakesWaiter(t *testing.T, s *suite) {
	b := s.backend()
	_, ok := b.(driver.Watcher)
	s.need(t, Watch, ok)
	n := name(t)
	// Expiry and polling would take seconds: only a release signal can
	// wake the waiter quickly.
	poll := lease.WithPollInterval(10 * time.Second)
	holder, err := newManager(t, b, s.long, poll).TryAcquire(ctxT(t), n)
	if err != nil {
		t.Fatalf("TryAcquire: %v", err)
	}
	waiter := newManager(t, s.connect(), s.long, poll)
	type result struct {
		l   *lease.Lease
		at  time.Time
		err error
	}
	got := make(chan result, 1)
	go func() {
		l, err := waiter.Acquire(ctxT(t), n)
		got <- result{l, time.Now(), err}
	}()
	time.Sleep(300 * time.Millisecond) // let the waiter block and subscribe
	releasedAt := time.Now()
	if err := holder.Release(ctxT(t)); err != nil {
		t.Fatalf("Release: %v", err)
	}
	r := <-got
	if r.err != nil {
		t.Fatalf("waiter's Acquire: %v", r.err)
	}
	defer r.l.Release(ctxT(t))
	wake := r.at.Sub(releasedAt)
	t.Logf("waiter acquired %v after the release", wake)
	if wake > 2*time.Second {
		t.Fatalf("waiter acquired %v after the release; it should be woken at once (poll interval 10s)", wake)
	}
}
