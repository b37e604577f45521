package leasetest

import (
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/fencekit/fencekit/lease"
	"github.com/fencekit/fencekit/lease/driver"
)

// The checks of the operator's capabilities: driver.Lister and
// driver.Revoker.

const (
	// List: the backend implements driver.Lister (the leases of its
	// namespace, with holders and waiters).
	List Capability = "list"
	// Revoke: the backend implements driver.Revoker (end a grant from
	// another process).
	Revoke Capability = "revoke"
)

// testList: List returns exactly the held names under a prefix (and the
// names with waiters in line), in byte order, each with its holder; Status
// reads one name, held or not.
func testList(t *testing.T, s *suite) {
	b := s.backend()
	ls, ok := b.(driver.Lister)
	s.need(t, List, ok)
	n := name(t)
	p := n + "/"
	other := s.connect()
	// Held under the prefix: "a", and a name with the characters that key
	// schemes escape; released under it: "c" (the store keeps its token);
	// held outside it: n itself and n + "-x".
	ga := mustAcquire(t, b, req(p+"a", "owner-a", s.long))
	gb := mustAcquire(t, other, req(p+"b{x}%/ü", "owner-b", s.long))
	gc := mustAcquire(t, b, req(p+"c", "owner-c", s.long))
	release(t, b, gc)
	gn := mustAcquire(t, b, req(n, "owner-n", s.long))
	gx := mustAcquire(t, b, req(n+"-x", "owner-x", s.long))

	got, err := s.connect().(driver.Lister).List(ctxT(t), p)
	if err != nil {
		t.Fatalf("List(%q): %v", p, err)
	}
	want := []driver.Grant{ga, gb}
	if len(got) != len(want) {
		t.Fatalf("List(%q) = %+v, want the grants of %q and %q only", p, got, ga.Name, gb.Name)
	}
	for i, g := range want {
		st := got[i]
		if st.Name != g.Name || st.Holder.Name != g.Name || st.Holder.Owner != g.Owner || st.Holder.Token != g.Token || !st.Held() {
			t.Fatalf("List(%q)[%d] = %+v, want %q held by %q with token %d", p, i, st, g.Name, g.Owner, g.Token)
		}
		if st.Holder.Remaining < 0 || st.Holder.Remaining > g.TTL {
			t.Fatalf("List(%q)[%d].Holder.Remaining = %v, want within [0, %v]", p, i, st.Holder.Remaining, g.TTL)
		}
		if st.Waiters != 0 {
			t.Fatalf("List(%q)[%d].Waiters = %d, nobody waits", p, i, st.Waiters)
		}
	}
	if all, err := ls.List(ctxT(t), ""); err != nil {
		t.Fatalf("List(\"\"): %v", err)
	} else if !slices.IsSortedFunc(all, func(a, b driver.Status) int { return cmpString(a.Name, b.Name) }) {
		t.Fatalf("List(\"\") is not in name order")
	}

	st, err := ls.Status(ctxT(t), gb.Name)
	if err != nil || st.Name != gb.Name || st.Holder.Owner != gb.Owner || st.Holder.Token != gb.Token {
		t.Fatalf("Status(%q) = %+v, %v; want held by %q with token %d", gb.Name, st, err, gb.Owner, gb.Token)
	}
	if st, err := ls.Status(ctxT(t), gc.Name); err != nil || st.Held() || st.Waiters != 0 || st.Name != gc.Name {
		t.Fatalf("Status of a released name = %+v, %v; want free, no waiters, no error", st, err)
	}
	if _, err := ls.Status(ctxT(t), ""); !errors.Is(err, lease.ErrInvalidName) {
		t.Fatalf("Status(\"\") = %v, want ErrInvalidName", err)
	}

	if s.limits.Queues {
		// A waiter in line is counted, and leaves the count when it gives up.
		w := driver.Request{Name: ga.Name, Owner: "waiter", TTL: s.long, Queue: true}
		if g, err := other.Acquire(ctxT(t), w); !errors.Is(err, lease.ErrNotAcquired) {
			t.Fatalf("queued Acquire of a held name = %+v, %v; want ErrNotAcquired", g, err)
		}
		if st, err := ls.Status(ctxT(t), ga.Name); err != nil || st.Waiters != 1 || st.Holder.Owner != ga.Owner {
			t.Fatalf("Status with one waiter in line = %+v, %v; want held by %q, 1 waiter", st, err, ga.Owner)
		}
		if got, err := ls.List(ctxT(t), p); err != nil || len(got) != 2 || got[0].Waiters != 1 {
			t.Fatalf("List with one waiter in line = %+v, %v; want %q first with 1 waiter", got, err, ga.Name)
		}
		if err := other.Abandon(ctxT(t), w); err != nil {
			t.Fatalf("Abandon of the waiter: %v", err)
		}
		if st, err := ls.Status(ctxT(t), ga.Name); err != nil || st.Waiters != 0 {
			t.Fatalf("Status after the waiter gave up = %+v, %v; want 0 waiters", st, err)
		}
	}

	release(t, b, ga)
	release(t, other, gb)
	release(t, b, gn)
	release(t, b, gx)
	if got, err := ls.List(ctxT(t), p); err != nil || len(got) != 0 {
		t.Fatalf("List(%q) after every release = %+v, %v; want nothing", p, got, err)
	}
}

func cmpString(a, b string) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

