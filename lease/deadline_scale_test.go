package lease_test

import (
	"context"
	"fmt"

	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/fencekit/fencekit/lease"
	"github.com/fencekit/fencekit/lease/driver"
	"github.com/fencekit/fencekit/lease/memlease"
)

// freezable is a memory store that can stop answering: once frozen, every
// renew (alone or batched) hangs until its context ends, as a server
// stopped with SIGSTOP would leave it.
type freezable struct {
	*memlease.Backend
	frozen atomic.Bool
}

func (f *freezable) Renew(ctx context.Context, g driver.Grant) error {
	if f.frozen.Load() {
		<-ctx.Done()
		return ctx.Err()
	}
	return f.Backend.Renew(ctx, g)
}

func (f *freezable) RenewBatch(ctx context.Context, gs []driver.Grant, done func(int, error)) {
	if f.frozen.Load() {
		<-ctx.Done()
		for i := range gs {
			done(i, ctx.Err())
		}
		return
	}
	f.Backend.RenewBatch(ctx, gs, done)
}

// TestDeadlinesHoldAtScaleInVirtualTime: one Manager holds 10,000 leases,
// acquired in 10 waves a few milliseconds apart (10 groups of deadlines),
// heartbeats batched (the default), and the store freezes. In virtual time
// (testing/synctest), so the timing is the library's own and exact,
// whatever the machine's load:
//   - until half a safety margin before its local deadline, every lease
//     reads valid (the scheduler may start on a large group up to that
//     early, never earlier);
//   - at its deadline, every lease's Err reads lost and its Done channel is
//     closed, and the Observer has counted it lost.
//
// The real-store version (redislease, build tag "scale") freezes a real
// Redis; this one checks the Manager's own mechanism deterministically.
func TestDeadlinesHoldAtScaleInVirtualTime(t *testing.T) {
	const (
		waves   = 10
		perWave = 1000
		apart   = 40 * time.Millisecond // more than half the safety margin: each wave is its own group
		ttl     = 5 * time.Second
	)
	synctest.Test(t, func(t *testing.T) {
		fb := &freezable{Backend: memlease.New()}
		lostAt := &lostClock{}
		m, err := lease.NewManager(fb, ttl, lease.WithObserver(lostAt))
		if err != nil {
			t.Fatal(err)
		}
		margin := m.Options().SafetyMargin
		ctx := context.Background()
		groups := make([][]*lease.Lease, waves)
		sent := make([]time.Time, waves) // virtual time stands still while a wave is acquired
		for w := range waves {
			sent[w] = time.Now()
			for i := range perWave {
				l, err := m.TryAcquire(ctx, fmt.Sprintf("scale-%d-%d", w, i))
				if err != nil {
					t.Fatal(err)
				}
				groups[w] = append(groups[w], l)
			}
			time.Sleep(apart)
		}
		// The store freezes before the first heartbeat: each wave keeps
		// the deadline of its acquisition (renewals, batched, would give
		// several waves one deadline).
		fb.frozen.Store(true)

		deadlines := make([]time.Time, waves)
		for w, g := range groups {
			deadlines[w] = g[0].Deadline()
			if want := sent[w].Add(ttl - margin); !deadlines[w].Equal(want) {
				t.Fatalf("wave %d: deadline %v after the acquire was sent, want TTL - safety margin = %v", w, deadlines[w].Sub(sent[w]), ttl-margin)
			}
			for _, l := range g {
				if !l.Deadline().Equal(deadlines[w]) {
					t.Fatalf("wave %d: deadlines differ (%v, %v): the waves are not groups", w, deadlines[w], l.Deadline())
				}
				if err := l.Err(); err != nil {
					t.Fatalf("%s lost before the freeze: %v", l.Name(), err)
				}
			}
		}
		for w, g := range groups {
			if w > 0 && !deadlines[w].After(deadlines[w-1]) {
				t.Fatalf("wave %d's deadline %v is not after wave %d's %v", w, deadlines[w], w-1, deadlines[w-1])
			}
			time.Sleep(time.Until(deadlines[w].Add(-margin/2 - time.Nanosecond)))
			synctest.Wait()
			for _, l := range g {
				if err := l.Err(); err != nil {
					t.Fatalf("wave %d: %s lost %v before its deadline (more than half the safety margin %v): %v",
						w, l.Name(), time.Until(deadlines[w]), margin, err)
				}
			}
			time.Sleep(time.Until(deadlines[w]))
			if got := time.Now(); !got.Equal(deadlines[w]) {
				t.Fatalf("virtual clock at %v, want the deadline %v", got, deadlines[w])
			}
			// Err reads the clock: lost at the deadline, before the
			// scheduler has necessarily run.
			for _, l := range g {
				if l.Err() == nil {
					t.Fatalf("wave %d: %s reads valid at its deadline", w, l.Name())
				}
			}
			synctest.Wait()
			for _, l := range g {
				select {
				case <-l.Done():
				default:
					t.Fatalf("wave %d: %s's context not cancelled at its deadline", w, l.Name())
				}
			}
		}
		for w, g := range groups {
			for _, l := range g {
				at, ok := lostAt.at.Load(l.Name())
				switch {
				case !ok:
					t.Fatalf("the Observer never heard that %s was lost", l.Name())
				case at.(time.Time).After(deadlines[w]):
					t.Fatalf("%s reported lost %v after its deadline", l.Name(), at.(time.Time).Sub(deadlines[w]))
				case at.(time.Time).Before(deadlines[w].Add(-margin / 2)):
					t.Fatalf("%s reported lost %v before its deadline, more than half the safety margin %v", l.Name(), deadlines[w].Sub(at.(time.Time)), margin)
				}
			}
		}
		// The renewals hung on the frozen store end with their contexts.
		time.Sleep(ttl)
		synctest.Wait()
	})
}

// lostClock records when the Observer heard of each loss, by lease name.
type lostClock struct{ at sync.Map }

func (c *lostClock) Acquired(lease.AcquiredEvent) {}
func (c *lostClock) Renewed(lease.RenewedEvent)   {}
func (c *lostClock) Lost(e lease.LostEvent)       { c.at.Store(e.Name, time.Now()) }
func (c *lostClock) Released(lease.ReleasedEvent) {}
