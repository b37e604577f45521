package bench

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/bsm/redislock"
	"github.com/go-redsync/redsync/v4"
	"github.com/go-redsync/redsync/v4/redis/goredis/v9"
	"github.com/redis/go-redis/v9"

	"github.com/fencekit/fencekit/internal/testkit/pairbench"
	"github.com/fencekit/fencekit/lease"
	"github.com/fencekit/fencekit/lease/driver"
	"github.com/fencekit/fencekit/lease/redislease/redistest"
)

// benchTTL is the lease TTL of every benchmark, for every library.
const benchTTL = 10 * time.Second

// casDelete is the raw floor's release: delete the key only if it still
// holds our value, in one round trip.
var casDelete = redis.NewScript(`if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end return 0`)

// BenchmarkCycle is one uncontended acquire+release of a lock with a 10 s
// TTL, each library on the same go-redis client (one connection pool) of
// the same Redis, in one run:
//
//   - lib=raw: the floor, SET key value NX PX 10000 and a compare-and-delete
//     script (EVALSHA): the two round trips any safe cycle needs.
//   - lib=fencekit: lease.Manager.TryAcquire + Lease.Release (default
//     options: auto-renewal on) over redislease.
//   - lib=fencekit-backend: redislease's Acquire and Release called
//     directly, without the Manager: the same scripts with the keys and
//     arguments the library sends. What the Manager adds above it is its
//     Go-side cost; what it adds above lib=raw is the price of minting a
//     fencing token, remembering ended owners and publishing the release.
//     (It replaced lib=fencekit-lua, which sent the scripts by hand and
//     broke when they gained a key.)
//   - lib=fencekit-timer: lib=fencekit in a process that has another timer
//     due within 500 ms, as most servers have (HTTP timeouts, pool reapers,
//     metrics tickers). A diagnostic: each fencekit cycle creates timers
//     (the lease's deadline and heartbeat, the release's timeout); in an
//     otherwise timer-less process each one is the earliest and wakes the
//     Go runtime's network poller (compare ctxsw/op).
//   - lib=redislock: bsm/redislock Obtain (no retry) + Release.
//   - lib=redsync: go-redsync Mutex over one goredis pool, TryLockContext +
//     UnlockContext (one Mutex reused, as a program would).
//
// rtts/op is the round trips each cycle made, counted on the client;
// cpu-ns/op the CPU time (user + system, all threads, GC included) this
// process spent per cycle: the client's own cost, which on a machine with
// few cores also delays the Redis server that shares them; ctxsw/op the
// context switches of this process per cycle (getrusage), each a trip
// through the kernel's scheduler, and on a virtual machine often a wake-up
// of an idle virtual CPU.
//
// With FENCE_BENCH_OWN_REDIS=1 (the Redis at FENCE_REDIS_URL serves this
// benchmark alone; scripts/bench.sh starts one), it also reports from the
// server's INFO commandstats: redis-cmds/op, the commands the server ran
// per cycle, those called by scripts included; and redis-script-ns/op, the
// time it spent executing scripts (EVALSHA, EVAL) per cycle. The plain SET
// NX of lib=raw and lib=redsync is not in the latter (about 0.5 µs).
func BenchmarkCycle(b *testing.B) {
	for _, lib := range cycleLibs(b) {
		b.Run("lib="+lib.name, func(b *testing.B) {
			if lib.otherTimer {
				defer keepTimerPending()()
			}
			start, ops := lib.rt.Load(), 0
			var srv0 ServerStats
			if ownRedis {
				srv0 = serverStats(b, lib.c)
			}
			u0 := processUsage(b)
			for b.Loop() {
				if err := lib.cycle(ops); err != nil {
					b.Fatal(err)
				}
				ops++
			}
			u1 := processUsage(b)
			b.ReportMetric(float64((u1.CPU-u0.CPU).Nanoseconds())/float64(ops), "cpu-ns/op")
			b.ReportMetric(float64(u1.Switches-u0.Switches)/float64(ops), "ctxsw/op")
			b.ReportMetric(float64(lib.rt.Load()-start)/float64(ops), "rtts/op")
			if ownRedis {
				d := serverStats(b, lib.c).Sub(srv0)
				// Less the INFO that read srv0, counted in the delta.
				b.ReportMetric(float64(d.Commands-1)/float64(ops), "redis-cmds/op")
				b.ReportMetric(float64(1000*(d.Usec["evalsha"]+d.Usec["eval"]))/float64(ops), "redis-script-ns/op")
			}
		})
	}
}

