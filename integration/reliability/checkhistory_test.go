package reliability

import (
	"context"
	"fmt"
	"math/rand/v2"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/anishathalye/porcupine"
	"github.com/redis/go-redis/v9"

	"github.com/fencekit/fencekit/fence"
	"github.com/fencekit/fencekit/fencecheck"
	"github.com/fencekit/fencekit/integration/internal/toxi"
	"github.com/fencekit/fencekit/internal/testkit/testenv"
	"github.com/fencekit/fencekit/lease/redislease/redistest"
	"github.com/fencekit/fencekit/redischeck"
	"github.com/fencekit/fencekit/sqlguard"
)

// checkerModel is a fencecheck.Checker as its documentation states it: per
// resource, a register holding only the newest accepted token (the
// guarded-register model with no data). A check with token t is accepted
// when t >= the stored token and stores t; a rejection names the stored
// token and changes nothing; an unknown outcome may have stored t.
func checkerModel() porcupine.Model {
	nm := porcupine.NondeterministicModel{
		Partition: partitionBy(func(in any) string { return in.(guardInput).Resource }),
		Init:      func() []any { return []any{guardState{}} },
		Step: func(state, input, output any) []any {
			return guardStep(state.(guardState), input.(guardInput), output.(result))
		},
		DescribeOperation: func(input, output any) string {
			in, out := input.(guardInput), output.(result)
			if in.Op == opRead {
				return fmt.Sprintf("Current(%s) -> t%d", in.Resource, out.Token)
			}
			return fmt.Sprintf("Check(%s, t%d) via %s -> %s", in.Resource, in.Token, in.Via, describeOut(out))
		},
		DescribeState: func(state any) string { return fmt.Sprintf("%+v", state) },
	}
	return nm.ToModel()
}

// checkerRig is one checker under test: two instances on the same store,
// one direct and one through a fault proxy, and a way to read a
// resource's stored token directly.
type checkerRig struct {
	direct, proxied fencecheck.Checker
	current         func(ctx context.Context, resource string) (fence.Token, error)
	chaos           func(ctx context.Context, r *rand.Rand, faults *faultCounter)
	// pace is the longest random pause between a worker's operations:
	// a store that answers in microseconds would otherwise finish the run
	// before the chaos has done much.
	pace time.Duration
}

// runCheckerHistory runs concurrent checks of random tokens on a few
// resources through both instances, with faults injected throughout, and
// checks the history against checkerModel.
func runCheckerHistory(t *testing.T, what string, rig checkerRig) {
	started := time.Now()
	seed := seedFor(t)
	const resources = 4
	workers := 6
	opsPerWorker := envInt("RELIABILITY_HISTORY_OPS", 150)
	h := newHistory()
	var faults faultCounter
	var tokens tokenSource

	chaosCtx, stopChaos := context.WithCancel(context.Background())
	var chaosDone sync.WaitGroup
	chaosDone.Go(func() { rig.chaos(chaosCtx, rand.New(rand.NewPCG(seed, 99)), &faults) })

	read := func(client int, res string) {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		call := h.now()
		tok, err := rig.current(ctx, res)
		ret := h.now()
		if err == nil { // a read that fails tells nothing
			h.add(client, guardInput{Resource: res, Op: opRead}, call, result{Outcome: outRead, Token: uint64(tok)}, ret)
		}
	}
	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			r := rand.New(rand.NewPCG(seed, uint64(w)))
			c, via := rig.direct, "direct"
			if w%2 == 1 {
				c, via = rig.proxied, "proxy"
			}
			for range opsPerWorker {
				if rig.pace > 0 {
					time.Sleep(time.Duration(r.Int64N(int64(rig.pace))))
				}
				res := "r" + strconv.Itoa(r.IntN(resources))
				if r.IntN(10) == 0 {
					read(w, res)
					continue
				}
				in := guardInput{Resource: res, Op: opBegin, Token: tokens.next(r), Via: via}
				ctx, cancel := opContext(r, &faults)
				call := h.now()
				out := classify(c.Check(ctx, res, fence.Token(in.Token)), nil)
				cancel()
				h.add(w, in, call, out, h.now())
			}
		})
	}
	wg.Wait()
	stopChaos()
	chaosDone.Wait()
	time.Sleep(200 * time.Millisecond) // statements still at the server finish
	for i := range resources {
		read(workers, "r"+strconv.Itoa(i))
	}
	h.check(t, checkerModel(), what)
	f := historyFigures(what, h, &faults, started)
	f.Seed = seed
	report(t, f)
	if f.Outcomes["ok"] == 0 || f.Outcomes["stale"] == 0 || f.Outcomes["unknown"] == 0 || faults.total() == 0 {
		t.Errorf("the run did not exercise every path: %+v", f)
	}
}

