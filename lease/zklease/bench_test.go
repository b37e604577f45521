package zklease_test

import (
	"context"
	"errors"
	"fmt"
	mrand "math/rand/v2"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-zookeeper/zk"

	"github.com/fencekit/fencekit/internal/testkit"
	"github.com/fencekit/fencekit/internal/testkit/pairbench"
	"github.com/fencekit/fencekit/internal/testkit/zktest"
	"github.com/fencekit/fencekit/lease"
	"github.com/fencekit/fencekit/lease/driver"
	"github.com/fencekit/fencekit/lease/zklease"
)

// The benchmarks run on a three-node ensemble of their own (forceSync=no,
// as every zktest ensemble), each client on its own session.
//
//	go test -run '^$' -bench . -count 6 ./lease/zklease/ | tee zk.txt
//	benchstat -col /impl zk.txt

const benchTTL = 10 * time.Second

// BenchmarkCycle compares an uncontended TryAcquire+Release of the Manager
// over zklease with the floor sent directly through go-zookeeper, on one
// connection each to the same member (a follower) of one ensemble:
//
//   - fencekit: Manager.TryAcquire + Lease.Release (defaults).
//   - raw-token: the requests a lock with a czxid token needs, sent
//     directly: a Multi of the create and a no-op write to the parent (the
//     czxid comes back in the same round trip), the listing that proves the
//     node lowest, the delete. This is what zklease sends.
//   - raw: the plain recipe without a token: create, list, delete.
//   - backend: zklease's Acquire and Release called directly, without the
//     Manager (to tell the Manager's cost from the backend's).
//
// The four run paired: each iteration runs one cycle of each, in rotating
// order, timed on its own, so that a slow moment of this shared machine
// hits all of them. Metrics: <impl>-p50-ns, the median cycle of each, and
// x-raw-token and x-raw, the medians of fencekit's paired ratios to each
// floor (backend's: backend-x-raw-token).
func BenchmarkCycle(b *testing.B) {
	ens := zktest.Start(b, 3, zktest.Config{})
	root := zktest.Root(b)
	// Both sides talk to the same member: a follower, where most clients
	// of an ensemble are (a write goes through the leader).
	member := []string{follower(b, ens).Addr()}
	be := newBackend(b, member, zklease.WithRoot(root), zklease.WithSessionTimeout(benchTTL))
	m := testkit.NewManager(b, be, benchTTL)
	ctx := context.Background()
	conn := rawConn(b, member)
	parent := zklease.ParentPath(root, "raw")
	mustCreateParent(b, conn, root, parent)
	warmUp(b, conn, parent)

	impls := []func() error{
		func() error {
			l, err := m.TryAcquire(ctx, "cycle")
			if err != nil {
				return err
			}
			return l.Release(ctx)
		},
		func() error {
			res, err := conn.Multi(
				&zk.CreateRequest{Path: parent + "/0123456789abcdef0123456789abcdef-", Flags: zk.FlagEphemeralSequential, Acl: zk.WorldACL(zk.PermAll)},
				&zk.SetDataRequest{Path: parent, Version: -1},
			)
			if err != nil {
				return err
			}
			if kids, _, err := conn.Children(parent); err != nil || len(kids) != 1 {
				return fmt.Errorf("children %v: %w", kids, err)
			}
			return conn.Delete(res[0].String, -1)
		},
		func() error {
			p, err := conn.Create(parent+"/n-", nil, zk.FlagEphemeralSequential, zk.WorldACL(zk.PermAll))
			if err != nil {
				return err
			}
			if kids, _, err := conn.Children(parent); err != nil || len(kids) != 1 {
				return fmt.Errorf("children %v: %w", kids, err)
			}
			return conn.Delete(p, -1)
		},
		func() error {
			g, err := be.Acquire(ctx, driver.Request{Name: "cycle-backend", Owner: "bench/" + testkit.RandHex(8), TTL: benchTTL})
			if err != nil {
				return err
			}
			return be.Release(ctx, g)
		},
	}
	names := []string{"fencekit", "raw-token", "raw", "backend"}
	samples := make([][]time.Duration, len(impls))
	var ratioToken, ratioRaw, ratioBackend []float64
	n := 0
	for b.Loop() {
		cur := make([]time.Duration, len(impls))
		for k := range impls {
			i := (n + k) % len(impls)
			t0 := time.Now()
			if err := impls[i](); err != nil {
				b.Fatalf("%s: %v", names[i], err)
			}
			cur[i] = time.Since(t0)
			samples[i] = append(samples[i], cur[i])
		}
		ratioToken = append(ratioToken, float64(cur[0])/float64(cur[1]))
		ratioRaw = append(ratioRaw, float64(cur[0])/float64(cur[2]))
		ratioBackend = append(ratioBackend, float64(cur[3])/float64(cur[1]))
		n++
	}
	b.ReportMetric(0, "ns/op")
	for i, name := range names {
		b.ReportMetric(float64(pairbench.Percentile(samples[i], 50)), name+"-p50-ns")
	}
	b.ReportMetric(pairbench.Median(ratioToken), "x-raw-token")
	b.ReportMetric(pairbench.Median(ratioRaw), "x-raw")
	b.ReportMetric(pairbench.Median(ratioBackend), "backend-x-raw-token")
}

