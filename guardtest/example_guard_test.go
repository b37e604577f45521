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
}

type memReg struct {
	value string
	token fence.Token
}

var errMemNotFound = errors.New("memguard: not found")

// memResource is the adapter: one key of the store, written through the
// guard's rules, with a request counter and a switch that loses the next
// reply.
type memResource struct {
	store    *memStore
	key      string
	requests atomic.Int64
	loseNext atomic.Bool
}

func (r *memResource) Write(ctx context.Context, token fence.Token, value string) error {
	if err := token.Validate(); err != nil { // before any I/O
		return fmt.Errorf("memguard: write %s: %w", r.key, err)
	}
	r.requests.Add(1)
	r.store.mu.Lock()
	reg, ok := r.store.regs[r.key]
	var err error
	switch {
	case !ok:
		err = fmt.Errorf("memguard: write %s: %w", r.key, errMemNotFound)
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
		Timeout:     time.Minute,
	})
}
