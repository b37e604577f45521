// Command renewscale measures what it costs one process to keep many
// fencekit leases alive: it acquires N leases with a 10 s TTL through one
// lease.Manager over redislease, lets the heartbeats renew them for a fixed
// window, and reports, for that window:
//
//	renews/s       renew scripts the server ran per second (INFO commandstats:
//	               EVALSHA + EVAL calls)
//	cmds/s         every command the server ran per second
//	               (total_commands_processed, script-internal ones included)
//	rtts/tick      client round trips per renew interval (a pipeline is one)
//	cpu-%          CPU time of this process (getrusage: user + system, every
//	               thread, the Go runtime included) as a percentage of one core
//	cpu-us/renew   the same CPU time divided by the renewals
//	ctxsw/s        context switches of this process per second (getrusage:
//	               voluntary + involuntary): how often it wakes up
//	redis-cpu-%    the Redis server's own CPU time, percentage of one core
//	heap-B/lease   live heap per held lease (after a GC, before and after
//	               the acquisitions): the Manager's and the backend's state
//	lost           leases lost during the window (must be 0)
//
// once with renewals batched (the default: heartbeats due within
// Options.RenewBatchWindow of each other go out as one pipeline) and once
// without (Options.RenewBatchWindow = lease.NoBatching: one round trip per
// renewal), and with any other batch window asked for (-batching 100ms).
// The output is in the Go benchmark format, for benchstat:
//
//	go run ./bench/cmd/renewscale -count 3 | tee renew.txt
//	benchstat -col /batching renew.txt
//
// The leases are acquired in a burst (as fast as 32 goroutines can) or, with
// -acquire spread, evenly over one renew interval, as leases taken at random
// times over a long run would be; the heartbeats keep the phases the
// acquisitions gave them, so the spread decides how many batches a tick has.
//
// By default it starts its own redis-server (no persistence) on a free
// loopback port, so that the server's counters see only this program;
// -addr uses an existing server instead (its counters then include other
// clients' commands).
package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"flag"
	"fmt"
	"log"
	"net"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/fencekit/fencekit/bench"
	"github.com/fencekit/fencekit/lease"
	"github.com/fencekit/fencekit/lease/redislease"
	"github.com/fencekit/fencekit/lease/redislease/redistest"
)

type config struct {
	leases   int
	batching string // "on", "off" or a RenewBatchWindow such as "100ms"
	acquire  string // "burst" or "spread"
}

func (c config) name() string {
	return fmt.Sprintf("BenchmarkRenewAtScale/leases=%d/batching=%s/acquire=%s-%d", c.leases, c.batching, c.acquire, runtime.GOMAXPROCS(0))
}

// options returns the Manager option of c.
func (c config) options() lease.Option {
	return func(opts *lease.Options) {
		switch c.batching {
		case "on":
		case "off":
			opts.RenewBatchWindow = lease.NoBatching
		default:
			opts.RenewBatchWindow, _ = time.ParseDuration(c.batching) // checked in main
		}
	}
}

