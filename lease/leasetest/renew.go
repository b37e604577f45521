package leasetest

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/fencekit/fencekit/fence"
	"github.com/fencekit/fencekit/lease"
	"github.com/fencekit/fencekit/lease/driver"
)

// The checks of renewals: compare-and-extend on owner and token, alone
// and in batches, keeping a grant alive.

func testRenewCompares(t *testing.T, s *suite) {
	b := s.backend()
	n := name(t)
	g := mustAcquire(t, b, req(n, "a", s.long))
	other := g
	other.Owner = "b"
	if err := b.Renew(ctxT(t), other); !errors.Is(err, lease.ErrNotHeld) {
		t.Fatalf("Renew by another owner = %v, want ErrNotHeld", err)
	}
	for _, tok := range []fence.Token{g.Token - 1, g.Token + 1} {
		wrong := g
		wrong.Token = tok
		if err := b.Renew(ctxT(t), wrong); !errors.Is(err, lease.ErrNotHeld) {
			t.Fatalf("Renew by the owner with token %d (granted %d) = %v, want ErrNotHeld", tok, g.Token, err)
		}
	}
	if err := b.Renew(ctxT(t), g); err != nil {
		t.Fatalf("Renew by the owner: %v", err)
	}
	release(t, b, g)
	// A renew after release must not re-create the lease.
	if err := b.Renew(ctxT(t), g); !errors.Is(err, lease.ErrNotHeld) {
		t.Fatalf("Renew after release = %v, want ErrNotHeld", err)
	}
	g2 := mustAcquire(t, b, req(n, "c", s.long))
	if g2.Token <= g.Token {
		t.Fatalf("token after release %d <= earlier token %d", g2.Token, g.Token)
	}
	release(t, b, g2)
}

// testRenewKeepsAlive: renewing a grant every quarter of its TTL keeps it
// for three TTLs: the store never refuses a renew, and never grants the
// name to another owner, while the last confirmed request was sent less
// than a TTL before (the store then certainly still held the grant). A
// loaded machine can stretch a quarter TTL past a whole one; the store may
// then rightly let the grant expire, and that round proves nothing: it
// starts again with a new owner. The test fails on a violation, or when no
// round keeps pace within a minute.
func testRenewKeepsAlive(t *testing.T, s *suite) {
	b1, b2 := s.backend(), s.connect()
	n := name(t)
	giveUp := time.Now().Add(time.Minute)
	for round := 0; !renewRound(t, b1, b2, n, s.short, round); round++ {
		if time.Now().After(giveUp) {
			t.Fatalf("no round of renewals kept pace with the TTL %v within a minute (%d rounds): the machine is too loaded to tell", s.short, round+1)
		}
	}
}

// renewRound is one round of testRenewKeepsAlive; it reports whether the
// round was conclusive.
func renewRound(t *testing.T, b1, b2 lease.Backend, n string, ttl time.Duration, round int) bool {
	t.Helper()
	confirmed := time.Now() // send time of the last request the store confirmed
	g := mustAcquire(t, b1, req(n, fmt.Sprintf("a%d", round), ttl))
	end := time.Now().Add(3 * g.TTL)
	for time.Now().Before(end) {
		time.Sleep(ttl / 4)
		sent := time.Now()
		if err := b1.Renew(ctxT(t), g); err != nil {
			if since := time.Since(confirmed); errors.Is(err, lease.ErrNotHeld) && since >= ttl {
				t.Logf("round %d: the renew returned %v after the last confirmed request was sent, past the TTL %v: the grant may have expired; starting again", round, since, ttl)
				return false
			}
			t.Fatalf("Renew %v after the last confirmed request was sent (TTL %v): %v", time.Since(confirmed), ttl, err)
		}
		confirmed = sent
		g2, err := b2.Acquire(ctxT(t), req(n, fmt.Sprintf("b%d", round), ttl))
		if err == nil {
			since := time.Since(confirmed)
			release(t, b2, g2)
			if since >= ttl {
				t.Logf("round %d: another owner was granted the name %v after the last confirmed renew was sent, past the TTL %v; starting again", round, since, ttl)
				return false
			}
			t.Fatalf("a renewed lease was granted to another owner %v after the last confirmed renew was sent (TTL %v)", since, ttl)
		}
		if !errors.Is(err, lease.ErrNotAcquired) {
			t.Fatalf("Acquire by another owner = %v, want ErrNotAcquired", err)
		}
	}
	release(t, b1, g)
	return true
}

func testRenewBatch(t *testing.T, s *suite) {
	b := s.backend()
	br, ok := b.(driver.BatchRenewer)
	s.need(t, BatchRenew, ok)
	n := name(t)
	mine := mustAcquire(t, b, req(n+"-mine", "a", s.long))
	theirs := mustAcquire(t, b, req(n+"-theirs", "b", s.long))
	stolen := theirs
	stolen.Owner = "a"
	wrongTok := mine
	wrongTok.Token++
	gone := driver.Grant{Name: n + "-gone", Owner: "a", Token: mine.Token, TTL: s.long}
	errs, err := RenewBatch(ctxT(t), br, []driver.Grant{mine, stolen, gone, wrongTok, mine})
	if err != nil {
		t.Fatal(err)
	}
	if errs[0] != nil || errs[4] != nil {
		t.Fatalf("RenewBatch of a held lease: %v, %v", errs[0], errs[4])
	}
	for i, what := range map[int]string{1: "another owner's lease", 2: "a missing lease", 3: "the right owner with the wrong token"} {
		if !errors.Is(errs[i], lease.ErrNotHeld) {
			t.Errorf("RenewBatch of %s = %v, want ErrNotHeld", what, errs[i])
		}
	}
	if _, err := b.Acquire(ctxT(t), req(gone.Name, "z", s.long)); err != nil {
		t.Fatalf("a batch renew must not create a lease; Acquire: %v", err)
	}
}

// RenewBatch calls br.RenewBatch and collects the outcomes in order. It
// returns an error if the backend broke the contract: a grant reported
// twice or not at all, an index out of range, or a done call after
// RenewBatch returned.
func RenewBatch(ctx context.Context, br driver.BatchRenewer, gs []driver.Grant) ([]error, error) {
	var (
		mu       sync.Mutex
		errs     = make([]error, len(gs))
		seen     = make([]int, len(gs))
		returned bool
		bad      []error
	)
	br.RenewBatch(ctx, gs, func(i int, err error) {
		mu.Lock()
		defer mu.Unlock()
		switch {
		case returned:
			bad = append(bad, fmt.Errorf("RenewBatch reported grant %d after it returned", i))
		case i < 0 || i >= len(gs):
			bad = append(bad, fmt.Errorf("RenewBatch reported index %d of %d grants", i, len(gs)))
		default:
			seen[i]++
			errs[i] = err
		}
	})
	mu.Lock()
	defer mu.Unlock()
	returned = true
	for i, n := range seen {
		if n != 1 {
			bad = append(bad, fmt.Errorf("RenewBatch reported grant %d %d times, want once", i, n))
		}
	}
	return errs, errors.Join(bad...)
}
