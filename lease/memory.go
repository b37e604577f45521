package lease

import (
	"context"
	"sync"
	"time"

	"github.com/fencekit/fencekit/fence"
)

// MemoryBackend is a Backend (and Watcher) that keeps leases in this
// process's memory. It serves unit tests and runnable examples: it gives no
// protection across processes. The zero value is not usable; call
// NewMemoryBackend.
type MemoryBackend struct {
	mu       sync.Mutex
	leases   map[string]memGrant
	tokens   map[string]fence.Token
	watchers map[string]map[chan struct{}]struct{}
}

type memGrant struct {
	owner   string
	token   fence.Token
	expires time.Time
}

var (
	_ Backend      = (*MemoryBackend)(nil)
	_ Watcher      = (*MemoryBackend)(nil)
	_ BatchRenewer = (*MemoryBackend)(nil)
)

// NewMemoryBackend returns an empty in-memory backend.
func NewMemoryBackend() *MemoryBackend {
	return &MemoryBackend{
		leases:   make(map[string]memGrant),
		tokens:   make(map[string]fence.Token),
		watchers: make(map[string]map[chan struct{}]struct{}),
	}
}

// current returns the live grant of name; mu must be held.
func (b *MemoryBackend) current(name string, now time.Time) (memGrant, bool) {
	g, ok := b.leases[name]
	if ok && !now.Before(g.expires) {
		delete(b.leases, name)
		return memGrant{}, false
	}
	return g, ok
}

// Acquire implements Backend.
func (b *MemoryBackend) Acquire(ctx context.Context, rec Record) (fence.Token, error) {
	if err := ctx.Err(); err != nil {
		return 0, err
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	now := time.Now()
	if g, ok := b.current(rec.Name, now); ok {
		if g.owner != rec.Owner {
			return 0, &NotAcquiredError{Name: rec.Name, RetryAfter: g.expires.Sub(now)}
		}
		g.expires = now.Add(rec.TTL)
		b.leases[rec.Name] = g
		return g.token, nil
	}
	tok := b.tokens[rec.Name] + 1
	b.tokens[rec.Name] = tok
	b.leases[rec.Name] = memGrant{owner: rec.Owner, token: tok, expires: now.Add(rec.TTL)}
	return tok, nil
}

// Renew implements Backend.
func (b *MemoryBackend) Renew(ctx context.Context, rec Record) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	now := time.Now()
	g, ok := b.current(rec.Name, now)
	if !ok || g.owner != rec.Owner {
		return ErrNotHeld
	}
	g.expires = now.Add(rec.TTL)
	b.leases[rec.Name] = g
	return nil
}

// Release implements Backend.
func (b *MemoryBackend) Release(ctx context.Context, rec Record) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	g, ok := b.current(rec.Name, time.Now())
	if !ok || g.owner != rec.Owner {
		return ErrNotHeld
	}
	delete(b.leases, rec.Name)
	for ch := range b.watchers[rec.Name] {
		select {
		case ch <- struct{}{}:
		default:
		}
	}
	return nil
}

// Watch implements Watcher.
func (b *MemoryBackend) Watch(ctx context.Context, name string) (<-chan struct{}, func(), error) {
	if err := ctx.Err(); err != nil {
		return nil, nil, err
	}
	ch := make(chan struct{}, 1)
	b.mu.Lock()
	if b.watchers[name] == nil {
		b.watchers[name] = make(map[chan struct{}]struct{})
	}
	b.watchers[name][ch] = struct{}{}
	b.mu.Unlock()
	var once sync.Once
	stop := func() {
		once.Do(func() {
			b.mu.Lock()
			defer b.mu.Unlock()
			delete(b.watchers[name], ch)
			if len(b.watchers[name]) == 0 {
				delete(b.watchers, name)
			}
		})
	}
	return ch, stop, nil
}

// RenewBatch implements BatchRenewer.
func (b *MemoryBackend) RenewBatch(ctx context.Context, recs []Record) []error {
	errs := make([]error, len(recs))
	for i, r := range recs {
		errs[i] = b.Renew(ctx, r)
	}
	return errs
}
