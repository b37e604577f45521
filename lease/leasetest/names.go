package leasetest

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/fencekit/fencekit/lease"
	"github.com/fencekit/fencekit/lease/driver"
)

// The checks of lease names: the Manager refuses the names no store may
// see, so that a backend never checks them again, and a store keeps every
// name the Manager lets through (driver.MaxNameLen bytes of any valid
// UTF-8 without control characters) apart from every other.

// callCounter counts the requests that reach the backend it wraps. It
// hides the backend's optional capabilities: the checks that use it need
// none, since an invalid name must be refused before the Manager looks
// for one.
type callCounter struct {
	lease.Backend
	calls atomic.Int64
}

func (c *callCounter) Acquire(ctx context.Context, r driver.Request) (driver.Grant, error) {
	c.calls.Add(1)
	return c.Backend.Acquire(ctx, r)
}

func (c *callCounter) Renew(ctx context.Context, g driver.Grant) error {
	c.calls.Add(1)
	return c.Backend.Renew(ctx, g)
}

func (c *callCounter) Release(ctx context.Context, g driver.Grant) error {
	c.calls.Add(1)
	return c.Backend.Release(ctx, g)
}

func (c *callCounter) Abandon(ctx context.Context, r driver.Request) error {
	c.calls.Add(1)
	return c.Backend.Abandon(ctx, r)
}

// testManagerRefusesInvalidNames: every way into the Manager refuses a name
// that driver.ValidateName refuses with ErrInvalidName, and the backend
// sees no request for it: backends rely on that and do not check names.
func testManagerRefusesInvalidNames(t *testing.T, s *suite) {
	cb := &callCounter{Backend: s.backend()}
	m := newManager(t, cb, s.long)
	ran := false
	fn := func(context.Context, *lease.Lease) error { ran = true; return nil }
	for _, n := range []string{"", strings.Repeat("n", driver.MaxNameLen+1), "bad\x00nul", "new\nline", "\xff\xfe"} {
		calls := map[string]error{}
		_, calls["TryAcquire"] = m.TryAcquire(ctxT(t), n)
		_, calls["Acquire"] = m.Acquire(ctxT(t), n)
		_, calls["Holder"] = m.Holder(ctxT(t), n)
		calls["Run"] = m.Run(ctxT(t), n, fn)
		calls["TryRun"] = m.TryRun(ctxT(t), n, fn)
		_, calls["NewElection"] = lease.NewElection(m, n)
		_, calls["NewSemaphore"] = lease.NewSemaphore(m, n, 2)
		for call, err := range calls {
			if !errors.Is(err, lease.ErrInvalidName) {
				t.Errorf("%s(%q) = %v, want ErrInvalidName", call, n, err)
			}
		}
	}
	if ran {
		t.Error("Run or TryRun ran the function for an invalid name")
	}
	if n := cb.calls.Load(); n != 0 {
		t.Fatalf("%d requests reached the backend for invalid names, want 0", n)
	}
}

// longestName returns a name of exactly driver.MaxNameLen bytes that
// begins with prefix and ends with last, made of the bytes key schemes
// escape or count apart (multi-byte UTF-8, '%', '/', braces, a space).
func longestName(prefix string, last byte) string {
	const unit = "é%/{} "
	var b strings.Builder
	b.WriteString(prefix)
	for b.Len()+len(unit)+1 <= driver.MaxNameLen {
		b.WriteString(unit)
	}
	for b.Len()+1 < driver.MaxNameLen {
		b.WriteByte('x')
	}
	b.WriteByte(last)
	return b.String()
}

// testLongestNamesAreKeptApart: two names of driver.MaxNameLen bytes that
// differ only in their last byte are held at once by two Managers, each
// renewed, read back (where the store says who holds a name) and released:
// the store keeps every name the Manager lets through, however long, and
// needs no limit of its own.
func testLongestNamesAreKeptApart(t *testing.T, s *suite) {
	base := name(t) + "/"
	var ls []*lease.Lease
	for _, last := range []byte{'a', 'b'} {
		n := longestName(base, last)
		if err := lease.ValidateName(n); err != nil || len(n) != driver.MaxNameLen {
			t.Fatalf("leasetest: the name is %d bytes (%v), want a valid name of %d", len(n), err, driver.MaxNameLen)
		}
		l, err := newManager(t, s.backend(), s.long).TryAcquire(ctxT(t), n)
		if err != nil {
			t.Fatalf("TryAcquire of a name of %d bytes ending in %q: %v", len(n), last, err)
		}
		defer l.Release(ctxT(t))
		ls = append(ls, l)
	}
	m := newManager(t, s.backend(), s.long)
	_, inspects := s.probe.(driver.Inspector)
	for _, l := range ls {
		if err := l.Renew(ctxT(t)); err != nil {
			t.Fatalf("Renew of the name ending in %q: %v", l.Name()[len(l.Name())-1:], err)
		}
		if !inspects {
			continue
		}
		h, err := m.Holder(ctxT(t), l.Name())
		if err != nil || h.Owner != l.Owner() || h.Token != l.Token() {
			t.Fatalf("Holder of the name ending in %q = %+v, %v; want owner %q, token %d", l.Name()[len(l.Name())-1:], h, err, l.Owner(), l.Token())
		}
	}
	for _, l := range ls {
		if err := l.Release(ctxT(t)); err != nil {
			t.Fatalf("Release of the name ending in %q: %v", l.Name()[len(l.Name())-1:], err)
		}
	}
}

func testNamesDoNotCollide(t *testing.T, s *suite) {
	b := s.backend()
	base := name(t)
	names := []string{base + "a{b}c", base + "a%7Bb%7Dc", base + "}", base + "{", base + "ünï/cødé", base + "a:b", base + "a b", base + "a/b", base + "a//b", base + "/", base + ".."}
	// Each name with its own owner: names that shared a key would refuse
	// the second owner.
	var gs []driver.Grant
	for i, n := range names {
		gs = append(gs, mustAcquire(t, b, req(n, fmt.Sprintf("owner-%d", i), s.long)))
	}
	for _, g := range gs {
		release(t, b, g)
	}
}
