package guardtest_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fencekit/fencekit/fence"
	"github.com/fencekit/fencekit/guardtest"
)

// memStore is a store that keeps one register per key: the reference
// guard the suite is tested against. Its guard validates the token, then
// compares and writes in one step under the store's lock, as a real
// guard's conditional write does at the store.
type memStore struct {
	mu   sync.Mutex
	regs map[string]*memReg
	// unmigrated: the store is not set up for the guard; its start-up
	// check and its writes say so, with the fix.
	unmigrated bool
}

// check is the guard's start-up check.
func (s *memStore) check(context.Context) error {
	if s.unmigrated {
		return fence.Setup("run `memguard migrate`", "memguard: %w: the registers are not there", fence.ErrNotMigrated)
	}
	return nil
}

type memReg struct {
	value string
	token fence.Token
}

var errMemNotFound = fence.ErrNotFound

// memResource is the adapter: one key of the store, written through the
// guard's rules, with a request counter and a switch that loses the next
// reply.
type memResource struct {
	store    *memStore
	key      string
	requests atomic.Int64
	loseNext atomic.Bool
	obs      fence.WriteObserver // reports each write, when set
}

func (r *memResource) Write(ctx context.Context, token fence.Token, value string) error {
	e := fence.WriteEvent{Ctx: ctx, Guard: "memguard", Class: "registers", Op: "write", Resource: r.key, Token: token}
	return fence.Observe(r.obs, e, func() error { return r.write(ctx, token, value) })
}

func (r *memResource) write(ctx context.Context, token fence.Token, value string) error {
	if err := token.Validate(); err != nil { // before any I/O
		return fmt.Errorf("memguard: write %s: %w", r.key, err)
	}
	if err := r.store.check(ctx); err != nil {
		return fmt.Errorf("memguard: write %s: %w", r.key, err)
	}
	r.requests.Add(1)
	r.store.mu.Lock()
	reg, ok := r.store.regs[r.key]
	var err error
	switch {
	case !ok:
		err = fmt.Errorf("memguard: write %s: %w", r.key, &fence.NotFoundError{Resource: r.key})
	case token < reg.token:
		err = fence.Stale(r.key, token, reg.token)
	default:
		reg.value, reg.token = value, token
	}
	r.store.mu.Unlock()
	if r.loseNext.Swap(false) {
		return fmt.Errorf("memguard: write %s: reply lost: %w", r.key, fence.ErrOutcomeUnknown)
	}
	return err
}

func (r *memResource) Read(ctx context.Context) (string, fence.Token, error) {
	r.store.mu.Lock()
	defer r.store.mu.Unlock()
	reg, ok := r.store.regs[r.key]
	if !ok {
		return "", fence.None, errMemNotFound
	}
	return reg.value, reg.token, nil
}

// TestConformance runs the suite against the reference guard, with every
// capability.
func TestConformance(t *testing.T) {
	store := &memStore{regs: map[string]*memReg{}}
	var n atomic.Int64
	newResource := func(t *testing.T, exists bool) guardtest.Resource {
		key := fmt.Sprintf("%s/%d", t.Name(), n.Add(1))
		if exists {
			store.mu.Lock()
			store.regs[key] = &memReg{}
			store.mu.Unlock()
		}
		return &memResource{store: store, key: key}
	}
	guardtest.Run(t, guardtest.Config{
		NewResource: func(t *testing.T) guardtest.Resource { return newResource(t, true) },
		NewMissing:  func(t *testing.T) guardtest.Resource { return newResource(t, false) },
		IsMissing:   func(err error) bool { return errors.Is(err, errMemNotFound) },
		LoseReply:   func(t *testing.T, r guardtest.Resource) { r.(*memResource).loseNext.Store(true) },
		CountIO:     func(r guardtest.Resource) int64 { return r.(*memResource).requests.Load() },
		Observe: func(t *testing.T, r guardtest.Resource, o fence.WriteObserver) guardtest.Want {
			m := r.(*memResource)
			m.obs = o
			return guardtest.Want{Guard: "memguard", Class: "registers", Op: "write", Resource: m.key}
		},
		Check: func(ctx context.Context, r guardtest.Resource) error { return r.(*memResource).store.check(ctx) },
		NewBroken: func(t *testing.T) guardtest.Resource {
			return &memResource{store: &memStore{regs: map[string]*memReg{}, unmigrated: true}, key: "k"}
		},
		Timeout: time.Minute,
	})
}
