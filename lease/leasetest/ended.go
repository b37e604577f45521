package leasetest

import (
	"errors"
	"testing"

	"github.com/fencekit/fencekit/lease"
)

// The check of ended owners: an owner the store ended is refused a
// grant.

// testEndedOwnerIsRefused: an owner the store ended by Release or Abandon
// is never granted the name again, so a late acquire request of an attempt
// nobody waits for cannot leave a grant nobody holds.
func testEndedOwnerIsRefused(t *testing.T, s *suite) {
	b := s.backend()
	n := name(t)
	g := mustAcquire(t, b, req(n, "a", s.long))
	release(t, b, g)
	if g2, err := s.connect().Acquire(ctxT(t), req(n, "a", s.long)); !errors.Is(err, lease.ErrNotAcquired) {
		t.Fatalf("Acquire by an owner the store released = %v (grant %+v), want ErrNotAcquired", err, g2)
	}

	// Abandon before the request arrives: refused when it does.
	late := req(n, "late", s.long)
	if err := b.Abandon(ctxT(t), late); err != nil {
		t.Fatalf("Abandon of an owner that holds nothing: %v", err)
	}
	if g2, err := s.connect().Acquire(ctxT(t), late); !errors.Is(err, lease.ErrNotAcquired) {
		t.Fatalf("Acquire by an abandoned owner = %v (grant %+v), want ErrNotAcquired", err, g2)
	}

	// Abandon after the store granted: the grant ends at once, the owner
	// stays refused, and another owner gets the name with a greater token.
	ghost := req(n, "ghost", s.long)
	gg := mustAcquire(t, b, ghost)
	if err := s.connect().Abandon(ctxT(t), ghost); err != nil {
		t.Fatalf("Abandon of a granted owner: %v", err)
	}
	nb := s.connect()
	next := mustAcquire(t, nb, req(n, "next", s.long))
	if next.Token <= gg.Token {
		t.Fatalf("token after an abandoned grant %d <= its token %d", next.Token, gg.Token)
	}
	if err := b.Renew(ctxT(t), gg); !errors.Is(err, lease.ErrNotHeld) {
		t.Fatalf("Renew of an abandoned grant = %v, want ErrNotHeld", err)
	}
	if _, err := b.Acquire(ctxT(t), ghost); !errors.Is(err, lease.ErrNotAcquired) {
		t.Fatalf("Acquire by an abandoned owner = %v, want ErrNotAcquired", err)
	}
	// Abandon of an owner that does not hold the name leaves the holder be.
	if err := b.Abandon(ctxT(t), req(n, "someone", s.long)); err != nil {
		t.Fatalf("Abandon: %v", err)
	}
	if err := nb.Renew(ctxT(t), next); err != nil {
		t.Fatalf("Abandon of another owner freed the holder's grant: Renew = %v", err)
	}
	release(t, nb, next)
}
