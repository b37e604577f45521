package redisfailover

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/fencekit/fencekit/fence"
	"github.com/fencekit/fencekit/internal/testkit"
	"github.com/fencekit/fencekit/lease"
	"github.com/fencekit/fencekit/lease/redislease/redistest"
)

// TestSentinelPrimaryKilled runs the SIGKILL scenario (testPrimaryKilled)
// three times on a primary with one replica watched by three Sentinels
// (quorum 2, down-after-milliseconds 1000), through go-redis's failover
// client.
func TestSentinelPrimaryKilled(t *testing.T) {
	sen := redistest.StartSentinel(t, redistest.SentinelOptions{DownAfter: time.Second})
	testPrimaryKilled(t, sen.Deployment(), 3)
}

// TestClusterMasterKilled runs the SIGKILL scenario (testPrimaryKilled)
// three times on a Redis Cluster of three masters with one replica each
// (cluster-node-timeout 1 s), a different master each time.
func TestClusterMasterKilled(t *testing.T) {
	cl := redistest.StartCluster(t, redistest.ClusterOptions{Masters: 3, NodeTimeout: time.Second})
	testPrimaryKilled(t, cl.Deployment(), 3)
}

// acquireAfterFailover acquires name, which no one holds, through m, whose
// client may still have to find the new primary (each client learns of it
// on its own, after a request to the dead one fails).
func acquireAfterFailover(t *testing.T, m *lease.Manager, name string) *lease.Lease {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	l, err := m.Acquire(ctx, name)
	if err != nil {
		t.Fatalf("Acquire(%q) after the failover: %v", name, err)
	}
	return l
}

// killRun is what one SIGKILL of a primary measured.
type killRun struct {
	promoted time.Duration // from the kill to the replica serving, as the servers say
	takeover time.Duration // from the kill to another client's grant of a lost lease
	stale    int           // stale writes rejected by the guards
	wake     time.Duration // from a release after the failover to a sharded waiter's grant
}

// testPrimaryKilled kills a primary (SIGKILL) runs times, each time after
// cutting its replica off (the replica is paused, the primary drops its
// link, and grants are made that the replica never receives), and checks
// what a failover to a replica that lagged does to leases:
//
//   - a lease granted before the cut (so replicated) survives: its heartbeat
//     renews it on the new primary;
//   - a lease granted after the cut is gone from the new primary: its holder
//     learns that at its next renewal (LostTakenOver), its context is
//     cancelled, and its renewals never create the grant again;
//   - tokens granted after the failover are greater than every token
//     granted before it for the same name, including the grants the
//     replica never received (the new primary's counter is behind them);
//     the token floor, the server clock in microseconds, makes up for it;
//   - where two holders overlap (the lost grant's holder still believes it
//     holds the lease while another client is granted it), the older
//     holder's writes through sqlguard (a row and a fenced transaction on
//     PostgreSQL) and blobguard (an S3 object) are rejected as stale, and
//     the newer holder's writes stay;
//   - the takeover time: from the kill until another client is granted
//     the lost lease.
func testPrimaryKilled(t *testing.T, d redistest.Deployment, runs int) {
	stores := newFencedStores(t)
	var results []killRun
	for run := range runs {
		primaries := d.Primaries(t)
		target := primaries[run%len(primaries)]
		t.Run(fmt.Sprintf("run%d", run), func(t *testing.T) {
			results = append(results, killOnce(t, d, stores, target))
		})
		if t.Failed() {
			return
		}
	}
	var promoted, takeover, wake []time.Duration
	stale := 0
	for _, r := range results {
		promoted = append(promoted, r.promoted)
		takeover = append(takeover, r.takeover)
		wake = append(wake, r.wake)
		stale += r.stale
	}
	t.Logf("SIGKILL of a primary, %d runs: the servers agree on the promoted replica after %v; the lost lease granted to a waiting client after %v; a sharded waiter woken %v after a release on the new primary; %d stale writes rejected by the guards",
		len(results), testkit.Span(promoted), testkit.Span(takeover), testkit.Span(wake), stale)
}