// follower returns a member that follows.
func follower(b testing.TB, ens *zktest.Ensemble) *zktest.Member {
	b.Helper()
	leader := ens.Leader(10 * time.Second)
	for _, m := range ens.Members {
		if m != leader {
			return m
		}
	}
	b.Fatal("no follower")
	return nil
}

// warmUp runs plain lock cycles for a few seconds: the servers' JIT makes a
// request several times faster after its first thousand or so, and the
// first implementation measured would otherwise pay for it.
func warmUp(b testing.TB, conn *zk.Conn, parent string) {
	b.Helper()
	for end := time.Now().Add(3 * time.Second); time.Now().Before(end); {
		p, err := conn.Create(parent+"/w-", nil, zk.FlagEphemeralSequential, zk.WorldACL(zk.PermAll))
		if err != nil {
			b.Fatal(err)
		}
		if _, _, err := conn.Children(parent); err != nil {
			b.Fatal(err)
		}
		if err := conn.Delete(p, -1); err != nil {
			b.Fatal(err)
		}
	}
}

func mustCreateParent(b testing.TB, conn *zk.Conn, root, parent string) {
	b.Helper()
	p := ""
	for _, c := range strings.Split(parent[1:], "/") {
		p += "/" + c
		if _, err := conn.Create(p, nil, 0, zk.WorldACL(zk.PermAll)); err != nil && !errors.Is(err, zk.ErrNodeExists) {
			b.Fatal(err)
		}
	}
}

// A blockingLock takes the lock, waiting as long as it must, and returns
// the function that releases it.
type blockingLock func(ctx context.Context) (unlock func(context.Context) error, err error)