func main() {
	var (
		addr     = flag.String("addr", "", "Redis host:port; empty: start a private redis-server on a free loopback port")
		leasesF  = flag.String("leases", "1,100,10000", "comma-separated lease counts")
		batchF   = flag.String("batching", "on,off", "comma-separated: on (default options), off (RenewBatchWindow = lease.NoBatching), or a RenewBatchWindow such as 100ms")
		acquireF = flag.String("acquire", "burst", "comma-separated: burst, spread (acquisitions spread evenly over one renew interval)")
		ttl      = flag.Duration("ttl", 10*time.Second, "lease TTL")
		window   = flag.Duration("window", 0, "measurement window; 0: one renew interval")
		settle   = flag.Duration("settle", 500*time.Millisecond, "pause between the last acquisition and the window")
		count    = flag.Int("count", 1, "rounds; each round runs every configuration once, interleaved")
		parallel = flag.Int("parallel", 32, "goroutines that acquire and release the leases")
	)
	flag.Parse()
	log.SetFlags(0)
	log.SetPrefix("renewscale: ")

	var configs []config
	for _, acq := range split(*acquireF) {
		if acq != "burst" && acq != "spread" {
			log.Fatalf("-acquire: %q is neither burst nor spread", acq)
		}
		for _, n := range split(*leasesF) {
			leases, err := strconv.Atoi(n)
			if err != nil || leases < 1 {
				log.Fatalf("-leases: %q is not a positive count", n)
			}
			for _, bt := range split(*batchF) {
				if d, err := time.ParseDuration(bt); bt != "on" && bt != "off" && (err != nil || d <= 0) {
					log.Fatalf("-batching: %q is neither on, off nor a positive duration", bt)
				}
				configs = append(configs, config{leases: leases, batching: bt, acquire: acq})
			}
		}
	}

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	own := *addr == ""
	if own {
		srv, err := startRedis(ctx)
		if err != nil {
			log.Fatal(err)
		}
		defer srv.stop()
		*addr = srv.addr
	}
	admin := redis.NewClient(&redis.Options{Addr: *addr, ContextTimeoutEnabled: true})
	defer admin.Close()
	if err := admin.Ping(ctx).Err(); err != nil {
		log.Fatalf("Redis at %s: %v", *addr, err)
	}
	if v, err := admin.Info(ctx, "server").Result(); err == nil {
		for line := range strings.Lines(v) {
			if s, ok := strings.CutPrefix(strings.TrimSpace(line), "redis_version:"); ok {
				log.Printf("Redis %s at %s (own server: %v)", s, *addr, own)
			}
		}
	}

	if err := warmUp(ctx, admin, own, *ttl); err != nil {
		log.Fatalf("warm-up: %v", err)
	}

	fmt.Printf("goos: %s\ngoarch: %s\npkg: github.com/fencekit/fencekit/bench/cmd/renewscale\ncpu: %s\n", runtime.GOOS, runtime.GOARCH, cpuModel())
	for round := range *count {
		for _, c := range configs {
			if ctx.Err() != nil {
				os.Exit(1)
			}
			line, err := measure(ctx, admin, own, c, *ttl, *window, *settle, *parallel)
			if err != nil {
				log.Fatalf("%s (round %d): %v", c.name(), round+1, err)
			}
			fmt.Println(line)
		}
	}
}

