package redislease_test

import (
	"context"
	"errors"
	"fmt"
	mrand "math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/fencekit/fencekit/internal/testkit"
	"github.com/fencekit/fencekit/lease"
	"github.com/fencekit/fencekit/lease/redislease"
	"github.com/fencekit/fencekit/lease/redislease/redistest"
)

// scriptOrder records, per lease key, whether a release script was sent, and
// counts the renew scripts sent for that key after it, as the client sends
// them (single commands and pipelines alike, so batched heartbeats count).
type scriptOrder struct {
	renewSHA, releaseSHA string

	mu       sync.Mutex
	released map[string]bool
	late     int
}

func (h *scriptOrder) see(cmd redis.Cmder) {
	args := cmd.Args()
	if len(args) < 4 || (cmd.Name() != "evalsha" && cmd.Name() != "eval") {
		return
	}
	sha, _ := args[1].(string)
	key, _ := args[3].(string)
	h.mu.Lock()
	defer h.mu.Unlock()
	switch sha {
	case h.releaseSHA:
		h.released[key] = true
	case h.renewSHA:
		if h.released[key] {
			h.late++
		}
	}
}

func (h *scriptOrder) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h *scriptOrder) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		h.see(cmd)
		return next(ctx, cmd)
	}
}
func (h *scriptOrder) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		for _, c := range cmds {
			h.see(c)
		}
		return next(ctx, cmds)
	}
}

// TestReleaseRacingRenewals: leases renewed every millisecond (batched, as
// by default, and not), each released 0–2 ms after its grant, thousands of
// times. A clean release must never be reported as a loss, the Observer
// must count no loss, and no renew request may be sent for a lease once its
// release was sent (docs/design.md, invariant 4).
func TestReleaseRacingRenewals(t *testing.T) {
	for _, window := range []time.Duration{0, lease.NoBatching} {
		t.Run(fmt.Sprintf("batch-window=%v", window), func(t *testing.T) {
			c := redistest.Shared(t)
			renewSHA, releaseSHA := redislease.ScriptSHAsForTest()
			order := &scriptOrder{renewSHA: renewSHA, releaseSHA: releaseSHA, released: map[string]bool{}}
			c.AddHook(order)
			b := newBackend(t, c, redistest.Prefix(t))
			obs := &lossCounter{}
			m := newManager(t, b, lease.Options{TTL: 10 * time.Second, RenewInterval: time.Millisecond, RenewBatchWindow: window, Observer: obs})
			const workers, rounds = 5, 500
			var falseLosses atomic.Int64
			var wg sync.WaitGroup
			for w := range workers {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for i := range rounds {
						l, err := m.Acquire(testkit.Context(t), fmt.Sprintf("race-%d-%d", w, i))
						if err != nil {
							t.Errorf("Acquire: %v", err)
							return
						}
						time.Sleep(mrand.N(2 * time.Millisecond))
						if err := l.Release(testkit.Context(t)); err != nil {
							falseLosses.Add(1)
							if errors.Is(err, lease.ErrLost) && falseLosses.Load() <= 3 {
								t.Errorf("Release of a held lease, racing its renewals: %v", err)
							}
						}
					}
				}()
			}
			wg.Wait()
			if n := falseLosses.Load(); n > 0 {
				t.Errorf("%d of %d clean releases returned an error", n, workers*rounds)
			}
			if n := obs.lost.Load(); n > 0 {
				t.Errorf("the Observer counted %d losses; every lease was released while held", n)
			}
			order.mu.Lock()
			defer order.mu.Unlock()
			if order.late > 0 {
				t.Errorf("%d renew requests were sent after their lease's release had been sent", order.late)
			}
		})
	}
}

type lossCounter struct {
	lease.NopObserver
	lost atomic.Int64
}

func (o *lossCounter) Lost(lease.LostEvent) { o.lost.Add(1) }