// BenchmarkHandoff measures the time from a holder's call to release to the
// return of the next holder's acquire, with handoffContenders clients (one
// session each, spread over the members) contending for one lock: at each
// hand-off handoffContenders-1 of them are queued.
//
//   - fencekit: Manager.Acquire over zklease, defaults (PollInterval 1 s: a
//     hand-off in milliseconds is a watch notification, not a poll).
//   - fencekit-fifo: the same with lease.WithFIFO: the waiters are in line
//     at the store (places: nodes of the holder queue), the first is woken
//     by the deletion of the node ahead, and its grant is a listing (with
//     the ended-owner record's read pipelined), no write.
//   - raw: the recipe sent directly through go-zookeeper: create an
//     ephemeral sequential node, list, watch the predecessor (ExistsW),
//     list again when it goes; release deletes the node. One notification
//     and one listing per hand-off: the floor.
//
// The three alternate in blocks of handoffBlock hand-offs until each has
// b.N. Metrics: <impl>-p50-ns, <impl>-p99-ns, <impl>-mean-ns, and each
// fencekit variant's p50 and p99 over raw's (x-raw-p50, x-raw-p99 for
// fencekit, fifo-x-raw-p50, fifo-x-raw-p99 for fencekit-fifo). Run with a
// fixed count, e.g. -benchtime 300x.
func BenchmarkHandoff(b *testing.B) {
	ens := zktest.Start(b, 3, zktest.Config{})
	root := zktest.Root(b)
	servers := ens.Servers()
	admin := rawConn(b, servers)
	mustCreateParent(b, admin, root, zklease.ParentPath(root, "raw-handoff"))
	mustCreateParent(b, admin, root, zklease.ParentPath(root, "warm-up"))
	warmUp(b, admin, zklease.ParentPath(root, "warm-up"))

	var fk, fifo, raw []blockingLock
	managerLock := func(m *lease.Manager, name string) blockingLock {
		return func(ctx context.Context) (func(context.Context) error, error) {
			l, err := m.Acquire(ctx, name)
			if err != nil {
				return nil, err
			}
			return l.Release, nil
		}
	}
	for i := range handoffContenders {
		srv := []string{servers[i%len(servers)]}
		be := newBackend(b, srv, zklease.WithRoot(root), zklease.WithSessionTimeout(benchTTL))
		fk = append(fk, managerLock(testkit.NewManager(b, be, benchTTL), "handoff"))
		fifo = append(fifo, managerLock(testkit.NewManager(b, be, benchTTL, lease.WithFIFO()), "fifo-handoff"))
		raw = append(raw, rawLock(b, rawConn(b, srv), zklease.ParentPath(root, "raw-handoff")))
	}
	impls := []struct {
		name    string
		locks   []blockingLock
		samples []time.Duration
	}{{name: "fencekit", locks: fk}, {name: "fencekit-fifo", locks: fifo}, {name: "raw", locks: raw}}
	short := func() bool {
		for _, im := range impls {
			if len(im.samples) < b.N {
				return true
			}
		}
		return false
	}
	for round := 0; short(); round++ {
		for k := range impls {
			im := &impls[(round+k)%len(impls)]
			if want := b.N - len(im.samples); want > 0 {
				im.samples = append(im.samples, runHandoff(b, im.locks, min(want, handoffBlock))...)
			}
		}
	}
	b.ReportMetric(0, "ns/op")
	for _, im := range impls {
		pairbench.ReportLatency(b, im.name, im.samples)
	}
	rw := impls[2].samples
	b.ReportMetric(float64(pairbench.Percentile(impls[0].samples, 50))/float64(pairbench.Percentile(rw, 50)), "x-raw-p50")
	b.ReportMetric(float64(pairbench.Percentile(impls[0].samples, 99))/float64(pairbench.Percentile(rw, 99)), "x-raw-p99")
	b.ReportMetric(float64(pairbench.Percentile(impls[1].samples, 50))/float64(pairbench.Percentile(rw, 50)), "fifo-x-raw-p50")
	b.ReportMetric(float64(pairbench.Percentile(impls[1].samples, 99))/float64(pairbench.Percentile(rw, 99)), "fifo-x-raw-p99")
}

const handoffBlock = 25

const handoffContenders = 3

// rawLock is ZooKeeper's lock recipe with go-zookeeper alone.
func rawLock(b testing.TB, conn *zk.Conn, parent string) blockingLock {
	return func(ctx context.Context) (func(context.Context) error, error) {
		p, err := conn.Create(parent+"/n-", nil, zk.FlagEphemeralSequential, zk.WorldACL(zk.PermAll))
		if err != nil {
			return nil, err
		}
		me := p[strings.LastIndexByte(p, '/')+1:]
		for {
			kids, _, err := conn.Children(parent)
			if err != nil {
				return nil, err
			}
			sort.Slice(kids, func(i, j int) bool { return seqOf(kids[i]) < seqOf(kids[j]) })
			i := slices.Index(kids, me)
			if i == 0 {
				return func(context.Context) error { return conn.Delete(p, -1) }, nil
			}
			ok, _, ch, err := conn.ExistsW(parent + "/" + kids[i-1])
			if err != nil {
				return nil, err
			}
			if ok {
				select {
				case <-ch:
				case <-ctx.Done():
					_ = conn.Delete(p, -1)
					return nil, ctx.Err()
				}
			}
		}
	}
}

func seqOf(name string) int64 {
	n, _ := strconv.ParseInt(name[strings.LastIndexByte(name, '-')+1:], 10, 64)
	return n
}

