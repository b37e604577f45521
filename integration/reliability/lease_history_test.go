package reliability

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/fencekit/fencekit/internal/rig/toxi"
	"github.com/fencekit/fencekit/internal/testkit/testenv"
	"github.com/fencekit/fencekit/lease"
	"github.com/fencekit/fencekit/lease/driver"
	"github.com/fencekit/fencekit/lease/etcdlease"
	"github.com/fencekit/fencekit/lease/leasetest"
	"github.com/fencekit/fencekit/lease/pglease"
	"github.com/fencekit/fencekit/lease/redislease"
	"github.com/fencekit/fencekit/lease/redislease/redistest"
	"github.com/fencekit/fencekit/lease/zklease"
)

// The lease history check: on each lease backend, several holders, each
// with its own Backend behind its own fault proxy and its own
// lease.Manager, contend for a few names while a stream of faults hits the
// holders that hold or are releasing. Each grant's
// validity window is recorded on the test process's monotonic clock, from
// Acquire's return to the start of the last reading of Err that returned nil,
// counting the readings taken while Release runs; leasetest.CheckWindows then
// requires that no two windows of a name overlap and that tokens grow in
// window order. Only that safety property and a modest floor of grants are
// asserted, never a timing.
//
// RELIABILITY_LEASE_SECONDS sets each store's run (default 12 s);
// RELIABILITY_SEED the seed of the holders' and the faults' choices (the
// timings are the machine's, so a run is not replayed exactly).

// leaseRig describes one store's run.
type leaseRig struct {
	store   string
	ttl     time.Duration
	holders int
	names   []string
	// upstream is the store's address (host:port), which each holder's
	// proxy forwards to.
	upstream string
	// backend makes holder i's Backend, connected through addr (its
	// proxy's host:port), and registers its closing with t.Cleanup.
	backend func(t *testing.T, i int, addr string) lease.Backend
	// storeFault, when set, is an extra fault the store offers, aimed at
	// holder i (for PostgreSQL: its server sessions terminated); it
	// returns the fault's name, or "" if it did nothing.
	storeFault func(ctx context.Context, i int) string
	// wrap, when set, wraps each holder's Backend (a planted bug).
	wrap func(lease.Backend) lease.Backend
	// work bounds how long a holder keeps a grant before releasing it.
	workMin, workMax time.Duration
	// blackholeMax is the longest blackhole, in TTLs.
	blackholeMax float64
	// longBlackholes aims mostly blackholes of 1-1.4 TTL at holders (the
	// planted-bug test: the fault that shows a deadline too long).
	longBlackholes bool
	// run is how long holders contend; stopOnOverlap ends it at the first
	// overlap found (the planted-bug test).
	run           time.Duration
	stopOnOverlap bool
}

// leaseRunResult is what one run found.
type leaseRunResult struct {
	check   leasetest.WindowCheck
	grants  int
	faults  *faultCounter
	counts  map[string]int
	elapsed time.Duration
}

// holder phases, as the fault stream sees them.
const (
	phaseIdle int32 = iota
	phaseHolding
	phaseReleasing
)

type leaseHolder struct {
	i     int
	proxy *toxi.Proxy
	m     *lease.Manager
	phase atomic.Int32
	busy  atomic.Bool // a fault is in force on the proxy
}