// measure runs one configuration and returns its benchmark line.
//
// The window starts settle after the last acquisition and, by default, lasts
// one renew interval. After a burst of acquisitions shorter than the
// interval minus settle, every lease then renews exactly once in the
// window: its first renewal comes after the window starts and its second
// after it ends. After acquisitions spread evenly over an interval the
// heartbeats are spread evenly too, and any window sees its share.
func measure(ctx context.Context, admin *redis.Client, own bool, c config, ttl, window, settle time.Duration, parallel int) (string, error) {
	var rt redistest.RoundTrips
	client := redis.NewClient(&redis.Options{Addr: admin.Options().Addr, ContextTimeoutEnabled: true})
	defer client.Close()
	client.AddHook(&rt)
	var b [6]byte
	_, _ = rand.Read(b[:])
	prefix := "fencekit-bench:renew:" + hex.EncodeToString(b[:]) + ":"
	be, err := redislease.New(client, func(o *redislease.Options) { o.Prefix = prefix })
	if err != nil {
		return "", err
	}
	defer be.Close()
	ro := &renewObserver{}
	m, err := lease.NewManager(be, ttl, c.options(), lease.WithObserver(ro))
	if err != nil {
		return "", err
	}
	defer func() {
		if n := ro.failed.Load(); n > 0 {
			log.Printf("%s: %d renewals failed; the last error: %v", c.name(), n, ro.lastErr.Load())
		}
	}()
	interval := m.Options().RenewInterval
	if window == 0 {
		window = interval
	}

	// Acquire.
	leases := make([]*lease.Lease, c.leases)
	var spread time.Duration
	if c.acquire == "spread" {
		spread = interval
	}
	heap0 := heapInUse()
	start := time.Now()
	err = forEach(c.leases, parallel, func(i int) error {
		if spread > 0 {
			time.Sleep(time.Until(start.Add(spread * time.Duration(i) / time.Duration(c.leases))))
		}
		l, err := m.TryAcquire(ctx, fmt.Sprintf("lease-%d", i))
		leases[i] = l
		return err
	})
	defer func() {
		// Release what was acquired, and leave nothing behind.
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Minute)
		defer cancel()
		_ = forEach(len(leases), parallel, func(i int) error {
			if leases[i] != nil {
				_ = leases[i].Release(rctx)
			}
			return nil
		})
		cleanup(rctx, admin, own, prefix)
	}()
	if err != nil {
		return "", fmt.Errorf("acquire: %w", err)
	}
	log.Printf("%s: %d leases acquired in %v; measuring for %v after %v (renew interval %v, batch window %v)",
		c.name(), c.leases, time.Since(start).Round(time.Millisecond), window, settle, interval, m.Options().RenewBatchWindow)
	perLease := float64(heapInUse()-heap0) / float64(c.leases) // after a GC: what the held leases keep
	select {
	case <-time.After(settle):
	case <-ctx.Done():
		return "", ctx.Err()
	}

	// Measure.
	s0, err := bench.ReadServerStats(ctx, admin)
	if err != nil {
		return "", err
	}
	u0, err := bench.ProcessUsage()
	if err != nil {
		return "", err
	}
	rt0, t0 := rt.Load(), time.Now()
	select {
	case <-time.After(window):
	case <-ctx.Done():
		return "", ctx.Err()
	}
	u1, err := bench.ProcessUsage()
	if err != nil {
		return "", err
	}
	rt1, elapsed := rt.Load(), time.Since(t0)
	s1, err := bench.ReadServerStats(ctx, admin)
	if err != nil {
		return "", err
	}
	d := s1.Sub(s0)
	lost := 0
	for _, l := range leases {
		if l.Err() != nil {
			lost++
		}
	}

	secs := elapsed.Seconds()
	renews := d.Calls["evalsha"] + d.Calls["eval"]
	cpu := u1.CPU - u0.CPU
	ticks := float64(elapsed) / float64(interval)
	perRenew := 0.0
	if renews > 0 {
		perRenew = float64(cpu.Microseconds()) / float64(renews)
	}
	return fmt.Sprintf("%s\t1\t%.1f renews/s\t%.1f cmds/s\t%.2f rtts/tick\t%.3f cpu-%%\t%.2f cpu-us/renew\t%.1f ctxsw/s\t%.3f redis-cpu-%%\t%.0f heap-B/lease\t%d lost",
		c.name(),
		float64(renews)/secs,
		float64(d.Commands-1)/secs, // the first INFO is counted in the delta
		float64(rt1-rt0)/ticks,
		100*cpu.Seconds()/secs,
		perRenew,
		float64(u1.Switches-u0.Switches)/secs,
		100*d.CPU.Seconds()/secs,
		perLease,
		lost), nil
}

// renewObserver counts failed renewals.
type renewObserver struct {
	lease.NopObserver
	failed  atomic.Int64
	lastErr atomic.Value
}

func (o *renewObserver) Renewed(e lease.RenewedEvent) {
	if e.Err != nil {
		o.failed.Add(1)
		o.lastErr.Store(fmt.Sprint(e.Err))
	}
}

// heapInUse returns the bytes of live heap objects, after a collection.
func heapInUse() int64 {
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return int64(ms.HeapAlloc)
}

// warmUp acquires, renews and releases one lease, so that the server has
// cached fencekit's scripts before any window: otherwise the first renewal
// batch of the first configuration would pay a NOSCRIPT and a SCRIPT LOAD.
func warmUp(ctx context.Context, admin *redis.Client, own bool, ttl time.Duration) error {
	client := redis.NewClient(&redis.Options{Addr: admin.Options().Addr, ContextTimeoutEnabled: true})
	defer client.Close()
	prefix := "fencekit-bench:renew-warmup:"
	be, err := redislease.New(client, func(o *redislease.Options) { o.Prefix = prefix })
	if err != nil {
		return err
	}
	defer be.Close()
	m, err := lease.NewManager(be, ttl, lease.WithoutAutoRenew())
	if err != nil {
		return err
	}
	l, err := m.TryAcquire(ctx, "warm-up")
	if err != nil {
		return err
	}
	defer cleanup(ctx, admin, own, prefix)
	if err := l.Renew(ctx); err != nil {
		return err
	}
	return l.Release(ctx)
}