// proxyChaos resets or blackholes a fault proxy in one direction for a
// while, again and again, until ctx ends.
func proxyChaos(ctx context.Context, t *testing.T, proxy *toxi.Proxy, r *rand.Rand, faults *faultCounter) {
	for ctx.Err() == nil {
		pause := time.NewTimer(time.Duration(20+r.IntN(80)) * time.Millisecond)
		select {
		case <-ctx.Done():
			pause.Stop()
			return
		case <-pause.C:
		}
		kind, stream := "timeout", "upstream"
		switch r.IntN(3) {
		case 0:
			kind = "reset_peer"
			faults.add("proxy-reset")
		case 1:
			faults.add("proxy-blackhole-requests")
		case 2:
			stream = "downstream"
			faults.add("proxy-blackhole-replies")
		}
		if err := proxy.For(ctx, time.Duration(5+r.IntN(40))*time.Millisecond, kind, stream, `"timeout":0`); err != nil && ctx.Err() == nil {
			t.Errorf("chaos: %v", err)
			return
		}
	}
}

// TestPGCheckerHistoryLinearizable: sqlguard.Checker on the real
// PostgreSQL, one pool direct and one through a fault proxy, with backends
// killed and the proxy reset or blackholed throughout.
func TestPGCheckerHistoryLinearizable(t *testing.T) {
	e := newPGEnv(t)
	proxy := toxi.Start(t, pgUpstream(t))
	direct, err := sqlguard.NewChecker(e.pool("", 6))
	if err != nil {
		t.Fatal(err)
	}
	proxied, err := sqlguard.NewChecker(e.pool(proxy.Addr, 6))
	if err != nil {
		t.Fatal(err)
	}
	reader, err := sqlguard.NewChecker(e.pool("", 2))
	if err != nil {
		t.Fatal(err)
	}
	runCheckerHistory(t, "sqlguard.Checker", checkerRig{
		direct: direct, proxied: proxied, current: reader.Current,
		chaos: func(ctx context.Context, r *rand.Rand, faults *faultCounter) { pgChaos(ctx, t, e, proxy, r, faults) },
	})
}

// TestRedisCheckerHistoryLinearizable: redischeck on the real Redis, one
// client direct and one through a fault proxy that resets or blackholes
// the connection throughout.
func TestRedisCheckerHistoryLinearizable(t *testing.T) {
	opt, err := redis.ParseURL(testenv.RedisURL())
	if err != nil {
		t.Fatal(err)
	}
	redistest.Shared(t) // fails loudly when Redis is not there
	proxy := toxi.Start(t, opt.Addr)
	client := func(addr string) *redis.Client {
		o := *opt
		o.Addr, o.MaxRetries, o.ContextTimeoutEnabled = addr, -1, true
		c := redis.NewClient(&o)
		t.Cleanup(func() { _ = c.Close() })
		return c
	}
	prefix := redistest.Prefix(t)
	mk := func(c *redis.Client) *redischeck.Checker {
		chk, err := redischeck.New(c, redischeck.WithKeyPrefix(prefix))
		if err != nil {
			t.Fatal(err)
		}
		return chk
	}
	reader := mk(client(opt.Addr))
	runCheckerHistory(t, "redischeck.Checker", checkerRig{
		direct: mk(client(opt.Addr)), proxied: mk(client(proxy.Addr)), current: reader.Current,
		chaos: func(ctx context.Context, r *rand.Rand, faults *faultCounter) { proxyChaos(ctx, t, proxy, r, faults) },
		pace:  30 * time.Millisecond,
	})
}
