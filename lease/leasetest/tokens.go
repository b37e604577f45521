package leasetest

import (
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/fencekit/fencekit/fence"
	"github.com/fencekit/fencekit/lease"
	"github.com/fencekit/fencekit/lease/driver"
)

// The checks of fencing tokens: minted with every grant, strictly growing,
// and still growing after the store lost its data.

func testGrantMintsToken(t *testing.T, s *suite) {
	b := s.backend()
	n := name(t)
	g := mustAcquire(t, b, req(n, "a", s.long))
	release(t, b, g)
}

func testTokensGrow(t *testing.T, s *suite) {
	b := s.backend()
	n := name(t)
	var last fence.Token
	for i := range 30 {
		g := mustAcquire(t, b, req(n, fmt.Sprintf("o%d", i), s.long))
		if g.Token <= last {
			t.Fatalf("grant %d: token %d is not greater than the previous %d", i, g.Token, last)
		}
		last = g.Token
		release(t, b, g)
	}
}

func testTokensGrowAfterDataLoss(t *testing.T, s *suite) {
	s.need(t, DataLoss, s.cfg.LoseData != nil)
	b := s.backend()
	base := name(t)
	before := map[string]driver.Grant{}
	for i := range 5 {
		n := fmt.Sprintf("%s-%d", base, i)
		// A few grants each, so that counters are well above their start.
		for j := range 3 {
			g := mustAcquire(t, b, req(n, fmt.Sprintf("o%d", j), s.long))
			if j < 2 {
				release(t, b, g)
			}
			before[n] = g
		}
	}
	s.cfg.LoseData(t, b)
	b2 := s.connect()
	for n, old := range before {
		g := mustAcquireEventually(t, b2, req(n, "after", s.long))
		if g.Token <= old.Token {
			t.Errorf("%s: token %d after the store lost its data, not greater than %d granted before", n, g.Token, old.Token)
		}
		// The holder from before the loss cannot renew into the new grant.
		if err := b.Renew(ctxT(t), old); !errors.Is(err, lease.ErrNotHeld) {
			t.Errorf("%s: the old holder's Renew after the loss = %v, want ErrNotHeld", n, err)
		}
		release(t, b2, g)
	}
}

// mustAcquireEventually retries transient errors for a while (a store that
// was just restarted may refuse connections for a moment).
func mustAcquireEventually(t *testing.T, b lease.Backend, r driver.Request) driver.Grant {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		_, err := b.Acquire(ctxT(t), r)
		if err == nil {
			return mustAcquire(t, b, r) // the same owner again: idempotent, and checked
		}
		if time.Now().After(deadline) {
			t.Fatalf("Acquire(%q) after the data loss: %v", r.Name, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}
