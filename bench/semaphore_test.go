package bench

import (
	"context"
	"errors"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/fencekit/fencekit/dynamoguard/dynamotest"
	"github.com/fencekit/fencekit/internal/testkit"
	"github.com/fencekit/fencekit/internal/testkit/pairbench"
	"github.com/fencekit/fencekit/internal/testkit/testenv"
	"github.com/fencekit/fencekit/lease"
	"github.com/fencekit/fencekit/lease/dynamolease"
	"github.com/fencekit/fencekit/lease/pglease"
	"github.com/fencekit/fencekit/lease/redislease/redistest"
)

// BenchmarkSemaphoreCyclePaired is one uncontended permit cycle
// (Semaphore.TryAcquire + Lease.Release) on the shared Redis, each cycle
// paired with a mutex cycle (Manager.TryAcquire + Release of a plain lease)
// on the same Manager and client, interleaved and alternated as in
// BenchmarkCyclePaired:
//
//   - lib=mutex: the mutex cycle against itself (the noise band).
//   - lib=semaphore-1, lib=semaphore-8: a semaphore of 1 or 8 permits, all
//     free: the first slot tried is granted.
//   - lib=semaphore-8-7held: 8 permits of which 7 are held by another
//     Manager: TryAcquire tries slots in a random order until it finds the
//     free one, (8+1)/2 = 4.5 acquire requests on average.
//
// ns/op is the library's mean cycle; mutex-ratio its time over the paired
// mutex cycles'; rtts/op the round trips of the library's own cycles.
func BenchmarkSemaphoreCyclePaired(b *testing.B) {
	ctx := context.Background()
	c := redistest.Shared(b)
	rt := new(redistest.RoundTrips)
	c.AddHook(rt)
	be := redisBackend(b, c, redistest.Prefix(b)+"sem:")
	m, other := must(lease.NewManager(be, benchTTL))(b), must(lease.NewManager(be, benchTTL))(b)
	mutex := func() error {
		l, err := m.TryAcquire(ctx, "mutex")
		if err != nil {
			return err
		}
		return l.Release(ctx)
	}
	semCycle := func(name string, permits, held int) func() error {
		s, hs := must(lease.NewSemaphore(m, name, permits))(b), must(lease.NewSemaphore(other, name, permits))(b)
		for range held {
			l, err := hs.TryAcquire(ctx)
			if err != nil {
				b.Fatal(err)
			}
			b.Cleanup(func() { _ = l.Release(context.Background()) })
		}
		return func() error {
			l, err := s.TryAcquire(ctx)
			if err != nil {
				return err
			}
			return l.Release(ctx)
		}
	}
	libs := []struct {
		name  string
		cycle func() error
	}{
		{"mutex", mutex},
		{"semaphore-1", semCycle("s1", 1, 0)},
		{"semaphore-8", semCycle("s8", 8, 0)},
		{"semaphore-8-7held", semCycle("s8held", 8, 7)},
	}
	for _, lib := range libs {
		b.Run("lib="+lib.name, func(b *testing.B) {
			var libRT int64
			counted := func(int) error {
				r0 := rt.Load()
				err := lib.cycle()
				libRT += rt.Load() - r0
				return err
			}
			for range 20 { // warm up connections and script caches of both
				if err := errors.Join(lib.cycle(), mutex()); err != nil {
					b.Fatal(err)
				}
			}
			baseT, libT, n := pairbench.Alternate(b, func(int) error { return mutex() }, counted)
			pairbench.ReportAlternate(b, "mutex", baseT, libT, n)
			b.ReportMetric(float64(libRT)/float64(max(n, 1)), "rtts/op")
		})
	}
}

// fairnessContenders contend for one lease name in BenchmarkFairness.
const fairnessContenders = 8

// fairnessDuration is how long each BenchmarkFairness run contends
// (FENCE_BENCH_FAIRNESS, a Go duration; default 5 s).
func fairnessDuration(b *testing.B) time.Duration {
	if s := os.Getenv("FENCE_BENCH_FAIRNESS"); s != "" {
		d, err := time.ParseDuration(s)
		if err != nil {
			b.Fatalf("FENCE_BENCH_FAIRNESS=%q: %v", s, err)
		}
		return d
	}
	return 5 * time.Second
}

