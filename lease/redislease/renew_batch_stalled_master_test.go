package redislease_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/fencekit/fencekit/internal/testkit"
	"github.com/fencekit/fencekit/lease"
	"github.com/fencekit/fencekit/lease/driver"
	"github.com/fencekit/fencekit/lease/leasetest"
	"github.com/fencekit/fencekit/lease/redislease"
	"github.com/fencekit/fencekit/lease/redislease/redistest"
)

// On a Redis Cluster, one stalled master must not cost the leases on the
// others. RenewBatch sends one pipeline per master and
// reports each master's grants when it answers.
//
// The cluster is this test's own (3 masters, 3 replicas), with a node
// timeout far longer than the pause, so that the paused master is not
// failed over: the scenario is a stall, not a failover.
func TestRenewBatchStalledMaster(t *testing.T) {
	cl := redistest.StartCluster(t, redistest.ClusterOptions{Masters: 3, NodeTimeout: 60 * time.Second})
	masters := cl.Masters(t)
	if len(masters) != 3 {
		t.Fatalf("%d masters, want 3", len(masters))
	}
	paused := masters[0]

	// names returns perMaster lease names on every master, interleaved
	// (one per master in turn), and the master of each.
	names := func(t *testing.T, b *redislease.Backend, base string, perMaster int) ([]string, []*redistest.Server) {
		count := make(map[*redistest.Server]int)
		var ns []string
		var on []*redistest.Server
		byMaster := make(map[*redistest.Server][]string)
		for i := 0; len(count) < 3 || minCount(count) < perMaster; i++ {
			n := fmt.Sprintf("%s-%d", base, i)
			m := cl.MasterFor(t, b.KeysFor(n).Lease)
			if count[m] < perMaster {
				count[m]++
				byMaster[m] = append(byMaster[m], n)
			}
		}
		for i := range perMaster {
			for _, m := range masters {
				ns = append(ns, byMaster[m][i])
				on = append(on, m)
			}
		}
		return ns, on
	}

	// The mechanism, at the backend: with the paused master's grants
	// interleaved with the others in one batch, every grant on a healthy
	// master is reported renewed before any grant of the paused one is
	// reported at all (those wait for their master until the pipeline
	// gives up), and RenewBatch returns only after the last report.
	t.Run("Backend", func(t *testing.T) {
		b := newBackend(t, cl.Client(t), redistest.UniquePrefix())
		ns, on := names(t, b, "batch", 4)
		gs := make([]driver.Grant, len(ns))
		for i, n := range ns {
			g, err := b.Acquire(testkit.Context(t), driver.Request{Name: n, Owner: "o", TTL: time.Minute})
			if err != nil {
				t.Fatal(err)
			}
			gs[i] = g
		}
		// Scripts cached and slot map loaded before the pause.
		if errs, err := leasetest.RenewBatch(testkit.Context(t), b, gs); err != nil || errors.Join(errs...) != nil {
			t.Fatalf("RenewBatch before the pause: %v %v", err, errs)
		}

		paused.Pause(t)
		resumed := false
		defer func() {
			if !resumed {
				paused.Resume(t)
			}
		}()
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		var (
			mu             sync.Mutex
			errs           = make([]error, len(gs))
			calls          = make([]int, len(gs))
			pausedReported int
			early          []string // healthy grants reported after a paused one
			returned       bool
			afterReturn    int
		)
		b.RenewBatch(ctx, gs, func(i int, err error) {
			mu.Lock()
			defer mu.Unlock()
			if returned {
				afterReturn++
			}
			calls[i]++
			errs[i] = err
			if on[i] == paused {
				pausedReported++
			} else if pausedReported > 0 {
				early = append(early, gs[i].Name)
			}
		})
		mu.Lock()
		returned = true
		mu.Unlock()
		paused.Resume(t)
		resumed = true

		for i := range gs {
			if calls[i] != 1 {
				t.Errorf("grant %d (%s) reported %d times, want once", i, gs[i].Name, calls[i])
			}
			switch {
			case on[i] != paused && errs[i] != nil:
				t.Errorf("grant %s on a healthy master: %v, want renewed", gs[i].Name, errs[i])
			case on[i] == paused && (errs[i] == nil || errors.Is(errs[i], lease.ErrNotHeld)):
				t.Errorf("grant %s on the paused master: %v, want the store's error (no reply)", gs[i].Name, errs[i])
			}
		}
		if len(early) > 0 {
			t.Errorf("grants on healthy masters reported only after the paused master's grants: %v (they waited for it)", early)
		}
		if afterReturn > 0 {
			t.Errorf("%d done calls after RenewBatch returned", afterReturn)
		}
	})

	// The stalled master, through a Manager that batches
	// heartbeats: a master paused for 2.5 TTLs costs the leases it
	// serves, all of them, and none of the leases on the other two.
	t.Run("Manager", func(t *testing.T) {
		b := newBackend(t, cl.Client(t), redistest.UniquePrefix())
		ttl := 2 * time.Second
		m := newManager(t, b, lease.Options{
			TTL:              ttl,
			RenewInterval:    500 * time.Millisecond,
			RenewBatchWindow: 120 * time.Millisecond, // < RenewInterval/4: most heartbeats share a batch
		})
		ns, on := names(t, b, "managed", 6)
		ls := make([]*lease.Lease, len(ns))
		for i, n := range ns {
			l, err := m.TryAcquire(testkit.Context(t), n)
			if err != nil {
				t.Fatal(err)
			}
			ls[i] = l
		}
		time.Sleep(ttl) // a few heartbeat batches, with every master answering
		for i, l := range ls {
			if err := l.Err(); err != nil {
				t.Fatalf("lease %s lost before the pause: %v", ns[i], err)
			}
		}

		paused.Pause(t)
		time.Sleep(ttl * 5 / 2)
		var healthyLost, pausedKept []string
		for i, l := range ls {
			err := l.Err()
			switch {
			case on[i] != paused && err != nil:
				healthyLost = append(healthyLost, fmt.Sprintf("%s: %v", ns[i], err))
			case on[i] == paused && !errors.Is(err, lease.ErrLost):
				pausedKept = append(pausedKept, fmt.Sprintf("%s: %v", ns[i], err))
			}
		}
		paused.Resume(t)

		if len(healthyLost) > 0 {
			t.Errorf("%d of %d leases on the healthy masters were lost while another master was paused: %v",
				len(healthyLost), 2*len(ls)/3, healthyLost)
		}
		if len(pausedKept) > 0 {
			t.Errorf("leases on the master paused past the TTL that were not lost: %v", pausedKept)
		}
		for i, l := range ls {
			err := l.Release(testkit.Context(t))
			if on[i] != paused && err != nil {
				t.Errorf("Release of %s on a healthy master: %v", ns[i], err)
			}
			if on[i] == paused && !errors.Is(err, lease.ErrLost) {
				t.Errorf("Release of %s on the paused master = %v, want ErrLost", ns[i], err)
			}
		}
	})
}

func minCount(m map[*redistest.Server]int) int {
	least := -1
	for _, n := range m {
		if least < 0 || n < least {
			least = n
		}
	}
	return least
}
