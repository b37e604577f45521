package etcdlease_test

import (
	"testing"
	"time"

	"github.com/fencekit/fencekit/internal/testkit"
	"github.com/fencekit/fencekit/lease/driver"
)

// The waiters of one name in one backend share a watch, and each deletion
// wakes one of them, the one that waited longest without a signal; a
// waiter that stops with a signal it did not take passes it on.
func TestOneWaiterWokenPerRelease(t *testing.T) {
	cl := cluster(t)
	p := prefix(t)
	b := newBackend(t, cl.Client(), p)
	holder := newBackend(t, cl.Client(), p)
	ctx := testkit.Context(t)
	type sub struct {
		ch   <-chan struct{}
		stop func()
	}
	var subs []sub
	for range 3 {
		ch, stop, err := b.Watch(ctx, "job")
		if err != nil {
			t.Fatalf("Watch: %v", err)
		}
		subs = append(subs, sub{ch, stop})
	}
	defer func() {
		for _, s := range subs {
			s.stop()
		}
	}()
	signalled := func() []int {
		var got []int
		for i, s := range subs {
			if len(s.ch) > 0 {
				got = append(got, i)
			}
		}
		return got
	}
	// cycle acquires and releases the lease, and returns the waiters
	// signalled by the deletion: it waits for the first signal (the event
	// comes over the watch stream, in the backend's goroutine, which a
	// loaded machine can run late), then for settle more, so that a second
	// waiter woken by the same deletion (a herd) is seen too.
	const settle = 300 * time.Millisecond
	cycle := func(owner string) []int {
		t.Helper()
		// Every signal of the rounds before was taken, or its waiter
		// left: one here is a late second signal of an earlier deletion.
		if got := signalled(); len(got) > 0 {
			t.Fatalf("before release %q: waiters %v signalled, by no deletion since the last was counted", owner, got)
		}
		g, err := holder.Acquire(ctx, driver.Request{Name: "job", Owner: owner, TTL: 5 * time.Second})
		if err != nil {
			t.Fatalf("Acquire: %v", err)
		}
		if err := holder.Release(ctx, g); err != nil {
			t.Fatalf("Release: %v", err)
		}
		// 30 s bounds a wait for a signal that, with the bug, never
		// comes; it is no measure of promptness.
		for deadline := time.Now().Add(30 * time.Second); len(signalled()) == 0; {
			if time.Now().After(deadline) {
				t.Fatalf("release %q woke no waiter within 30 s", owner)
			}
			time.Sleep(time.Millisecond)
		}
		time.Sleep(settle)
		return signalled()
	}
	woken := map[int]bool{}
	for round := range 3 {
		got := cycle("o" + string(rune('a'+round)))
		if len(got) != 1 {
			t.Fatalf("release %d woke waiters %v, want exactly one", round+1, got)
		}
		if woken[got[0]] {
			t.Fatalf("release %d woke waiter %d again while others had waited longer", round+1, got[0])
		}
		woken[got[0]] = true
		<-subs[got[0]].ch
	}
	// A waiter that leaves with a signal passes it on (at once: leaving
	// hands it over before it returns).
	got := cycle("od")
	if len(got) != 1 {
		t.Fatalf("woke %v, want one", got)
	}
	subs[got[0]].stop()
	var others []int
	for _, i := range signalled() {
		if i != got[0] {
			others = append(others, i)
		}
	}
	if len(others) != 1 {
		t.Fatalf("after waiter %d left with its signal, the others signalled: %v; want one", got[0], others)
	}
}