func killOnce(t *testing.T, d redistest.Deployment, stores *fencedStores, target *redistest.Server) killRun {
	const ttl = 15 * time.Second
	ctx := testkit.Context(t)
	prefix := redistest.UniquePrefix()
	renews := &testkit.RenewEvents{}
	auto := func(o *lease.Options) { o.RenewInterval = 500 * time.Millisecond; o.Observer = renews }
	probe := newBackend(t, d.Client(t), prefix)
	names := namesOn(t, d, probe, target, "killed", 5)
	replicated, lostAuto, lostManual, churned, watched := names[0], names[1], names[2], names[3], names[4]
	replica := d.ReplicaOf(t, target)

	mA := testkit.NewManager(t, newBackend(t, d.Client(t), prefix), ttl, auto)
	mB := testkit.NewManager(t, newBackend(t, d.Client(t), prefix), ttl, auto)
	mD := testkit.NewManager(t, newBackend(t, d.Client(t), prefix), ttl, func(o *lease.Options) { o.DisableAutoRenew = true })
	mE := testkit.NewManager(t, newBackend(t, d.Client(t), prefix), ttl, func(o *lease.Options) { o.DisableAutoRenew = true })
	cBackend := newBackend(t, d.Client(t), prefix)
	mC := testkit.NewManager(t, cBackend, ttl, func(o *lease.Options) { o.DisableAutoRenew = true })
	// A holder and a waiter that use sharded pub/sub (SPUBLISH, SSUBSCRIBE).
	mH := testkit.NewManager(t, newShardedBackend(t, d.Client(t), prefix), ttl, auto)
	mW := testkit.NewManager(t, newShardedBackend(t, d.Client(t), prefix), ttl, func(o *lease.Options) { o.PollInterval = 20 * time.Second })

	// Every client finds its way around the cluster before the replica is
	// paused (a fresh cluster client that asked the paused replica for the
	// slot map would wait for its read timeout).
	for i, m := range []*lease.Manager{mA, mB, mC, mD, mE, mH, mW} {
		l := testkit.TryAcquire(t, m, fmt.Sprintf("warm-%d", i))
		if err := l.Release(ctx); err != nil {
			t.Fatal(err)
		}
	}
	before := make(map[string][]fence.Token) // every token granted before the kill, by name
	grant := func(m *lease.Manager, name string) *lease.Lease {
		l := testkit.TryAcquire(t, m, name)
		before[name] = append(before[name], l.Token())
		return l
	}
	a := grant(mA, replicated)
	hl := grant(mH, watched)
	wGot := make(chan *lease.Lease, 1)
	go func() {
		l, err := mW.Acquire(ctx, watched)
		if err != nil {
			t.Errorf("the waiter for %s: %v", watched, err)
		}
		wGot <- l
	}()
	time.Sleep(100 * time.Millisecond) // the waiter is refused and subscribes
	redistest.WaitReplicated(t, d, target)

	// Cut the replica off: paused, it cannot reconnect; the primary drops
	// the link, so nothing written from now on reaches the replica.
	replica.Pause(t)
	paused := true
	defer func() {
		if paused {
			replica.Resume(t)
		}
	}()
	if err := d.Admin(target).Do(ctx, "CLIENT", "KILL", "TYPE", "replica").Err(); err != nil {
		t.Fatalf("CLIENT KILL TYPE replica on %s: %v", target.Addr, err)
	}
	if info, err := d.Admin(target).Info(ctx, "replication").Result(); err != nil || !strings.Contains(info, "connected_slaves:0") {
		t.Fatalf("the primary still lists its replica after CLIENT KILL (%v): %s", err, info)
	}
	bl := grant(mB, lostAuto)
	dl := grant(mD, lostManual)
	for range 5 {
		l := grant(mE, churned)
		if err := l.Release(ctx); err != nil {
			t.Fatal(err)
		}
	}
	// The holder of the lost grant writes while its grant is good.
	res := fmt.Sprintf("job-%s-%d", strings.ReplaceAll(target.Addr, ":", "-"), time.Now().UnixNano())
	for i, err := range stores.write(ctx, res, "D", dl.Token()) {
		if err != nil {
			t.Fatalf("D's %s write with its valid token %d: %v", fencedWrites[i], dl.Token(), err)
		}
	}

	killed := target.Kill(t)
	replica.Resume(t)
	paused = false

	// Another client waits for the lost lease from the moment of the kill.
	cGot := testkit.AcquireAsync(ctx, mC, lostManual)
	promoted := d.AwaitPromoted(t, target, replica)
	newPrimary := replica
	c := <-cGot
	if c.Err != nil {
		t.Fatalf("the other client never got the lost lease: %v", c.Err)
	}
	run := killRun{promoted: promoted, takeover: c.At.Sub(killed)}
	t.Logf("killed %s: %s serving after %v; the lost lease granted to another client %v after the kill",
		target.Addr, newPrimary.Addr, promoted.Round(time.Millisecond), run.takeover.Round(time.Millisecond))

	// The lost grants are really gone: the test exercised a lagging replica.
	adm := d.Admin(newPrimary)
	for _, name := range []string{lostAuto, churned} {
		if n, err := adm.Exists(ctx, probe.KeysFor(name).Lease).Result(); err != nil || n != 0 {
			t.Fatalf("%s: the new primary has the grant made after the cut (exists=%d, %v): the replica was not cut off", name, n, err)
		}
	}
	lastChurned := slices.Max(before[churned])
	counter, err := adm.Get(ctx, probe.KeysFor(churned).Token).Uint64()
	if err != nil && !errors.Is(err, redis.Nil) {
		t.Fatal(err)
	}
	if fence.Token(counter) >= lastChurned {
		t.Fatalf("%s: the new primary's counter %d is not behind the last token %d: the replica was not cut off", churned, counter, lastChurned)
	}

	// Tokens after the failover are above every token before it, per name.
	cl := c.Lease
	after := map[string]fence.Token{lostManual: cl.Token()}
	le := acquireAfterFailover(t, mE, churned)
	after[churned] = le.Token()
	for name, tok := range after {
		if last := slices.Max(before[name]); tok <= last {
			t.Errorf("%s: token %d granted after the failover is not above %d, granted before it", name, tok, last)
		}
	}
	t.Logf("%s: the new primary's counter was %d, behind the lost grants' last token %d; the next grant got %d (the server clock)", churned, counter, lastChurned, after[churned])
	if err := le.Release(ctx); err != nil {
		t.Fatal(err)
	}

	// Two holders overlap: D still believes it holds its lease while C has
	// it. C writes; then D's writes are rejected as stale, C's stay.
	for i, err := range stores.write(ctx, res, "C", cl.Token()) {
		if err != nil {
			t.Fatalf("C's %s write with token %d: %v", fencedWrites[i], cl.Token(), err)
		}
	}
	if err := dl.Err(); err != nil {
		t.Fatalf("D's lease ended before its stale writes (%v): no overlap to show", err)
	}
	for i, err := range stores.write(ctx, res, "D", dl.Token()) {
		var se *fence.StaleError
		if !errors.Is(err, fence.ErrStaleToken) || !errors.As(err, &se) {
			t.Errorf("D's %s write with its lost token %d while C holds token %d = %v; want a stale-token error", fencedWrites[i], dl.Token(), cl.Token(), err)
			continue
		}
		run.stale++
	}
	for i, w := range stores.writer(t, ctx, res) {
		if want := fmt.Sprintf("C@%d", cl.Token()); w != want {
			t.Errorf("%s holds %s, want %s", fencedWrites[i], w, want)
		}
	}
	t.Logf("overlap: D (token %d) and C (token %d) both held %s; %d of D's %d writes rejected as stale", dl.Token(), cl.Token(), lostManual, run.stale, len(fencedWrites))

	// D learns of the loss at its first renewal that reaches the new
	// primary (its client may first have to find it: those attempts fail
	// with the store's error and leave the lease valid until its
	// deadline), and does not re-create the grant.
	var lost *lease.LostError
	for attempt := 1; ; attempt++ {
		err = dl.Renew(ctx)
		if errors.As(err, &lost) {
			if lost.Reason != lease.LostTakenOver {
				t.Errorf("D's Renew after the failover = %v, want a LostError (taken over)", err)
			}
			break
		}
		if err == nil || dl.Err() != nil || attempt == 100 {
			t.Fatalf("D's Renew after the failover, attempt %d = %v (lease: %v); want a LostError (taken over)", attempt, err, dl.Err())
		}
		time.Sleep(50 * time.Millisecond)
	}
	select {
	case <-dl.Done():
	default:
		t.Error("D's lease context not cancelled after its renewal found the loss")
	}
	if owner, _ := redistest.StoredOwner(ctx, adm, probe.KeysFor(lostManual).Lease); owner != cl.Owner() {
		t.Errorf("after D's renewal the lease names %q, want C's owner %q", owner, cl.Owner())
	}

	// B's heartbeat finds the loss by itself, and nothing re-creates it.
	select {
	case <-bl.Done():
	case <-time.After(ttl):
		t.Fatalf("B's lease was not lost within %v of the failover", ttl)
	}
	if !errors.As(bl.Err(), &lost) || lost.Reason != lease.LostTakenOver {
		t.Errorf("B's lease ended with %v, want a LostError (taken over: its renewal found no grant)", bl.Err())
	}
	time.Sleep(time.Second) // two more heartbeat intervals: none may run
	if n, err := adm.Exists(ctx, probe.KeysFor(lostAuto).Lease).Result(); err != nil || n != 0 {
		t.Errorf("B's lost grant was re-created on the new primary (exists=%d, %v)", n, err)
	}
	lb := acquireAfterFailover(t, mC, lostAuto)
	if last := slices.Max(before[lostAuto]); lb.Token() <= last {
		t.Errorf("%s: token %d after the failover is not above the lost token %d", lostAuto, lb.Token(), last)
	}

	// A's grant had reached the replica: A still holds its lease, renewed
	// on the new primary. If the new primary no longer has it (once in
	// many CI runs, after a promotion that took about 5 s, both replicated
	// grants were missing: Redis's failover, not this backend, lost them),
	// the holder must have learnt it safely; a lease lost while the new
	// primary still names its holder is this backend's fault.
	survived := func(who string, l *lease.Lease) bool {
		err := l.Err()
		if err == nil {
			return true
		}
		owner, gerr := redistest.StoredOwner(ctx, adm, probe.KeysFor(l.Name()).Lease)
		if owner == l.Owner() {
			t.Errorf("%s's replicated lease ended across the failover, though the new primary still names it: %v", who, err)
			return false
		}
		info, _ := adm.Info(ctx, "replication").Result()
		t.Logf("%s's replicated grant of %s is not on the new primary %s (it names %q, %v): the failover lost it; %s learnt it: %v\n%s",
			who, l.Name(), newPrimary.Addr, owner, gerr, who, err, info)
		var lost *lease.LostError
		if !errors.As(err, &lost) {
			t.Errorf("%s's lease ended with %v, want a LostError", who, err)
		}
		if rerr := l.Release(ctx); !errors.Is(rerr, lease.ErrLost) {
			t.Errorf("Release of %s's lost lease = %v, want ErrLost", who, rerr)
		}
		return false
	}
	aHeld := survived("A", a)
	if aHeld && !renews.SucceededSince(replicated, killed.Add(promoted)) {
		t.Errorf("A's lease was not renewed on the new primary")
	}

	// The waiter's subscription died with the primary; its hub subscribed
	// again on the new one, so the release wakes it at once (the poll
	// interval is 20 s).
	hHeld := survived("H", hl)
	released := time.Now()
	if !hHeld {
		// H's grant is gone: the waiter may take the lease when it next
		// tries (after its resubscription or its poll).
	} else if err := hl.Release(ctx); err != nil {
		t.Errorf("Release of %s after the failover: %v", watched, err)
	}
	select {
	case wl := <-wGot:
		if wl != nil && !hHeld {
			_ = wl.Release(ctx)
		} else if wl != nil {
			run.wake = time.Since(released)
			t.Logf("the waiter on %s (sharded pub/sub) was woken %v after the release on the new primary", watched, run.wake.Round(10*time.Microsecond))
			if err := wl.Release(ctx); err != nil {
				t.Errorf("Release: %v", err)
			}
		}
	case <-time.After(5 * time.Second):
		if hHeld {
			t.Errorf("the waiter on %s was not woken within 5 s of the release after the failover (poll interval 20 s)", watched)
		}
		<-wGot
	}

	kept := []*lease.Lease{cl, lb}
	if aHeld {
		kept = append(kept, a)
	}
	for _, l := range kept {
		if err := l.Release(ctx); err != nil {
			t.Errorf("Release of %s: %v", l.Name(), err)
		}
	}
	_ = dl.Release(ctx)
	_ = bl.Release(ctx)

	target.Relaunch(t) // it rejoins as a replica of the new primary
	d.AwaitHealthy(t)
	return run
}
