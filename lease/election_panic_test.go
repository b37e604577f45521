package lease_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"testing/synctest"
	"time"

	"github.com/fencekit/fencekit/lease"
	"github.com/fencekit/fencekit/lease/memlease"
)

// A panic in OnElected or in the leader's function propagates out of Run,
// as from any function, but the term ends first: its lease is released at
// the store (another process is elected at once, not after a TTL), the
// ElectionObserver hears Deposed once, and Lease reports no term.
func TestElectionPanicEndsTheTerm(t *testing.T) {
	for _, where := range []string{"OnElected", "lead"} {
		t.Run(where, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				obs := &ctxObserver{}
				b := memlease.New()
				m, err := lease.NewManager(b, time.Hour, lease.WithObserver(obs))
				if err != nil {
					t.Fatal(err)
				}
				onElected := func(*lease.Lease) {}
				lead := func(ctx context.Context, _ *lease.Lease) error { <-ctx.Done(); return nil }
				if where == "OnElected" {
					onElected = func(*lease.Lease) { panic("boom") }
				} else {
					lead = func(context.Context, *lease.Lease) error { panic("boom") }
				}
				e, err := lease.NewElection(m, "leader", lease.WithOnElected(onElected))
				if err != nil {
					t.Fatal(err)
				}
				var recovered any
				func() {
					defer func() { recovered = recover() }()
					_ = e.Run(context.Background(), lead)
				}()
				if recovered != "boom" {
					t.Fatalf("Run's panic = %v, want boom", recovered)
				}
				synctest.Wait()
				other, err := lease.NewManager(b, time.Hour, lease.WithIdentity("other"))
				if err != nil {
					t.Fatal(err)
				}
				l, err := other.TryAcquire(context.Background(), "leader")
				if err != nil {
					t.Fatalf("after the panic, another process cannot be elected: %v", err)
				}
				defer l.Release(context.Background())
				if cur := e.Lease(); cur != nil {
					t.Fatalf("after the panic, Lease() = token %d, want nil", cur.Token())
				}
				obs.mu.Lock()
				defer obs.mu.Unlock()
				if len(obs.terms) != 2 || errName2(obs.terms[1]) != "released" {
					t.Fatalf("election events %q, want elected then deposed (released)", obs.terms)
				}
			})
		})
	}
}

// ghostHolder answers that no one holds the lease, along with a stale
// holder's fields (as a third-party Inspector may).
type ghostHolder struct{ *memlease.Backend }

func (g ghostHolder) Holder(ctx context.Context, name string) (lease.Holder, error) {
	return lease.Holder{Name: name, Owner: "ghost", Token: 3}, fmt.Errorf("%w: %q is free", lease.ErrNotHeld, name)
}

// Observe reports "no one leads" once, whatever else the store returned
// with ErrNotHeld.
func TestObserveReportsNoLeaderOnce(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		m, err := lease.NewManager(ghostHolder{memlease.New()}, time.Second)
		if err != nil {
			t.Fatal(err)
		}
		e, err := lease.NewElection(m, "leader")
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second) // many polls
		defer cancel()
		var seen []lease.Holder
		_ = e.Observe(ctx, func(h lease.Holder) { seen = append(seen, h) })
		if len(seen) != 1 || seen[0].Owner != "" || seen[0].Token != 0 {
			t.Fatalf("Observe reported %+v, want one report of no leader", seen)
		}
	})
}

// heldAtDeposed is an ElectionObserver that asks the store, when a term is
// reported deposed, whether the term's lease is still the store's grant.
type heldAtDeposed struct {
	lease.NopObserver
	b        *memlease.Backend
	deposed  int
	released int // terms whose grant the store had already freed
}

func (o *heldAtDeposed) Elected(lease.ElectionEvent) {}
func (o *heldAtDeposed) Deposed(e lease.ElectionEvent) {
	o.deposed++
	if h, err := o.b.Holder(context.Background(), e.Election); err != nil || h.Token != e.Token {
		o.released++
	}
}

// Deposed is reported the moment the term's lease ends, before the request
// that frees it at the store is sent: a gauge summed across processes never
// counts the old leader and the next one at once.
func TestDeposedBeforeTheRelease(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := memlease.New()
		obs := &heldAtDeposed{b: b}
		m, err := lease.NewManager(b, time.Minute, lease.WithObserver(obs))
		if err != nil {
			t.Fatal(err)
		}
		const terms = 30
		e, err := lease.NewElection(m, "leader", lease.WithBackoff(time.Millisecond, time.Millisecond))
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		n := 0
		err = e.Run(ctx, func(context.Context, *lease.Lease) error {
			if n++; n == terms {
				cancel()
			}
			return nil // the term ends at once: released
		})
		if !errors.Is(err, context.Canceled) {
			t.Fatalf("Run = %v", err)
		}
		if obs.deposed != terms || obs.released != 0 {
			t.Fatalf("%d terms deposed, %d of them after the store had freed the grant; want %d, none", obs.deposed, obs.released, terms)
		}
	})
}

// slowLost is an Observer whose Lost takes a while (a slow exporter),
// unless the test lets it go.
type slowLost struct {
	lease.NopObserver
	inLost chan struct{}
	letGo  chan struct{}
}

func (o *slowLost) Lost(lease.LostEvent) {
	close(o.inLost)
	select {
	case <-o.letGo:
	case <-time.After(time.Second):
	}
}

// Release returns only once the lease's Context is cancelled, even when
// another goroutine (the scheduler, at the deadline) ended the lease and
// is still reporting it.
func TestReleaseReturnsWithTheContextCancelled(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		obs := &slowLost{inLost: make(chan struct{}), letGo: make(chan struct{})}
		b := &flakyRenew{Backend: memlease.New()}
		m, err := lease.NewManager(b, time.Second, lease.WithObserver(obs))
		if err != nil {
			t.Fatal(err)
		}
		l, err := m.TryAcquire(context.Background(), "slow")
		if err != nil {
			t.Fatal(err)
		}
		ctx := l.Context()
		b.fail.Store(true) // renewals fail: the scheduler ends the lease at its deadline
		<-obs.inLost
		_ = l.Release(context.Background())
		cause := context.Cause(ctx)
		close(obs.letGo)
		if cause == nil || !errors.Is(cause, lease.ErrLost) {
			t.Fatalf("after Release returned, the lease's context cause is %v (Err %v); want its loss", cause, l.Err())
		}
	})
}