// runLeaseHistory runs rig and returns what it found; it fails the test only
// when the rig cannot be set up.
func runLeaseHistory(t *testing.T, rig leaseRig) leaseRunResult {
	t.Helper()
	seed := seedFor(t)
	discard := slog.New(slog.DiscardHandler)
	hs := make([]*leaseHolder, rig.holders)
	for i := range hs {
		p := toxi.Start(t, rig.upstream)
		b := rig.backend(t, i, p.Addr)
		if rig.wrap != nil {
			b = rig.wrap(b)
		}
		m, err := lease.NewManager(b, rig.ttl,
			lease.WithIdentity(fmt.Sprintf("h%d", i)),
			lease.WithPollInterval(max(rig.ttl/5, 20*time.Millisecond)),
			lease.WithReleaseTimeout(2*rig.ttl+500*time.Millisecond),
			lease.WithLogger(discard))
		if err != nil {
			t.Fatalf("%s: NewManager: %v", rig.store, err)
		}
		hs[i] = &leaseHolder{i: i, proxy: p, m: m}
	}

	var (
		epoch   = time.Now()
		faults  = &faultCounter{}
		mu      sync.Mutex
		windows []leasetest.Window
		counts  = map[string]int{}
		grants  atomic.Int64
		wg      sync.WaitGroup // holders, fault stream, faults in force
	)
	count := func(k string) { mu.Lock(); counts[k]++; mu.Unlock() }
	ctx, stop := context.WithTimeout(context.Background(), rig.run)
	defer stop()

	// fault puts one fault on holder h's proxy for d, in the background,
	// and counts it as name; it does nothing when a fault is already in
	// force on that proxy. One toxic at a time per proxy: toxiproxy v2.5.0
	// loses track of a link's toxics when a timeout toxic is removed from a
	// link that it closed while other toxics are in its chain, and then
	// panics (index out of range in ToxicLink.AddToxic).
	fault := func(h *leaseHolder, name, kind, stream, attrs string, d time.Duration) {
		if !h.busy.CompareAndSwap(false, true) {
			return
		}
		faults.add(name)
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer h.busy.Store(false)
			if err := h.proxy.For(ctx, d, kind, stream, attrs); err != nil && ctx.Err() == nil {
				t.Errorf("%s: fault on holder %d: %v", rig.store, h.i, err)
			}
		}()
	}
	ttlMs := float64(rig.ttl.Milliseconds())
	between := func(r *rand.Rand, lo, hi float64) time.Duration { // in TTLs
		return time.Duration((lo + r.Float64()*(hi-lo)) * float64(rig.ttl))
	}

	// The fault stream: every 20-120 ms, a fault on a holder that holds or
	// is releasing.
	wg.Add(1)
	go func() {
		defer wg.Done()
		r := rand.New(rand.NewPCG(seed, 0xfa017))
		for {
			pause := time.NewTimer(time.Duration(20+r.IntN(100)) * time.Millisecond)
			select {
			case <-ctx.Done():
				pause.Stop()
				return
			case <-pause.C:
			}
			// Holders that hold, and holders that release; one of the two
			// kinds at even odds (a release slowed by a fault lasts long
			// and would otherwise draw most of the faults).
			var holding, releasing []*leaseHolder
			for _, h := range hs {
				if h.busy.Load() {
					continue
				}
				switch h.phase.Load() {
				case phaseHolding:
					holding = append(holding, h)
				case phaseReleasing:
					releasing = append(releasing, h)
				}
			}
			live, when := holding, "hold"
			if len(holding) == 0 || (len(releasing) > 0 && r.IntN(2) == 0) {
				live, when = releasing, "release"
			}
			if len(live) == 0 {
				continue
			}
			h := live[r.IntN(len(live))]
			kinds := 5
			if rig.storeFault != nil {
				kinds = 6
			}
			k := r.IntN(kinds)
			if rig.longBlackholes && r.IntN(4) != 0 {
				k = 2 + r.IntN(2)
			}
			bh := between(r, 0.05, rig.blackholeMax)
			if rig.longBlackholes {
				bh = between(r, 1.0, 1.4)
			}
			switch k {
			case 0:
				fault(h, "reply-delay@"+when, "latency", "downstream", fmt.Sprintf(`"latency":%d,"jitter":0`, int(ttlMs*(0.05+0.55*r.Float64()))), between(r, 0.1, 1))
			case 1:
				fault(h, "request-delay@"+when, "latency", "upstream", fmt.Sprintf(`"latency":%d,"jitter":0`, int(ttlMs*(0.05+0.55*r.Float64()))), between(r, 0.1, 1))
			case 2:
				fault(h, "blackhole-requests@"+when, "timeout", "upstream", `"timeout":0`, bh)
			case 3:
				fault(h, "blackhole-replies@"+when, "timeout", "downstream", `"timeout":0`, bh)
			case 4:
				fault(h, "reset@"+when, "reset_peer", "upstream", `"timeout":0`, time.Duration(5+r.IntN(25))*time.Millisecond)
			case 5:
				if name := rig.storeFault(ctx, h.i); name != "" {
					faults.add(name + "@" + when)
				}
			}
		}
	}()

	if rig.stopOnOverlap {
		wg.Add(1)
		go func() {
			defer wg.Done()
			tick := time.NewTicker(200 * time.Millisecond)
			defer tick.Stop()
			for {
				select {
				case <-ctx.Done():
					return
				case <-tick.C:
				}
				mu.Lock()
				ws := append([]leasetest.Window(nil), windows...)
				mu.Unlock()
				if len(leasetest.CheckWindows(ws).Overlaps) > 0 {
					stop()
					return
				}
			}
		}()
	}

	for _, h := range hs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer h.phase.Store(phaseIdle)
			r := rand.New(rand.NewPCG(seed, uint64(h.i)+1))
			for ctx.Err() == nil {
				name := rig.names[r.IntN(len(rig.names))]
				actx, cancel := context.WithTimeout(ctx, 4*rig.ttl)
				l, err := h.m.Acquire(actx, name)
				acquired := time.Now()
				cancel()
				if err != nil {
					switch {
					case ctx.Err() != nil:
					case errors.Is(err, lease.ErrNotAcquired):
						count("acquire-waited-out")
					default:
						count("acquire-error")
						time.Sleep(10 * time.Millisecond)
					}
					continue
				}
				grants.Add(1)
				h.phase.Store(phaseHolding)
				w := leasetest.Window{Name: name, Holder: fmt.Sprintf("h%d", h.i), Token: l.Token(), Start: acquired.Sub(epoch)}
				var last time.Time // the start of the last reading of Err that returned nil

				// Work, reading the lease before each step as a careful
				// holder would before each write.
				work := rig.workMin + time.Duration(r.Int64N(int64(rig.workMax-rig.workMin)+1))
				for time.Since(acquired) < work {
					t0 := time.Now()
					if l.Err() != nil {
						break
					}
					last = t0
					time.Sleep(200 * time.Microsecond)
				}
				if l.Err() != nil {
					count("lost-while-working")
				}

				// Release, now and then with a fault of its own aimed at
				// it, while a second goroutine keeps reading the lease:
				// whatever reads valid while Release runs is part of the
				// window.
				if r.IntN(3) == 0 {
					switch r.IntN(4) {
					case 0:
						fault(h, "reply-delay@release", "latency", "downstream", fmt.Sprintf(`"latency":%d,"jitter":0`, int(ttlMs*(0.1+0.4*r.Float64()))), rig.ttl/2)
					case 1:
						fault(h, "blackhole-replies@release", "timeout", "downstream", `"timeout":0`, between(r, 0.1, 0.8))
					case 2:
						fault(h, "blackhole-requests@release", "timeout", "upstream", `"timeout":0`, between(r, 0.1, 0.8))
					case 3:
						fault(h, "reset@release", "reset_peer", "upstream", `"timeout":0`, 10*time.Millisecond)
					}
				}
				h.phase.Store(phaseReleasing)
				var (
					released  = make(chan struct{})
					polled    = make(chan struct{})
					lastInRel time.Time
				)
				go func() {
					defer close(polled)
					for {
						t0 := time.Now()
						if l.Err() != nil {
							return
						}
						lastInRel = t0
						select {
						case <-released:
							return
						default:
						}
						time.Sleep(100 * time.Microsecond)
					}
				}()
				rctx, rcancel := context.WithTimeout(context.Background(), 5*rig.ttl+2*time.Second)
				rerr := l.Release(rctx)
				rcancel()
				close(released)
				<-polled
				// One more reading after Release returned: it must not be
				// valid.
				if t0 := time.Now(); l.Err() == nil {
					lastInRel = t0
					count("valid-after-release-returned")
				}
				h.phase.Store(phaseIdle)
				switch {
				case rerr == nil:
					count("released")
				case errors.Is(rerr, lease.ErrLost):
					count("release-found-lost")
				default:
					count("release-error")
				}
				if lastInRel.After(last) {
					last = lastInRel
				}
				if last.IsZero() {
					count("never-read-valid")
					w.End = -1
				} else {
					w.End = last.Sub(epoch)
				}
				mu.Lock()
				windows = append(windows, w)
				mu.Unlock()
			}
		}()
	}
	wg.Wait()

	mu.Lock()
	defer mu.Unlock()
	return leaseRunResult{
		check:   leasetest.CheckWindows(windows),
		grants:  int(grants.Load()),
		faults:  faults,
		counts:  counts,
		elapsed: time.Since(epoch),
	}
}

