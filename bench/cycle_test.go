package bench

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/bsm/redislock"
	"github.com/go-redsync/redsync/v4"
	"github.com/go-redsync/redsync/v4/redis/goredis/v9"
	"github.com/redis/go-redis/v9"

	"github.com/fencekit/fencekit/internal/redistest"
	"github.com/fencekit/fencekit/lease"
	"github.com/fencekit/fencekit/lease/redislease"
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
//   - lib=fencekit-lua: fencekit's own acquire and release scripts
//     (lease/redislease/*.lua) sent directly: what the Manager adds above
//     them is its Go-side cost, what they add above lib=raw is the price of
//     minting a fencing token and publishing the release.
//   - lib=redislock: bsm/redislock Obtain (no retry) + Release.
//   - lib=redsync: go-redsync Mutex over one goredis pool, TryLockContext +
//     UnlockContext (one Mutex reused, as a program would).
//
// rtts/op is the round trips each cycle made, counted on the client.
func BenchmarkCycle(b *testing.B) {
	ctx := context.Background()
	c := redistest.Shared(b)
	var rt RoundTrips
	c.AddHook(&rt)
	prefix := redistest.Prefix(b) + "cycle:"
	ttlMs := benchTTL.Milliseconds()

	run := func(lib string, cycle func(i int) error) {
		b.Run("lib="+lib, func(b *testing.B) {
			start, ops := rt.Load(), 0
			for b.Loop() {
				if err := cycle(ops); err != nil {
					b.Fatal(err)
				}
				ops++
			}
			b.ReportMetric(float64(rt.Load()-start)/float64(ops), "rtts/op")
		})
	}

	rawKey := prefix + "raw"
	run("raw", func(i int) error {
		v := strconv.Itoa(i)
		if ok, err := c.SetNX(ctx, rawKey, v, benchTTL).Result(); err != nil || !ok {
			return fmt.Errorf("raw: SET NX: %v, %v", ok, err)
		}
		if n, err := casDelete.Run(ctx, c, []string{rawKey}, v).Int(); err != nil || n != 1 {
			return fmt.Errorf("raw: compare-and-delete: %v, %v", n, err)
		}
		return nil
	})

	be, err := redislease.New(c, func(o *redislease.Options) { o.Prefix = prefix + "fencekit:" })
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = be.Close() })
	m, err := lease.NewManager(be, lease.Options{TTL: benchTTL})
	if err != nil {
		b.Fatal(err)
	}
	run("fencekit", func(int) error {
		l, err := m.TryAcquire(ctx, "cycle")
		if err != nil {
			return err
		}
		return l.Release(ctx)
	})

	acquireLua, releaseLua := fencekitScripts(b)
	keys := be.KeysFor("cycle-lua")
	run("fencekit-lua", func(i int) error {
		owner := strconv.Itoa(i)
		res, err := acquireLua.Run(ctx, c, []string{keys.Lease, keys.Token}, owner, ttlMs).Slice()
		if err != nil || len(res) != 2 || res[0] != int64(1) {
			return fmt.Errorf("fencekit-lua: acquire: %v, %v", res, err)
		}
		if n, err := releaseLua.Run(ctx, c, []string{keys.Lease}, owner, keys.Channel).Int(); err != nil || n != 1 {
			return fmt.Errorf("fencekit-lua: release: %v, %v", n, err)
		}
		return nil
	})

	locker := redislock.New(c)
	run("redislock", func(int) error {
		l, err := locker.Obtain(ctx, prefix+"redislock", benchTTL, nil)
		if err != nil {
			return err
		}
		return l.Release(ctx)
	})

	mu := redsync.New(goredis.NewPool(c)).NewMutex(prefix+"redsync", redsync.WithExpiry(benchTTL))
	run("redsync", func(int) error {
		if err := mu.TryLockContext(ctx); err != nil {
			return err
		}
		if ok, err := mu.UnlockContext(ctx); err != nil || !ok {
			return fmt.Errorf("redsync: unlock: %v, %v", ok, err)
		}
		return nil
	})
}

// fencekitScripts loads fencekit's acquire and release scripts from the
// library's source tree (the bench module replaces fencekit with ../), so
// that lib=fencekit-lua always runs the scripts the library runs.
func fencekitScripts(b *testing.B) (acquire, release *redis.Script) {
	b.Helper()
	read := func(name string) *redis.Script {
		src, err := os.ReadFile(filepath.Join("..", "lease", "redislease", name))
		if err != nil {
			b.Fatalf("fencekit's scripts are read from the source tree; run the benchmark from bench/: %v", err)
		}
		return redis.NewScript(string(src))
	}
	return read("acquire.lua"), read("release.lua")
}