// BenchmarkFairness: 8 contenders, each with a Manager and a backend of
// its own (its own connections, as 8 processes would have), loop on one
// lease name for a fixed time: Acquire, hold it 1 ms, Release, and at once
// Acquire again. With fifo=off a release wakes every waiter (or, without
// Watcher, the next poll finds the name free) and whichever asks first
// wins: the contender that just released asks again at once. With fifo=on
// (lease.WithFIFO, on the stores that keep a line: driver.Limits.Queues)
// the waiters hold their places at the store and the oldest is granted;
// the others run as fifo=not-offered.
//
// One iteration is one whole run (use -benchtime 1x). Metrics: grants/s;
// min-share and max-share, the smallest and largest fraction of the grants
// one contender got (fair: 1/8 = 0.125 each); max-wait-ns and p99-wait-ns,
// the longest and the 99th percentile time one Acquire call waited.
func BenchmarkFairness(b *testing.B) {
	type store struct {
		name string
		// setup prepares a namespace of the store and returns a function
		// that connects a new backend to it, with connections of its own.
		setup func(b *testing.B) (connect func() lease.Backend)
		opts  []lease.Option
		// queues: the backend keeps a line (driver.Limits.Queues), so the
		// store runs with fifo=off and fifo=on.
		queues bool
	}
	redisPrefix := redistest.Prefix(b) + "fair:"
	stores := []store{
		{"redis", func(b *testing.B) func() lease.Backend {
			return func() lease.Backend { return redisBackend(b, redistest.Shared(b), redisPrefix) }
		}, nil, true},
		{"pg-table", pgFairnessStore(pglease.ModeTable), nil, true},
		{"pg-session", pgFairnessStore(pglease.ModeSession), nil, true},
		{"dynamodb-poll100ms", func(b *testing.B) func() lease.Backend {
			s := newDynamoSetup(b)
			return func() lease.Backend { return must(dynamolease.New(dynamotest.ClientVia(b, s.rt), s.leases))(b) }
		}, []lease.Option{lease.WithPollInterval(100 * time.Millisecond)}, false},
	}
	if only := os.Getenv("FENCE_BENCH_FAIRNESS_STORES"); only != "" {
		stores = slices.DeleteFunc(stores, func(s store) bool { return !slices.Contains(splitComma(only), s.name) })
	}
	type variant struct {
		st   store
		fifo string
	}
	var variants []variant
	for _, st := range stores {
		if st.queues {
			variants = append(variants, variant{st, "off"}, variant{st, "on"})
		} else {
			variants = append(variants, variant{st, "not-offered"})
		}
	}
	for _, v := range variants {
		st := v.st
		opts := st.opts
		if v.fifo == "on" {
			opts = append(slices.Clip(opts), lease.WithFIFO())
		}
		b.Run("store="+st.name+"/fifo="+v.fifo, func(b *testing.B) {
			connect := st.setup(b)
			var ms []*lease.Manager
			for range fairnessContenders {
				m := must(lease.NewManager(connect(), benchTTL, opts...))(b)
				// Warm up its connections (a JVM server's first requests
				// are slow) outside the measured runs.
				l := must(m.TryAcquire(context.Background(), "warm-up-"+st.name+"-"+strconv.Itoa(len(ms))))(b)
				if err := l.Release(context.Background()); err != nil {
					b.Fatal(err)
				}
				ms = append(ms, m)
			}
			// fifo=off and fifo=on may share a namespace (redis): names of
			// their own keep one's leftover places out of the other's line.
			fs := testkit.MeasureFairness(b, ms, "fair-"+st.name+"-"+v.fifo, fairnessDuration(b))
			fs.Report(b)
			b.ReportMetric(float64(fs.P99Wait), "p99-wait-ns")
		})
	}
}

// pgFairnessStore is BenchmarkFairness's setup of pglease in mode: a
// schema of its own, and a pool per backend (8 processes do not share
// connections; 4 each: the listener, a pinned session, and room).
func pgFairnessStore(mode pglease.Mode) func(b *testing.B) func() lease.Backend {
	return func(b *testing.B) func() lease.Backend {
		s := newPGSetup(b)
		return func() lease.Backend {
			pcfg := must(pgxpool.ParseConfig(testenv.PostgresURL()))(b)
			pcfg.ConnConfig.RuntimeParams["search_path"] = s.schema
			pcfg.MaxConns = 4
			pool := must(pgxpool.NewWithConfig(context.Background(), pcfg))(b)
			b.Cleanup(pool.Close)
			be := must(pglease.New(pool, pglease.WithMode(mode)))(b)
			b.Cleanup(func() { _ = be.Close() })
			return be
		}
	}
}

func splitComma(s string) []string {
	var out []string
	for p := range strings.SplitSeq(s, ",") {
		if p != "" {
			out = append(out, p)
		}
	}
	return out
}

// must(f())(b) is f's value, or the end of benchmark b if f failed.
func must[T any](v T, err error) func(b *testing.B) T {
	return func(b *testing.B) T {
		b.Helper()
		if err != nil {
			b.Fatal(err)
		}
		return v
	}
}
