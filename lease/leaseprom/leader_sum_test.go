package leaseprom_test

import (
	"context"
	"errors"
	"log/slog"
	"os"
	"regexp"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/fencekit/fencekit/lease"
	"github.com/fencekit/fencekit/lease/driver"
	"github.com/fencekit/fencekit/lease/leaseprom"
	"github.com/fencekit/fencekit/lease/memlease"
)

// failingRenewals is a lease store whose renewals fail once the leader's
// connection is cut: its lease runs out.
type failingRenewals struct {
	lease.Backend
	mu  sync.Mutex
	cut bool
}

func (f *failingRenewals) Renew(ctx context.Context, g driver.Grant) error {
	f.mu.Lock()
	cut := f.cut
	f.mu.Unlock()
	if cut {
		return errors.New("the leader's connection is cut")
	}
	return f.Backend.Renew(ctx, g)
}

// pair is two processes' Managers on one lease store, each with its own
// leaseprom registry. Process a's renewals fail once storeA is cut, and a
// hears its lease events through pause first, which stands for a process
// paused as it reports them.
type pair struct {
	regA, regB *prometheus.Registry
	storeA     *failingRenewals
	mA, mB     *lease.Manager
}

func newPair(t *testing.T, pause lease.Observer) pair {
	t.Helper()
	mem := memlease.New()
	p := pair{regA: prometheus.NewRegistry(), regB: prometheus.NewRegistry(), storeA: &failingRenewals{Backend: mem}}
	obsA, err := leaseprom.New(p.regA)
	if err != nil {
		t.Fatal(err)
	}
	obsB, err := leaseprom.New(p.regB)
	if err != nil {
		t.Fatal(err)
	}
	quiet := lease.WithLogger(slog.New(slog.DiscardHandler))
	if p.mA, err = lease.NewManager(p.storeA, time.Second, lease.WithIdentity("a"), quiet, lease.WithObserver(lease.Observers{pause, obsA})); err != nil {
		t.Fatal(err)
	}
	if p.mB, err = lease.NewManager(mem, time.Second, lease.WithIdentity("b"), quiet, lease.WithObserver(obsB)); err != nil {
		t.Fatal(err)
	}
	return p
}

// pausedAtDeposed stands for a process that is paused as its term ends:
// its Deposed (and so its gauge) waits until the pause ends.
type pausedAtDeposed struct {
	lease.NopObserver
	resume chan struct{}
}

func (p pausedAtDeposed) Elected(lease.ElectionEvent) {}
func (p pausedAtDeposed) Deposed(lease.ElectionEvent) { <-p.resume }

// What the summed leader gauge does, and what the docs say about it: two
// processes' fencekit_election_leader, summed, is 2 while a leader that
// was paused as its term ended has not yet reported Deposed and the next
// leader has been elected (the store kept its contract). The docs must
// not promise a sum never above 1; they tell operators to alert when it
// stays above 1.
func TestSummedLeaderGaugeCanExceedOne(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		pause := pausedAtDeposed{resume: make(chan struct{})}
		p := newPair(t, pause)
		regA, regB, storeA, mA, mB := p.regA, p.regB, p.storeA, p.mA, p.mB
		eA, _ := lease.NewElection(mA, "scheduler")
		eB, _ := lease.NewElection(mB, "scheduler")
		sum := func() float64 {
			return gauge(t, regA, "fencekit_election_leader", "scheduler") + gauge(t, regB, "fencekit_election_leader", "scheduler")
		}
		ctx, cancel := context.WithCancel(context.Background())
		work := func(ctx context.Context, _ *lease.Lease) error { <-ctx.Done(); return nil }
		var wg sync.WaitGroup
		wg.Go(func() { _ = eA.Run(ctx, work) })
		synctest.Wait()
		wg.Go(func() { _ = eB.Run(ctx, work) })
		synctest.Wait()
		if got := gauge(t, regA, "fencekit_election_leader", "scheduler"); got != 1 || sum() != 1 {
			t.Fatalf("a leads: its gauge %v, the sum %v; want 1 and 1", got, sum())
		}

		storeA.mu.Lock()
		storeA.cut = true
		storeA.mu.Unlock()
		time.Sleep(3 * time.Second) // a's lease runs out; b is elected
		synctest.Wait()
		if got := gauge(t, regB, "fencekit_election_leader", "scheduler"); got != 1 {
			t.Fatalf("b's gauge = %v after a's lease ran out, want 1", got)
		}
		if got := sum(); got != 2 {
			t.Fatalf("the summed gauge = %v while a is paused at the end of its term; want 2", got)
		}
		close(pause.resume)
		synctest.Wait()
		if got := sum(); got != 1 {
			t.Fatalf("the summed gauge = %v once a runs again, want 1", got)
		}
		cancel()
		wg.Wait()
	})

	// The docs agree with that: the observer's doc says when the sum can
	// be above 1, and nothing promises it never is.
	src, err := os.ReadFile("../election.go")
	if err != nil {
		t.Fatal(err)
	}
	doc := regexp.MustCompile(`(?s)// ElectionObserver is.*?type ElectionObserver`).Find(src)
	text := strings.Join(strings.Fields(strings.ReplaceAll(string(doc), "//", " ")), " ")
	if strings.Contains(text, "never above 1") || !strings.Contains(text, "stays above 1") {
		t.Errorf("lease.ElectionObserver's doc does not say what the gauge does:\n%s", text)
	}
	for _, f := range []string{"leaseprom.go", "../../docs/operations.md"} {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		if s := strings.Join(strings.Fields(strings.ReplaceAll(string(b), "//", " ")), " "); !strings.Contains(s, "stays above 1") || strings.Contains(s, "never above 1") {
			t.Errorf("%s does not tell operators to alert when the sum stays above 1", f)
		}
	}
}