// testRevoke: Revoke ends exactly the grant it names, from another
// connection; the revoked owner's renewals and acquires are refused, and
// the next grant's token is greater.
func testRevoke(t *testing.T, s *suite) {
	b := s.backend()
	_, ok := b.(driver.Revoker)
	s.need(t, Revoke, ok)
	op := s.connect().(driver.Revoker)
	n := name(t)

	if err := op.Revoke(ctxT(t), driver.Holder{Name: n, Owner: "a", Token: 1}); !errors.Is(err, lease.ErrNotHeld) {
		t.Fatalf("Revoke of a free name = %v, want ErrNotHeld", err)
	}
	for _, h := range []driver.Holder{{Name: "", Owner: "a", Token: 1}, {Name: n, Owner: "", Token: 1}, {Name: n, Owner: "a"}} {
		if err := op.Revoke(ctxT(t), h); err == nil || errors.Is(err, lease.ErrNotHeld) {
			t.Fatalf("Revoke(%+v) = %v, want an input error", h, err)
		}
	}

	g := mustAcquire(t, b, req(n, "a", s.long))
	for _, h := range []driver.Holder{{Name: n, Owner: "a", Token: g.Token + 1}, {Name: n, Owner: "b", Token: g.Token}} {
		if err := op.Revoke(ctxT(t), h); !errors.Is(err, lease.ErrNotHeld) {
			t.Fatalf("Revoke(%+v) of the grant of %q with token %d = %v, want ErrNotHeld", h, g.Owner, g.Token, err)
		}
	}
	if err := b.Renew(ctxT(t), g); err != nil {
		t.Fatalf("a Revoke that named another grant ended this one: Renew = %v", err)
	}

	h := driver.Holder{Name: n, Owner: g.Owner, Token: g.Token, Remaining: g.TTL}
	if err := op.Revoke(ctxT(t), h); err != nil {
		t.Fatalf("Revoke(%+v): %v", h, err)
	}
	if err := b.Renew(ctxT(t), g); !errors.Is(err, lease.ErrNotHeld) {
		t.Fatalf("Renew of a revoked grant = %v, want ErrNotHeld", err)
	}
	if err := op.Revoke(ctxT(t), h); !errors.Is(err, lease.ErrNotHeld) {
		t.Fatalf("Revoke of a grant already revoked = %v, want ErrNotHeld", err)
	}
	if in, ok := b.(driver.Inspector); ok {
		if cur, err := in.Holder(ctxT(t), n); !errors.Is(err, lease.ErrNotHeld) {
			t.Fatalf("Holder after Revoke = %+v, %v; want ErrNotHeld", cur, err)
		}
	}
	if g2, err := s.connect().Acquire(ctxT(t), req(n, "a", s.long)); !errors.Is(err, lease.ErrNotAcquired) {
		t.Fatalf("Acquire by the revoked owner = %+v, %v; want ErrNotAcquired", g2, err)
	}
	if err := b.Release(ctxT(t), g); err != nil && !errors.Is(err, lease.ErrNotHeld) {
		t.Fatalf("Release of a revoked grant = %v, want ErrNotHeld (or nil)", err)
	}
	nb := s.connect()
	next := mustAcquireEventually(t, nb, req(n, "b", s.long))
	if next.Token <= g.Token {
		t.Fatalf("token after a revoked grant %d <= its token %d", next.Token, g.Token)
	}
	release(t, nb, next)
}

// testRevokedLeaseEnds: a Manager's lease revoked from another process
// ends at its next renewal at the latest (its context is cancelled, its
// error is a loss), and a blocked waiter is granted the name with a
// greater token long before the revoked grant's TTL would have run out.
func testRevokedLeaseEnds(t *testing.T, s *suite) {
	b := s.backend()
	_, ok := b.(driver.Revoker)
	s.need(t, Revoke, ok)
	op := s.connect().(driver.Revoker)
	n := name(t)
	every := max(s.short/4, 50*time.Millisecond)
	l, err := newManager(t, b, s.long, lease.WithRenewInterval(every)).TryAcquire(ctxT(t), n)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Release(ctxT(t))
	waiter := newManager(t, s.connect(), s.long, lease.WithPollInterval(every))
	type result struct {
		l   *lease.Lease
		err error
	}
	got := make(chan result, 1)
	go func() {
		w, err := waiter.Acquire(ctxT(t), n)
		got <- result{w, err}
	}()

	h := driver.Holder{Name: n, Owner: l.Owner(), Token: l.Token(), Remaining: l.TTL()}
	if err := op.Revoke(ctxT(t), h); err != nil {
		t.Fatalf("Revoke: %v", err)
	}
	select {
	case <-l.Done():
	case <-time.After(s.long / 2):
		t.Fatalf("a revoked lease renewed every %v was still valid %v later", every, s.long/2)
	}
	if !errors.Is(l.Err(), lease.ErrLost) {
		t.Fatalf("a revoked lease ended with %v, want ErrLost", l.Err())
	}
	var r result
	select {
	case r = <-got:
	case <-time.After(s.long / 2):
		t.Fatalf("the waiter was not granted the revoked name within %v (its TTL is %v)", s.long/2, s.long)
	}
	if r.err != nil {
		t.Fatalf("the waiter's Acquire: %v", r.err)
	}
	if r.l.Token() <= h.Token {
		t.Fatalf("the waiter's token %d <= the revoked token %d", r.l.Token(), h.Token)
	}
	if err := r.l.Release(ctxT(t)); err != nil {
		t.Fatal(err)
	}
}
