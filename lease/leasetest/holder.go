package leasetest

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/fencekit/fencekit/lease"
	"github.com/fencekit/fencekit/lease/driver"
)

// The checks of inspection: who holds a lease, and a refusal that names
// the holder.

func testHolder(t *testing.T, s *suite) {
	b := s.backend()
	in, ok := b.(driver.Inspector)
	s.need(t, Inspect, ok)
	n := name(t)
	if _, err := in.Holder(ctxT(t), n); !errors.Is(err, lease.ErrNotHeld) {
		t.Fatalf("Holder of a free lease = %v, want ErrNotHeld", err)
	}
	m := newManager(t, b, s.long, lease.WithIdentity("inspected"))
	l, err := m.TryAcquire(ctxT(t), n)
	if err != nil {
		t.Fatal(err)
	}
	h, err := newManager(t, s.connect(), s.long).Holder(ctxT(t), n)
	if err != nil {
		t.Fatalf("Holder: %v", err)
	}
	if h.Name != n || h.Owner != l.Owner() || h.Token != l.Token() || h.Identity() != "inspected" {
		t.Fatalf("Holder = %+v (identity %q), want owner %q, token %d, identity inspected", h, h.Identity(), l.Owner(), l.Token())
	}
	if h.Remaining < 0 || h.Remaining > l.TTL() {
		t.Fatalf("Holder.Remaining = %v, want within [0, %v]", h.Remaining, l.TTL())
	}
	if err := l.Release(ctxT(t)); err != nil {
		t.Fatal(err)
	}
	if _, err := in.Holder(ctxT(t), n); !errors.Is(err, lease.ErrNotHeld) {
		t.Fatalf("Holder after release = %v, want ErrNotHeld", err)
	}
}

// testRefusalNamesHolder: a blocking Acquire that gives up names the
// current holder (owner and token) in its error; a refused TryAcquire names
// it only if the backend's refusal carried it (it costs no extra request),
// and then correctly.
func testRefusalNamesHolder(t *testing.T, s *suite) {
	_, ok := s.backend().(driver.Inspector)
	s.need(t, Inspect, ok)
	n := name(t)
	l, err := newManager(t, s.connect(), s.long, lease.WithIdentity("holder")).TryAcquire(ctxT(t), n)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Release(ctxT(t))
	m := newManager(t, s.connect(), s.long, lease.WithIdentity("waiter"))
	check := func(what string, err error) {
		t.Helper()
		var na *driver.NotAcquiredError
		if !errors.As(err, &na) || na.Holder.Owner != l.Owner() || na.Holder.Token != l.Token() {
			t.Fatalf("%s = %v; want a NotAcquiredError naming owner %q, token %d", what, err, l.Owner(), l.Token())
		}
		if !strings.Contains(err.Error(), l.Owner()) || strings.Contains(err.Error(), "\n") {
			t.Fatalf("%s = %q; want one line naming the holder %q", what, err, l.Owner())
		}
	}
	_, err = m.TryAcquire(ctxT(t), n)
	var na *driver.NotAcquiredError
	if !errors.As(err, &na) {
		t.Fatalf("TryAcquire = %v; want a NotAcquiredError", err)
	}
	if na.Holder.Owner != "" {
		check("TryAcquire", err)
	}
	// Long enough for one refusal on a loaded machine (1 s was not: at
	// load 20 an etcd cluster's first answer took longer): the error
	// names the holder from the store's last refusal even when the
	// attempt in flight at the end is cut short.
	ctx, cancel := context.WithTimeout(ctxT(t), 5*time.Second)
	defer cancel()
	_, err = m.Acquire(ctx, n)
	check("Acquire", err)
}