// BenchmarkCyclePaired runs the cycles of BenchmarkCycle again, each one
// interleaved with the raw floor operation by operation (lib, raw, raw, lib,
// lib, raw, ...), each timed on its own. On a shared machine the latency of
// a loopback round trip drifts by a factor of two from one second to the
// next; a ratio of two measurements taken microseconds apart does not.
//
// ns/op is the library's own mean cycle time; raw-ratio is that time
// divided by the interleaved raw cycles' mean (lib=raw measures the floor
// against itself: it should read 1.00); over-raw-ns/op is the difference,
// the time the library adds to the floor per cycle. Run it without
// -benchmem: the allocations would be the sum of both.
func BenchmarkCyclePaired(b *testing.B) {
	libs := cycleLibs(b)
	raw := libs[0].cycle
	for _, lib := range libs {
		b.Run("lib="+lib.name, func(b *testing.B) {
			if lib.otherTimer {
				defer keepTimerPending()()
			}
			rawT, libT, n := pairbench.Alternate(b, raw, lib.cycle)
			pairbench.ReportAlternate(b, "raw", rawT, libT, n)
		})
	}
}

type cycleLib struct {
	name  string
	cycle func(i int) error // one acquire+release; i differs on every call
	rt    *redistest.RoundTrips
	c     *redis.Client
	// otherTimer: run with keepTimerPending.
	otherTimer bool
}

// keepTimerPending keeps a timer due within 500 ms pending in the process
// until the returned function is called.
func keepTimerPending() (stop func()) {
	const every = 500 * time.Millisecond
	var (
		mu      sync.Mutex
		stopped bool
		t       *time.Timer
	)
	mu.Lock()
	defer mu.Unlock()
	t = time.AfterFunc(every, func() {
		mu.Lock()
		defer mu.Unlock()
		if !stopped {
			t.Reset(every)
		}
	})
	return func() {
		mu.Lock()
		defer mu.Unlock()
		stopped = true
		t.Stop()
	}
}

// ownRedis is set when the benchmarks' Redis serves them alone, so that the
// server's counters measure them.
var ownRedis = os.Getenv("FENCE_BENCH_OWN_REDIS") == "1"

func serverStats(b *testing.B, c *redis.Client) ServerStats {
	b.Helper()
	st, err := ReadServerStats(context.Background(), c)
	if err != nil {
		b.Fatal(err)
	}
	return st
}

// cycleLibs returns the cycle of each library, raw first, all on one new
// client of the shared Redis whose round trips rt counts.
func cycleLibs(b *testing.B) []cycleLib {
	ctx := context.Background()
	c := redistest.Shared(b)
	rt := new(redistest.RoundTrips)
	c.AddHook(rt)
	prefix := redistest.Prefix(b) + "cycle:"
	var libs []cycleLib
	add := func(name string, cycle func(i int) error) {
		libs = append(libs, cycleLib{name: name, cycle: cycle, rt: rt, c: c})
	}

	rawKey := prefix + "raw"
	add("raw", func(i int) error {
		v := strconv.Itoa(i)
		if ok, err := c.SetNX(ctx, rawKey, v, benchTTL).Result(); err != nil || !ok {
			return fmt.Errorf("raw: SET NX: %v, %v", ok, err)
		}
		if n, err := casDelete.Run(ctx, c, []string{rawKey}, v).Int(); err != nil || n != 1 {
			return fmt.Errorf("raw: compare-and-delete: %v, %v", n, err)
		}
		return nil
	})

	be := redisBackend(b, c, prefix+"fencekit:")
	m, err := lease.NewManager(be, benchTTL)
	if err != nil {
		b.Fatal(err)
	}
	fencekitCycle := func(int) error {
		l, err := m.TryAcquire(ctx, "cycle")
		if err != nil {
			return err
		}
		return l.Release(ctx)
	}
	add("fencekit", fencekitCycle)

	var owner atomic.Uint64
	add("fencekit-backend", func(int) error {
		// The backend's own requests (its scripts, with the keys and
		// arguments the library sends), without the Manager around them.
		req := driver.Request{Name: "cycle-backend", Owner: "bench/" + strconv.FormatUint(owner.Add(1), 10), TTL: benchTTL}
		g, err := be.Acquire(ctx, req)
		if err != nil {
			return fmt.Errorf("fencekit-backend: acquire: %w", err)
		}
		if err := be.Release(ctx, g); err != nil {
			return fmt.Errorf("fencekit-backend: release: %w", err)
		}
		return nil
	})

	add("fencekit-timer", fencekitCycle)
	libs[len(libs)-1].otherTimer = true

	locker := redislock.New(c)
	add("redislock", func(int) error {
		l, err := locker.Obtain(ctx, prefix+"redislock", benchTTL, nil)
		if err != nil {
			return err
		}
		return l.Release(ctx)
	})

	mu := redsync.New(goredis.NewPool(c)).NewMutex(prefix+"redsync", redsync.WithExpiry(benchTTL))
	add("redsync", func(int) error {
		if err := mu.TryLockContext(ctx); err != nil {
			return err
		}
		if ok, err := mu.UnlockContext(ctx); err != nil || !ok {
			return fmt.Errorf("redsync: unlock: %v, %v", ok, err)
		}
		return nil
	})
	return libs
}

func processUsage(b *testing.B) Usage {
	b.Helper()
	u, err := ProcessUsage()
	if err != nil {
		b.Fatal(err)
	}
	return u
}