// forEach calls fn(0..n-1) on parallel goroutines and returns the first error.
func forEach(n, parallel int, fn func(i int) error) error {
	var (
		next     atomic.Int64
		wg       sync.WaitGroup
		once     sync.Once
		firstErr error
	)
	for range min(parallel, n) {
		wg.Go(func() {
			for {
				i := int(next.Add(1) - 1)
				if i >= n {
					return
				}
				if err := fn(i); err != nil {
					once.Do(func() { firstErr = err })
					next.Store(int64(n)) // stop handing out work
					return
				}
			}
		})
	}
	wg.Wait()
	return firstErr
}

// cleanup removes this configuration's keys (the token counters outlive
// the leases): FLUSHALL on a private server, SCAN + UNLINK of the prefix
// on a shared one.
func cleanup(ctx context.Context, admin *redis.Client, own bool, prefix string) {
	if own {
		if err := admin.FlushAll(ctx).Err(); err != nil {
			log.Printf("FLUSHALL: %v", err)
		}
		return
	}
	iter := admin.Scan(ctx, 0, prefix+"*", 1000).Iterator()
	var keys []string
	for iter.Next(ctx) {
		keys = append(keys, iter.Val())
		if len(keys) == 1000 {
			admin.Unlink(ctx, keys...)
			keys = keys[:0]
		}
	}
	if len(keys) > 0 {
		admin.Unlink(ctx, keys...)
	}
	if err := iter.Err(); err != nil {
		log.Printf("cleanup of %s*: %v", prefix, err)
	}
}

type server struct {
	addr string
	cmd  *exec.Cmd
	dir  string
}

// startRedis starts redis-server without persistence on a free loopback
// port and waits until it answers.
func startRedis(ctx context.Context) (*server, error) {
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		return nil, fmt.Errorf("redis-server is not installed (Debian: apt-get install redis-server), or pass -addr: %w", err)
	}
	dir, err := os.MkdirTemp("", "fencekit-renewscale-")
	if err != nil {
		return nil, err
	}
	var lastErr error
	for range 5 {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, err
		}
		port := l.Addr().(*net.TCPAddr).Port
		_ = l.Close()
		cmd := exec.Command(bin, "--port", strconv.Itoa(port), "--bind", "127.0.0.1",
			"--save", "", "--appendonly", "no", "--dir", dir, "--logfile", filepath.Join(dir, "redis.log"))
		if err := cmd.Start(); err != nil {
			return nil, err
		}
		s := &server{addr: net.JoinHostPort("127.0.0.1", strconv.Itoa(port)), cmd: cmd, dir: dir}
		c := redis.NewClient(&redis.Options{Addr: s.addr, MaxRetries: -1})
		deadline := time.Now().Add(10 * time.Second)
		for time.Now().Before(deadline) && ctx.Err() == nil {
			pctx, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
			lastErr = c.Ping(pctx).Err()
			cancel()
			if lastErr == nil {
				_ = c.Close()
				return s, nil
			}
			time.Sleep(20 * time.Millisecond)
		}
		_ = c.Close()
		s.kill()
	}
	_ = os.RemoveAll(dir)
	return nil, fmt.Errorf("redis-server did not answer on a loopback port: %w", errors.Join(lastErr, ctx.Err()))
}

func (s *server) kill() {
	_ = s.cmd.Process.Kill()
	_ = s.cmd.Wait()
}

func (s *server) stop() {
	s.kill()
	_ = os.RemoveAll(s.dir)
}

func cpuModel() string {
	b, err := os.ReadFile("/proc/cpuinfo")
	if err == nil {
		for line := range strings.Lines(string(b)) {
			if k, v, ok := strings.Cut(line, ":"); ok && strings.TrimSpace(k) == "model name" {
				return strings.TrimSpace(v)
			}
		}
	}
	return runtime.GOARCH
}

func split(s string) []string {
	var out []string
	for f := range strings.SplitSeq(s, ",") {
		if f = strings.TrimSpace(f); f != "" {
			out = append(out, f)
		}
	}
	return out
}