// runHandoff runs n hand-offs among the contenders and returns their
// latencies; every contender has released and returned when it does. A holder keeps the
// lock 2-5 ms, notes the time, and releases; the next holder's acquire
// measures from that note. A former holder waits 0-2 ms before queueing
// again, so that the others are queued at each release.
func runHandoff(b *testing.B, locks []blockingLock, n int) []time.Duration {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	var (
		mu         sync.Mutex
		releasedAt time.Time
		samples    []time.Duration
		failure    error
	)
	done := make(chan struct{})
	var once sync.Once
	var wg sync.WaitGroup
	for i, lock := range locks {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				select {
				case <-done:
					return
				default:
				}
				unlock, err := lock(ctx)
				now := time.Now()
				if err != nil {
					mu.Lock()
					failure = fmt.Errorf("contender %d: %w", i, err)
					mu.Unlock()
					once.Do(func() { close(done) })
					return
				}
				mu.Lock()
				if !releasedAt.IsZero() {
					samples = append(samples, now.Sub(releasedAt))
					releasedAt = time.Time{}
				}
				enough := len(samples) >= n
				mu.Unlock()
				time.Sleep(2*time.Millisecond + mrand.N(3*time.Millisecond))
				mu.Lock()
				if !enough {
					releasedAt = time.Now()
				}
				mu.Unlock()
				if err := unlock(ctx); err != nil {
					mu.Lock()
					failure = fmt.Errorf("contender %d: release: %w", i, err)
					mu.Unlock()
				}
				if enough {
					once.Do(func() { close(done) })
					return
				}
				time.Sleep(mrand.N(2 * time.Millisecond))
			}
		}()
	}
	wg.Wait()
	if failure != nil {
		b.Fatal(failure)
	}
	return samples
}