// reportLeaseHistory logs a run's figures (and appends them to
// RELIABILITY_FIGURES) and describes its violations.
func reportLeaseHistory(t *testing.T, rig leaseRig, res leaseRunResult) {
	t.Helper()
	outcomes := map[string]int{"grants": res.grants, "windows": res.check.Windows,
		"overlaps": len(res.check.Overlaps), "token-order-violations": len(res.check.Inversions)}
	for k, v := range res.counts {
		outcomes[k] = v
	}
	report(t, figures{
		Check:      "lease history " + rig.store,
		Operations: res.grants,
		Outcomes:   outcomes,
		Faults:     res.faults.snapshot(),
		Violations: len(res.check.Overlaps) + len(res.check.Inversions),
		Seconds:    res.elapsed.Seconds(),
	})
	t.Logf("%s: %d grants (%d windows), %d faults injected, %d overlaps, %d token-order violations in %.1fs",
		rig.store, res.grants, res.check.Windows, res.faults.total(), len(res.check.Overlaps), len(res.check.Inversions), res.elapsed.Seconds())
}

// describeViolations lists the first violations of a run.
func describeViolations(c leasetest.WindowCheck) string {
	var b strings.Builder
	for _, o := range c.Overlaps[:min(len(c.Overlaps), 8)] {
		fmt.Fprintf(&b, "\n  overlap by %v: %v, then %v", o.By, o.First, o.Second)
	}
	for _, inv := range c.Inversions[:min(len(c.Inversions), 8)] {
		fmt.Fprintf(&b, "\n  token order: %v, then %v", inv.Earlier, inv.Later)
	}
	return b.String()
}

