package integration

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fencekit/fencekit/internal/testkit"
	"github.com/fencekit/fencekit/lease"
)

// The end of a lease (Release and Resign), on a real Redis with the
// releasing holder's replies held back by a proxy: the next holder is
// granted the moment Redis frees the name, while the release's reply is
// still on its way back. The holder must not read its lease valid (nor
// its work's context live) after that grant.

// validity records, on this process's monotonic clock, the last moment a
// holder read its lease valid: the time taken *before* a read that said
// valid, so that the recorded window is never shorter than the real one.
type validity struct {
	last   atomic.Int64 // nanoseconds since origin
	origin time.Time
}

// watch polls valid until it reports false, then returns.
func (v *validity) watch(valid func() bool) {
	for {
		before := time.Since(v.origin)
		if !valid() {
			return
		}
		v.last.Store(int64(before))
		time.Sleep(100 * time.Microsecond)
	}
}

func (v *validity) lastValid() time.Time { return v.origin.Add(time.Duration(v.last.Load())) }

func TestReleaseWithADelayedReplyNeverOverlapsTheNextHolder(t *testing.T) {
	const (
		ttl     = 3 * time.Second
		latency = 300 * time.Millisecond
		rounds  = 3
	)
	d := newDelayedRedis(t)
	mA, _ := d.manager(d.slow, ttl)
	mB, _ := d.manager(d.direct, ttl)
	d.warmUp(mA)
	d.delay(latency)
	for round := range rounds {
		name := "release-overlap-" + string(rune('a'+round))
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		a, err := mA.Acquire(ctx, name)
		if err != nil {
			t.Fatalf("round %d: A: %v", round, err)
		}
		v := &validity{origin: time.Now()}
		watched := make(chan struct{})
		go func() {
			defer close(watched)
			v.watch(func() bool { return a.Err() == nil && a.Context().Err() == nil })
		}()

		bGot := testkit.AcquireAsync(ctx, mB, name)
		waitUntil(t, 5*time.Second, "B waits on A's lease", func() bool {
			h, err := mB.Holder(ctx, name)
			return err == nil && h.Owner == a.Owner()
		})
		time.Sleep(20 * time.Millisecond) // B's Acquire is blocked (watching) by now, most likely; either way the check holds

		releaseStart := time.Now()
		if err := a.Release(ctx); err != nil {
			t.Fatalf("round %d: A's release: %v", round, err)
		}
		<-watched
		b := <-bGot
		if b.Err != nil {
			t.Fatalf("round %d: B: %v", round, b.Err)
		}
		if last := v.lastValid(); !last.Before(b.At) {
			t.Errorf("round %d: A read its lease valid %v after B's Acquire returned (B granted %v after A's Release began)",
				round, last.Sub(b.At), b.At.Sub(releaseStart))
		}
		if b.Lease.Token() <= a.Token() {
			t.Errorf("round %d: B's token %d <= A's %d", round, b.Lease.Token(), a.Token())
		}
		if err := b.Lease.Release(ctx); err != nil {
			t.Fatalf("round %d: B's release: %v", round, err)
		}
	}
}

func TestResignWithADelayedReplyNeverGivesTwoLeaders(t *testing.T) {
	const (
		ttl     = 3 * time.Second
		latency = 300 * time.Millisecond
	)
	d := newDelayedRedis(t)
	mA, _ := d.manager(d.slow, ttl)
	mB, _ := d.manager(d.direct, ttl)
	d.warmUp(mA)
	d.delay(latency)
	const name = "resign-overlap"
	eA, err := lease.NewElection(mA, name, lease.WithBackoff(time.Minute, time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	eB, err := lease.NewElection(mB, name, lease.WithBackoff(time.Minute, time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	v := &validity{origin: time.Now()}
	var wg sync.WaitGroup
	aLeads := make(chan struct{})
	wg.Add(1)
	go func() {
		defer wg.Done()
		_ = eA.Run(ctx, func(work context.Context, l *lease.Lease) error {
			close(aLeads)
			v.watch(func() bool { return work.Err() == nil })
			return nil
		})
	}()
	<-aLeads
	bLeads := make(chan time.Time, 1)
	wg.Add(1)
	go func() {
		defer wg.Done()
		_ = eB.Run(ctx, func(work context.Context, l *lease.Lease) error {
			bLeads <- time.Now()
			<-work.Done()
			return nil
		})
	}()
	waitUntil(t, 5*time.Second, "A leads", func() bool { return eA.Lease() != nil })
	time.Sleep(50 * time.Millisecond) // B campaigns
	if err := eA.Resign(ctx); err != nil {
		t.Fatalf("Resign: %v", err)
	}
	var bAt time.Time
	select {
	case bAt = <-bLeads:
	case <-ctx.Done():
		t.Fatal("B never led")
	}
	if last := v.lastValid(); !last.Before(bAt) {
		t.Errorf("A's leader work read its context live %v after B began to lead", last.Sub(bAt))
	}
	cancel()
	wg.Wait()
}

// waitUntil polls cond every few milliseconds until it holds, or fails
// the test after limit.
func waitUntil(t *testing.T, limit time.Duration, what string, cond func() bool) {
	t.Helper()
	end := time.Now().Add(limit)
	for !cond() {
		if time.Now().After(end) {
			t.Fatalf("timed out after %v waiting until %s", limit, what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}
