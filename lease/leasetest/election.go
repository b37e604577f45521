package leasetest

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/fencekit/fencekit/fence"
	"github.com/fencekit/fencekit/lease"
	"github.com/fencekit/fencekit/lease/driver"
)

// The checks of elections: leadership handed over, and each leader
// observed.

func testElection(t *testing.T, s *suite) {
	n := name(t)
	type term struct {
		who   string
		token fence.Token
	}
	var (
		mu    sync.Mutex
		terms []term
	)
	ctx, cancel := context.WithCancel(ctxT(t))
	defer cancel()
	elections := map[string]*lease.Election{}
	var wg sync.WaitGroup
	for _, who := range []string{"a", "b"} {
		m := newManager(t, s.connect(), s.long, lease.WithIdentity(who), lease.WithPollInterval(50*time.Millisecond))
		e, err := lease.NewElection(m, n, lease.WithBackoff(10*time.Millisecond, 50*time.Millisecond))
		if err != nil {
			t.Fatal(err)
		}
		elections[who] = e
		wg.Add(1)
		go func() {
			defer wg.Done()
			err := e.Run(ctx, func(ctx context.Context, l *lease.Lease) error {
				mu.Lock()
				terms = append(terms, term{who, l.Token()})
				mu.Unlock()
				<-ctx.Done()
				return nil
			})
			if !errors.Is(err, context.Canceled) {
				t.Errorf("%s: Run = %v, want context.Canceled", who, err)
			}
		}()
	}
	waitTerms := func(k int) []term {
		deadline := time.Now().Add(s.long + 10*time.Second)
		for time.Now().Before(deadline) {
			mu.Lock()
			got := append([]term(nil), terms...)
			mu.Unlock()
			if len(got) >= k {
				return got
			}
			time.Sleep(5 * time.Millisecond)
		}
		t.Fatalf("fewer than %d terms", k)
		return nil
	}
	first := waitTerms(1)[0]
	leader := elections[first.who]
	if l := leader.Lease(); l == nil || l.Token() != first.token {
		t.Fatalf("the leader's Election.Lease() = %v, want its term's lease", l)
	}
	if h, err := leader.Leader(ctxT(t)); err == nil {
		if h.Identity() != first.who || h.Token != first.token {
			t.Errorf("Leader() = %+v, want %s with token %d", h, first.who, first.token)
		}
	} else if !errors.Is(err, errors.ErrUnsupported) {
		t.Errorf("Leader(): %v", err)
	}
	// Hand over by resigning, a few times; tokens grow term after term and
	// no two terms overlap (each work waits for its context to end).
	for k := 2; k <= 4; k++ {
		mu.Lock()
		cur := terms[len(terms)-1]
		mu.Unlock()
		if err := elections[cur.who].Resign(ctxT(t)); err != nil {
			t.Fatalf("Resign: %v", err)
		}
		got := waitTerms(k)
		if got[k-1].token <= got[k-2].token {
			t.Fatalf("term %d has token %d after %d", k, got[k-1].token, got[k-2].token)
		}
	}
	cancel()
	wg.Wait()
}

// testObserve: a follower that does not campaign hears of each leader, in
// order, once per change, over its own connection.
func testObserve(t *testing.T, s *suite) {
	_, ok := s.backend().(driver.Inspector)
	s.need(t, Inspect, ok)
	n := name(t)
	follower := newManager(t, s.connect(), s.long, lease.WithPollInterval(20*time.Millisecond))
	e, err := lease.NewElection(follower, n)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(ctxT(t))
	defer cancel()
	reports := make(chan lease.Holder, 64)
	done := make(chan error, 1)
	go func() {
		done <- e.Observe(ctx, func(h lease.Holder) { reports <- h })
	}()
	// next returns the next report, failing the test when none comes.
	next := func(what string) lease.Holder {
		t.Helper()
		select {
		case h := <-reports:
			return h
		case <-time.After(s.long + 10*time.Second):
			t.Fatalf("no report of %s", what)
			return lease.Holder{}
		}
	}
	if h := next("the free lease"); h.Owner != "" || h.Token != fence.None {
		t.Fatalf("first report %+v, want no leader", h)
	}
	for _, who := range []string{"a", "b"} {
		l, err := newManager(t, s.connect(), s.long, lease.WithIdentity(who)).TryAcquire(ctxT(t), n)
		if err != nil {
			t.Fatal(err)
		}
		h := next("leader " + who)
		if h.Owner == "" { // the "no one" between two leaders
			h = next("leader " + who)
		}
		if h.Name != n || h.Owner != l.Owner() || h.Token != l.Token() || h.Identity() != who {
			t.Fatalf("report %+v, want leader %s (owner %q, token %d)", h, who, l.Owner(), l.Token())
		}
		if err := l.Release(ctxT(t)); err != nil {
			t.Fatal(err)
		}
	}
	if h := next("the end of the last term"); h.Owner != "" {
		t.Fatalf("report %+v after the last release, want no leader", h)
	}
	cancel()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Fatalf("Observe = %v, want context.Canceled", err)
	}
	close(reports)
	for h := range reports {
		t.Fatalf("report %+v after nothing changed", h)
	}
}