// checkLeaseHistory runs rig and asserts the safety property and a floor of
// grants.
func checkLeaseHistory(t *testing.T, rig leaseRig, minGrants int) {
	t.Helper()
	res := runLeaseHistory(t, rig)
	reportLeaseHistory(t, rig, res)
	if n := len(res.check.Overlaps) + len(res.check.Inversions); n > 0 {
		t.Errorf("%s: %d overlapping windows and %d token-order violations (two holders valid at once, or a token that did not grow):%s",
			rig.store, len(res.check.Overlaps), len(res.check.Inversions), describeViolations(res.check))
	}
	if res.check.Windows < minGrants {
		t.Errorf("%s: only %d grants read valid (%d grants) in %v: too few to show anything (want at least %d); counts %v",
			rig.store, res.check.Windows, res.grants, rig.run, minGrants, res.counts)
	}
	if res.faults.total() == 0 {
		t.Errorf("%s: no fault was injected", rig.store)
	}
}

// leaseRunTime is each store's run: RELIABILITY_LEASE_SECONDS, default 12 s.
func leaseRunTime() time.Duration {
	return time.Duration(envInt("RELIABILITY_LEASE_SECONDS", 12)) * time.Second
}

// minLeaseGrants is the floor of grants read valid in a run: one per two
// TTLs of the run, a modest one (unloaded, the runs make 2-5 times as
// many; faults slow every hand-over).
func minLeaseGrants(rig leaseRig) int { return max(5, int(rig.run/(2*rig.ttl))) }

// baseRig is the common shape: 6 holders on 2 names, work up to 0.8 TTL
// with now and then a long hold through renewals.
func baseRig(store string, ttl time.Duration) leaseRig {
	return leaseRig{
		store: store, ttl: ttl, holders: 6, names: []string{"alpha", "beta"},
		workMin: 0, workMax: ttl * 8 / 10, blackholeMax: 1.5, run: leaseRunTime(),
	}
}