// BenchmarkHandoffPaired measures one hand-off at a time, paired with the
// floor: a holder releases while one waiter, on another member, is queued.
// Each iteration runs one fencekit hand-off (Manager.TryAcquire by the
// holder, Manager.Acquire queued by the waiter, Release) and one raw
// hand-off (create, create, list, ExistsW on the holder's node, delete,
// notification, list; the waiter on a goroutine of its own), in
// alternating order, each timed from the release
// call to the waiter's grant; a third, fencekit-fifo, is the fencekit
// hand-off with a waiter whose Manager has lease.WithFIFO (queued at the
// store). Metrics: fencekit-p50-ns, fencekit-fifo-p50-ns, raw-p50-ns,
// x-raw and fifo-x-raw, the medians of the paired ratios. Without the other contenders'
// traffic of BenchmarkHandoff, this is the cost of the hand-off path
// itself.
func BenchmarkHandoffPaired(b *testing.B) {
	ens := zktest.Start(b, 3, zktest.Config{})
	root := zktest.Root(b)
	srv := ens.Servers()
	admin := rawConn(b, srv)
	mustCreateParent(b, admin, root, zklease.ParentPath(root, "warm-up"))
	warmUp(b, admin, zklease.ParentPath(root, "warm-up"))
	ctx := context.Background()
	holder := testkit.NewManager(b, newBackend(b, srv[:1], zklease.WithRoot(root), zklease.WithSessionTimeout(benchTTL)), benchTTL)
	waiterB := newBackend(b, srv[1:2], zklease.WithRoot(root), zklease.WithSessionTimeout(benchTTL))
	waiter := testkit.NewManager(b, waiterB, benchTTL)
	fifoWaiter := testkit.NewManager(b, waiterB, benchTTL, lease.WithFIFO())
	c1, c2 := rawConn(b, srv[:1]), rawConn(b, srv[1:2])
	parent := zklease.ParentPath(root, "raw-paired")
	mustCreateParent(b, admin, root, parent)
	acl := zk.WorldACL(zk.PermAll)

	handoff := func(waiter *lease.Manager, name string) (time.Duration, error) {
		l1, err := holder.TryAcquire(ctx, name)
		if err != nil {
			return 0, err
		}
		got := testkit.AcquireAsync(ctx, waiter, name)
		time.Sleep(5 * time.Millisecond) // the waiter is queued
		t0 := time.Now()
		if err := l1.Release(ctx); err != nil {
			return 0, err
		}
		r := <-got
		if r.Err != nil {
			return 0, r.Err
		}
		return r.At.Sub(t0), r.Lease.Release(ctx)
	}
	fencekit := func() (time.Duration, error) { return handoff(waiter, "paired") }
	fifo := func() (time.Duration, error) { return handoff(fifoWaiter, "fifo-paired") }
	raw := func() (time.Duration, error) {
		p1, err := c1.Create(parent+"/n-", nil, zk.FlagEphemeralSequential, acl)
		if err != nil {
			return 0, err
		}
		p2, err := c2.Create(parent+"/n-", nil, zk.FlagEphemeralSequential, acl)
		if err != nil {
			return 0, err
		}
		if _, _, err := c2.Children(parent); err != nil {
			return 0, err
		}
		ok, _, ch, err := c2.ExistsW(p1)
		if err != nil || !ok {
			return 0, fmt.Errorf("ExistsW: %v %w", ok, err)
		}
		// The waiter runs on its own, as the fencekit waiter does: it may
		// see the notification before the holder sees its delete's answer.
		got := make(chan error, 1)
		var at time.Time
		go func() {
			<-ch
			_, _, err := c2.Children(parent)
			at = time.Now()
			got <- err
		}()
		time.Sleep(5 * time.Millisecond)
		t0 := time.Now()
		if err := c1.Delete(p1, -1); err != nil {
			return 0, err
		}
		if err := <-got; err != nil {
			return 0, err
		}
		return at.Sub(t0), c2.Delete(p2, -1)
	}
	var fk, ff, rw []time.Duration
	var ratios, fifoRatios []float64
	n := 0
	for b.Loop() {
		// Rotate the order of the three (fencekit, fencekit-fifo, raw).
		impls := []func() (time.Duration, error){fencekit, fifo, raw}
		var d [3]time.Duration
		for k := range impls {
			i := (n + k) % len(impls)
			v, err := impls[i]()
			if err != nil {
				b.Fatal(err)
			}
			d[i] = v
		}
		fk, ff, rw = append(fk, d[0]), append(ff, d[1]), append(rw, d[2])
		ratios = append(ratios, float64(d[0])/float64(d[2]))
		fifoRatios = append(fifoRatios, float64(d[1])/float64(d[2]))
		n++
	}
	b.ReportMetric(0, "ns/op")
	b.ReportMetric(float64(pairbench.Percentile(fk, 50)), "fencekit-p50-ns")
	b.ReportMetric(float64(pairbench.Percentile(fk, 99)), "fencekit-p99-ns")
	b.ReportMetric(float64(pairbench.Percentile(ff, 50)), "fencekit-fifo-p50-ns")
	b.ReportMetric(float64(pairbench.Percentile(ff, 99)), "fencekit-fifo-p99-ns")
	b.ReportMetric(float64(pairbench.Percentile(rw, 50)), "raw-p50-ns")
	b.ReportMetric(float64(pairbench.Percentile(rw, 99)), "raw-p99-ns")
	b.ReportMetric(pairbench.Median(ratios), "x-raw")
	b.ReportMetric(pairbench.Median(fifoRatios), "fifo-x-raw")
}

// BenchmarkThroughput is acquire + release throughput on a 3-member
// ensemble through one follower, as bench's BenchmarkPGThroughput measures
// it on PostgreSQL: lease.Manager.Acquire + Lease.Release, workers
// goroutines on distinct names or on one, b.N cycles in all (run it with
// a fixed count: -benchtime 300x). Metrics: ops/s, p50-ns, p99-ns.
func BenchmarkThroughput(b *testing.B) {
	ens := zktest.Start(b, 3, zktest.Config{})
	member := []string{follower(b, ens).Addr()}
	be := newBackend(b, member, zklease.WithRoot(zktest.Root(b)), zklease.WithSessionTimeout(benchTTL))
	m := testkit.NewManager(b, be, benchTTL)
	ctx := context.Background()
	pairbench.ThroughputRuns(b, "lib=fencekit", true, func(name string) error {
		l, err := m.Acquire(ctx, name)
		if err != nil {
			return err
		}
		return l.Release(ctx)
	})
}
