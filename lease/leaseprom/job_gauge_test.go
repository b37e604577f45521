package leaseprom_test

import (
	"context"
	"errors"
	"strconv"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/fencekit/fencekit/internal/testkit"
	"github.com/fencekit/fencekit/lease"
	"github.com/fencekit/fencekit/lease/leaseprom"
	"github.com/fencekit/fencekit/lease/memlease"
)

// fencekit_job_running{lease} is 1 while Run, RunOnce or an election's
// term runs its job under the lease, and 0 once the job's lease ended.
func TestJobGaugeFollowsRunRunOnceAndElections(t *testing.T) {
	reg, m := observed(t)
	testkit.CheckJobGauge(t, m, "job gauge", func(name string) float64 { return gauge(t, reg, "fencekit_job_running", name) })
	if n := testutil.CollectAndCount(reg, "fencekit_job_running"); n != 3 {
		t.Fatalf("job gauge series = %d, want one per lease name (3)", n)
	}
}

// pausedAtJobEnded stands for a process paused as its job's lease ends:
// its JobEnded (and so its gauge) waits until the pause ends.
type pausedAtJobEnded struct {
	lease.NopObserver
	resume chan struct{}
}

func (p pausedAtJobEnded) JobStarted(lease.JobEvent) {}
func (p pausedAtJobEnded) JobEnded(lease.JobEvent)   { <-p.resume }

// Two processes run one job. The first one's lease runs out while its
// function ignores its context and runs on: its gauge drops to 0 when the
// lease ends, not when the function returns, so that the sum across the
// two is 1 once the second process runs the job. While the first process
// is paused as its lease ends, the sum is 2, which is why the docs say to
// alert when the sum stays above 1, not when it is above 1 once.
func TestJobGaugeFollowsTheLeaseNotTheFunction(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		pause := pausedAtJobEnded{resume: make(chan struct{})}
		p := newPair(t, pause)
		regA, regB, storeA, mA, mB := p.regA, p.regB, p.storeA, p.mA, p.mB
		a := func() float64 { return gauge(t, regA, "fencekit_job_running", "settle-orders") }
		b := func() float64 { return gauge(t, regB, "fencekit_job_running", "settle-orders") }

		aWorks, bWorks := make(chan struct{}), make(chan struct{})
		var errA, errB error
		var wg sync.WaitGroup
		wg.Go(func() {
			errA = mA.Run(t.Context(), "settle-orders", func(ctx context.Context, _ *lease.Lease) error {
				<-aWorks // ignores its context
				return nil
			})
		})
		synctest.Wait()
		wg.Go(func() {
			errB = mB.Run(t.Context(), "settle-orders", func(ctx context.Context, _ *lease.Lease) error {
				<-bWorks
				return nil
			})
		})
		synctest.Wait()
		if a() != 1 || b() != 0 {
			t.Fatalf("a runs the job: gauges a=%v b=%v, want 1 and 0", a(), b())
		}

		storeA.mu.Lock()
		storeA.cut = true // a's renewals fail: its lease runs out; b's Run gets it
		storeA.mu.Unlock()
		time.Sleep(3 * time.Second)
		synctest.Wait()
		if a()+b() != 2 {
			t.Fatalf("while a is paused at the end of its job's lease: gauges a=%v b=%v, want a sum of 2", a(), b())
		}
		close(pause.resume)
		synctest.Wait()
		if a() != 0 || b() != 1 {
			t.Fatalf("once a's lease ended, its function still running: gauges a=%v b=%v, want 0 and 1", a(), b())
		}
		close(aWorks)
		close(bWorks)
		wg.Wait()
		if !errors.Is(errA, lease.ErrLost) || errB != nil {
			t.Fatalf("a's Run = %v (want the loss), b's = %v", errA, errB)
		}
		if a() != 0 || b() != 0 {
			t.Fatalf("after both jobs: gauges a=%v b=%v, want 0 and 0", a(), b())
		}
	})
}

// The job gauge has a series for each of the first MaxJobLeases lease
// names, and counts the jobs of every later name in the series lease="".
func TestJobGaugeCardinalityIsBounded(t *testing.T) {
	reg, m := observed(t)
	ctx := t.Context()
	var during []float64
	for i := range leaseprom.MaxJobLeases + 3 {
		name := "order-" + strconv.Itoa(i)
		err := m.TryRun(ctx, name, func(context.Context, *lease.Lease) error {
			if i >= leaseprom.MaxJobLeases {
				during = append(during, gauge(t, reg, "fencekit_job_running", ""))
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	if n := testutil.CollectAndCount(reg, "fencekit_job_running"); n != leaseprom.MaxJobLeases+1 {
		t.Fatalf("job gauge series = %d, want %d (one per name up to the bound, and lease=\"\")", n, leaseprom.MaxJobLeases+1)
	}
	if len(during) != 3 || during[0] != 1 || during[1] != 1 || during[2] != 1 {
		t.Fatalf("the lease=\"\" series while a job beyond the bound ran: %v, want 1 each time", during)
	}
	if got := gauge(t, reg, "fencekit_job_running", ""); got != 0 {
		t.Fatalf("the lease=\"\" series = %v after the jobs, want 0", got)
	}
}

// observed returns a Manager over a memory store whose events go to a
// leaseprom Observer on a registry of its own.
func observed(t *testing.T) (*prometheus.Registry, *lease.Manager) {
	t.Helper()
	reg := prometheus.NewRegistry()
	obs, err := leaseprom.New(reg)
	if err != nil {
		t.Fatal(err)
	}
	m, err := lease.NewManager(memlease.New(), time.Second, lease.WithObserver(obs))
	if err != nil {
		t.Fatal(err)
	}
	return reg, m
}