// redisRig holds leases in the shared Redis under a key prefix of the
// test's own; each holder has a go-redis client with its default retries
// (as the README's quick start makes it) through its proxy.
func redisRig(t *testing.T, store string) leaseRig {
	opt, err := redis.ParseURL(testenv.RedisURL())
	if err != nil {
		t.Fatalf("%s: %v", testenv.RedisURLVar, err)
	}
	redistest.Shared(t) // fails loudly when Redis does not answer
	prefix := redistest.Prefix(t)
	rig := baseRig(store, 600*time.Millisecond)
	rig.upstream = opt.Addr
	rig.backend = func(t *testing.T, i int, addr string) lease.Backend {
		o := *opt
		o.Addr = addr
		o.ContextTimeoutEnabled = true
		o.DialTimeout = time.Second
		c := redis.NewClient(&o)
		t.Cleanup(func() { _ = c.Close() })
		b, err := redislease.New(c, redislease.WithPrefix(prefix))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = b.Close() })
		return b
	}
	return rig
}

// TestLeaseHistoryRedis: the history check on Redis.
func TestLeaseHistoryRedis(t *testing.T) {
	rig := redisRig(t, "redis")
	checkLeaseHistory(t, rig, minLeaseGrants(rig))
}

// pgRig holds leases in a throwaway schema of the shared PostgreSQL, in the
// given mode; each holder has a pool of its own through its proxy, whose
// connections carry an application name of the holder's, so that the fault
// stream can terminate that holder's sessions at the server.
func pgRig(t *testing.T, store string, mode pglease.Mode) leaseRig {
	e := newPGEnv(t)
	admin := e.pool("", 2)
	rig := baseRig(store, 600*time.Millisecond)
	rig.upstream = pgUpstream(t)
	appName := func(i int) string { return fmt.Sprintf("%s_h%d", e.appName, i) }
	rig.backend = func(t *testing.T, i int, addr string) lease.Backend {
		pcfg, err := pgxpool.ParseConfig(e.url)
		if err != nil {
			t.Fatal(err)
		}
		pcfg.ConnConfig = e.config(addr)
		pcfg.ConnConfig.RuntimeParams["application_name"] = appName(i)
		pcfg.MaxConns = 6
		pool, err := pgxpool.NewWithConfig(context.Background(), pcfg)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(pool.Close)
		b, err := pglease.New(pool, pglease.WithMode(mode), pglease.WithSchema(e.schema), pglease.WithLogger(slog.New(slog.DiscardHandler)))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = b.Close() })
		return b
	}
	rig.storeFault = func(ctx context.Context, i int) string {
		var n int
		err := admin.QueryRow(ctx, `SELECT count(pg_catalog.pg_terminate_backend(pid)) FROM pg_catalog.pg_stat_activity
			WHERE application_name = $1`, appName(i)).Scan(&n)
		if err != nil || n == 0 {
			return ""
		}
		return "pg_terminate_backend"
	}
	return rig
}

// TestLeaseHistoryPostgresTable: the history check on PostgreSQL, table
// mode.
func TestLeaseHistoryPostgresTable(t *testing.T) {
	rig := pgRig(t, "postgres-table", pglease.ModeTable)
	checkLeaseHistory(t, rig, minLeaseGrants(rig))
}

// TestLeaseHistoryPostgresSession: the history check on PostgreSQL, session
// mode (advisory locks on pinned connections); terminating a holder's
// sessions at the server frees its locks there at once.
func TestLeaseHistoryPostgresSession(t *testing.T) {
	rig := pgRig(t, "postgres-session", pglease.ModeSession)
	checkLeaseHistory(t, rig, minLeaseGrants(rig))
}

// TestLeaseHistoryEtcd: the history check on a one-member etcd
// started by the test (TTL 1 s, etcd's whole-second resolution).
func TestLeaseHistoryEtcd(t *testing.T) {
	ep := startEtcd(t)
	u, err := url.Parse(ep)
	if err != nil {
		t.Fatal(err)
	}
	rig := baseRig("etcd", time.Second)
	rig.upstream = u.Host
	rig.backend = func(t *testing.T, i int, addr string) lease.Backend {
		cli, err := clientv3.New(clientv3.Config{
			Endpoints:            []string{"http://" + addr},
			DialTimeout:          2 * time.Second,
			DialKeepAliveTime:    time.Second,
			DialKeepAliveTimeout: time.Second,
			Logger:               zap.NewNop(),
		})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = cli.Close() })
		b, err := etcdlease.New(cli, etcdlease.WithPrefix("fencekit-rel/"), etcdlease.WithMinTTL(time.Second))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = b.Close() })
		return b
	}
	checkLeaseHistory(t, rig, minLeaseGrants(rig))
}

