//go:build scale

package redislease_test

import (
	"context"
	"os"
	"sort"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fencekit/fencekit/internal/testkit"
	"github.com/fencekit/fencekit/lease"
	"github.com/fencekit/fencekit/lease/redislease/redistest"
)

// TestDeadlinesHoldAtScale: one Manager holds 10,000 leases on a Redis
// server of its own, heartbeats on (batched, the default), and the server
// is frozen with SIGSTOP. Every lease must then be reported lost by its
// local deadline, never after last send + TTL (when the store may grant the
// name to another holder): its context must be cancelled before that
// instant, as seen by a goroutine waiting on Done, and Err must never
// return nil at or past the local deadline.
//
// It runs only with the build tag "scale": scripts/test.sh runs it on its
// own after everything else, without the race detector (which makes each
// cancel several times slower than any program runs), so that no other
// test loads the machine
// meanwhile (a 2-core machine shared with etcd and ZooKeeper clusters
// starves any process of CPU for longer than a safety margin). The safety
// margin is 150 ms rather than the default (52 ms for this TTL) for the same
// reason; SCALE_TTL and SCALE_MARGIN (a duration, or "default") change the
// scenario for measurements.
func TestDeadlinesHoldAtScale(t *testing.T) {
	const leases = 10000
	ttl := 5 * time.Second
	if s := os.Getenv("SCALE_TTL"); s != "" {
		ttl, _ = time.ParseDuration(s)
	}
	srv := redistest.Start(t)
	c := srv.Client()
	b := newBackend(t, c, "scale:")
	lostAt := make([]atomic.Int64, leases) // when the Observer heard of each loss (ns on the test's clock)
	epoch := time.Now()
	opts := lease.Options{TTL: ttl, Observer: lostClock{at: lostAt, epoch: epoch}, SafetyMargin: 150 * time.Millisecond}
	switch s := os.Getenv("SCALE_MARGIN"); s {
	case "":
	case "default":
		opts.SafetyMargin = 0
	default:
		opts.SafetyMargin, _ = time.ParseDuration(s)
	}
	m := newManager(t, b, opts)
	margin := m.Options().SafetyMargin

	ls := make([]*lease.Lease, leases)
	var next atomic.Int64
	var wg sync.WaitGroup
	acquireErr := make(chan error, 1)
	for range 32 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := next.Add(1) - 1
				if i >= leases {
					return
				}
				l, err := m.TryAcquire(testkit.Context(t), strconv.FormatInt(i, 10))
				if err != nil {
					select {
					case acquireErr <- err:
					default:
					}
					return
				}
				ls[i] = l
			}
		}()
	}
	wg.Wait()
	select {
	case err := <-acquireErr:
		t.Fatalf("TryAcquire: %v", err)
	default:
	}

	// Let a round of heartbeats go out, then freeze the store.
	time.Sleep(m.Options().RenewInterval + 200*time.Millisecond)
	srv.Pause(t)
	frozen := time.Now()

	// A canary per lease: a bare timer set for the lease's local deadline,
	// which records when the runtime ran it. On a loaded machine the
	// runtime runs every timer late, the Manager's as well as these; the
	// Manager is at fault only when its cancel comes later than the
	// canary of the same deadline by more than the slack below.
	canary := make([]atomic.Int64, leases)
	for i, l := range ls {
		time.AfterFunc(time.Until(l.Deadline()), func() { canary[i].Store(int64(time.Since(epoch))) })
	}

	// Waiters record when they saw each context end: 64 goroutines, each
	// waiting on its share of the leases in deadline order (10,000
	// goroutines would measure the Go scheduler, and under the race
	// detector make every channel operation slow). A context found already
	// done is dated by its Observer event, sent just before the cancel.
	cancelled := make([]time.Time, leases)
	order := make([]int, leases)
	for i := range order {
		order[i] = i
	}
	sort.Slice(order, func(a, b int) bool { return ls[order[a]].Deadline().Before(ls[order[b]].Deadline()) })
	const waitersN = 64
	var waiters sync.WaitGroup
	for w := range waitersN {
		waiters.Add(1)
		go func() {
			defer waiters.Done()
			for k := w; k < leases; k += waitersN {
				i := order[k]
				select {
				case <-ls[i].Done():
					cancelled[i] = epoch.Add(time.Duration(lostAt[i].Load()))
				default:
					<-ls[i].Done()
					cancelled[i] = time.Now()
				}
			}
		}()
	}

	// Meanwhile, Err is checked against the clock: never nil past the
	// deadline.
	var errNilLate atomic.Int64
	var worstErrNil atomic.Int64
	stop := make(chan struct{})
	var checker sync.WaitGroup
	checker.Add(1)
	go func() {
		defer checker.Done()
		for {
			for _, l := range ls {
				// The clock read before Err, the deadline after it (a
				// renewal answered in between can only move it later):
				// a nil answer then means Err was called at or past the
				// deadline it had.
				now := time.Now()
				err := l.Err()
				if dl := l.Deadline(); err == nil && !now.Before(dl) {
					errNilLate.Add(1)
					if late := int64(now.Sub(dl)); late > worstErrNil.Load() {
						worstErrNil.Store(late)
					}
				}
			}
			select {
			case <-stop:
				return
			default:
			}
		}
	}()
	waitDone := make(chan struct{})
	go func() { waiters.Wait(); close(waitDone) }()
	select {
	case <-waitDone:
	case <-time.After(2*ttl + 10*time.Second):
		t.Fatal("not every lease was lost within two TTLs of freezing the store")
	}
	close(stop)
	checker.Wait()

	// A lease cancelled at or after last send + TTL (its store expiry) is
	// the Manager's fault when the Manager acted (its Observer event, sent
	// just before the cancel) more than half the safety margin after the
	// canary: later than the runtime ran a bare timer of the same
	// deadline. Past the store expiry but within that slack of the canary,
	// the machine starved every goroutine alike: counted and shown, not
	// failed.
	slack := margin / 2
	var late, starved int
	var lateness, canaryLate []time.Duration
	var worstPastTTL, worstPastCanary time.Duration
	for i, l := range ls {
		dl := l.Deadline() // frozen at the loss
		storeExpiry := dl.Add(margin)
		fired := epoch.Add(time.Duration(canary[i].Load()))
		// A large group of deadlines is served early by up to half the
		// safety margin (lease/sched.go); never more.
		if cancelled[i].Before(dl.Add(-margin / 2)) {
			t.Errorf("lease %d cancelled %v before its local deadline", i, dl.Sub(cancelled[i]))
		}
		acted := epoch.Add(time.Duration(lostAt[i].Load()))
		if !cancelled[i].Before(storeExpiry) {
			if acted.Sub(fired) > slack {
				late++
				worstPastTTL = max(worstPastTTL, cancelled[i].Sub(storeExpiry))
				worstPastCanary = max(worstPastCanary, acted.Sub(fired))
			} else {
				starved++
			}
		}
		lateness = append(lateness, cancelled[i].Sub(dl))
		canaryLate = append(canaryLate, fired.Sub(dl))
	}
	sort.Slice(lateness, func(i, j int) bool { return lateness[i] < lateness[j] })
	sort.Slice(canaryLate, func(i, j int) bool { return canaryLate[i] < canaryLate[j] })
	t.Logf("%d leases, TTL %v, safety margin %v; store frozen at +0; all lost by +%v; waiter saw the cancel after the local deadline: p50 %v, p99 %v, max %v; a bare timer at the same deadline ran late by p50 %v, p99 %v, max %v",
		leases, ttl, margin, time.Since(frozen).Round(time.Millisecond), lateness[leases/2], lateness[leases*99/100], lateness[leases-1],
		canaryLate[leases/2], canaryLate[leases*99/100], canaryLate[leases-1])
	if starved > 0 {
		t.Logf("%d leases were cancelled at or after last send + TTL, the Manager acting within %v of a bare timer of the same deadline (the machine starved every goroutine)", starved, slack)
	}
	if late > 0 {
		t.Errorf("%d of %d leases were cancelled at or after last send + TTL, the Manager acting more than %v after a bare timer of the same deadline (worst %v past the TTL, %v past the timer)",
			late, leases, slack, worstPastTTL, worstPastCanary)
	}
	if n := errNilLate.Load(); n > 0 {
		t.Errorf("Err() returned nil %d times at or past the local deadline (worst %v past it)", n, time.Duration(worstErrNil.Load()))
	}
	srv.Resume(t)
	for _, l := range ls {
		_ = l.Release(context.Background()) // lost: frees the keys, reports the loss
	}
}

// lostClock records when each lease (named by its index) was reported lost.
type lostClock struct {
	lease.NopObserver
	at    []atomic.Int64
	epoch time.Time
}

func (o lostClock) Lost(e lease.LostEvent) {
	i, _ := strconv.Atoi(e.Name)
	o.at[i].Store(int64(time.Since(o.epoch)))
}