// TestLeaseHistoryZooKeeper: the history check on a standalone ZooKeeper
// server started by the test. The session timeout is 1.5 TTL, so the
// longest blackholes also expire sessions.
func TestLeaseHistoryZooKeeper(t *testing.T) {
	addr := startZooKeeper(t)
	rig := baseRig("zookeeper", 600*time.Millisecond)
	rig.upstream = addr
	rig.backend = func(t *testing.T, i int, addr string) lease.Backend {
		b, err := zklease.New([]string{addr}, zklease.WithRoot("/fencekit-rel"),
			zklease.WithSessionTimeout(rig.ttl*3/2), zklease.WithIdentity(fmt.Sprintf("h%d", i)),
			zklease.WithLogger(slog.New(slog.DiscardHandler)))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = b.Close() })
		return b
	}
	checkLeaseHistory(t, rig, minLeaseGrants(rig))
}

// longDeadline is a planted bug: a Backend that tells the Manager each grant
// lasts factor × the TTL the store keeps, so that the Manager's local
// deadline runs past the store's expiry (a local deadline of send + 1.5
// TTL). Renewals and releases reach the store with the real TTL.
type longDeadline struct {
	lease.Backend
	factor float64
}

// longDeadlineState carries the inner grant's own TTL and state.
type longDeadlineState struct {
	ttl   time.Duration
	state any
}

func (b longDeadline) inner(g driver.Grant) driver.Grant {
	if s, ok := g.State.(longDeadlineState); ok {
		g.TTL, g.State = s.ttl, s.state
	}
	return g
}

func (b longDeadline) Acquire(ctx context.Context, req driver.Request) (driver.Grant, error) {
	g, err := b.Backend.Acquire(ctx, req)
	if err != nil {
		return g, err
	}
	g.State = longDeadlineState{ttl: g.TTL, state: g.State}
	g.TTL = time.Duration(float64(g.TTL) * b.factor)
	return g, nil
}

func (b longDeadline) Renew(ctx context.Context, g driver.Grant) error {
	return b.Backend.Renew(ctx, b.inner(g))
}

func (b longDeadline) Release(ctx context.Context, g driver.Grant) error {
	return b.Backend.Release(ctx, b.inner(g))
}

// TestLeaseHistoryCatchesPlantedBug: the check must fail on a Manager whose
// local deadline is send + 1.5 TTL while Redis keeps each grant for TTL.
// Holders work for 2-3 TTLs and the faults are mostly blackholes of 1-1.4
// TTL: the store lets a silenced holder's grant expire, another holder is
// granted the name, and the silenced holder still reads its lease valid.
// The run stops at the first overlap (at most RELIABILITY_LEASE_SECONDS).
func TestLeaseHistoryCatchesPlantedBug(t *testing.T) {
	rig := redisRig(t, "redis, planted bug: local deadline send + 1.5 TTL")
	rig.wrap = func(b lease.Backend) lease.Backend { return longDeadline{Backend: b, factor: 1.5} }
	rig.workMin, rig.workMax = 2*rig.ttl, 3*rig.ttl
	rig.longBlackholes = true
	rig.stopOnOverlap = true
	rig.run = max(leaseRunTime(), 20*time.Second)
	res := runLeaseHistory(t, rig)
	reportLeaseHistory(t, rig, res)
	if len(res.check.Overlaps) == 0 {
		t.Fatalf("the history check found no overlap with a planted local deadline of send + 1.5 TTL (%d grants, %d windows, faults %v, counts %v): it cannot be trusted",
			res.grants, res.check.Windows, res.faults.snapshot(), res.counts)
	}
	t.Logf("planted bug caught: %d overlapping windows after %.1fs; the first:%s", len(res.check.Overlaps), res.elapsed.Seconds(), describeViolations(leasetest.WindowCheck{Overlaps: res.check.Overlaps[:1]}))
}
