package lease

import (
	"context"
	"fmt"
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
	ended    map[endedKey]ended // owners ended by Release or Abandon, and how
	floor    fence.Token        // the least token to mint since the last Forget
}

type endedKey struct{ name, owner string }

// ended is how the store ended an owner, and until when it remembers.
type ended struct {
	until    time.Time
	released bool // by a Release that found the grant, or by Abandon; false: a Release found it lost
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
	_ Inspector    = (*MemoryBackend)(nil)
	_ Checker      = (*MemoryBackend)(nil)
)

// NewMemoryBackend returns an empty in-memory backend.
func NewMemoryBackend() *MemoryBackend {
	return &MemoryBackend{
		leases:   make(map[string]memGrant),
		tokens:   make(map[string]fence.Token),
		watchers: make(map[string]map[chan struct{}]struct{}),
		ended:    make(map[endedKey]ended),
	}
}

// endedAs returns how owner of name was ended within EndedOwnerTTL, and
// forgets records past it; mu must be held.
func (b *MemoryBackend) endedAs(name, owner string, now time.Time) (e ended, ok bool) {
	k := endedKey{name, owner}
	e, ok = b.ended[k]
	if ok && !now.Before(e.until) {
		delete(b.ended, k)
		return ended{}, false
	}
	return e, ok
}

// end records owner of name as ended; a record that it was released is
// kept. mu must be held.
func (b *MemoryBackend) end(name, owner string, ttl time.Duration, released bool, now time.Time) {
	if len(b.ended) > 1024 {
		for k, e := range b.ended {
			if !now.Before(e.until) {
				delete(b.ended, k)
			}
		}
	}
	k := endedKey{name, owner}
	if e, ok := b.endedAs(name, owner, now); ok && e.released {
		released = true
	}
	b.ended[k] = ended{until: now.Add(EndedOwnerTTL(ttl)), released: released}
}

// free deletes the grant of name and wakes its waiters; mu must be held.
func (b *MemoryBackend) free(name string) {
	delete(b.leases, name)
	for ch := range b.watchers[name] {
		select {
		case ch <- struct{}{}:
		default:
		}
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

// Limits implements Backend: any whole number of milliseconds.
func (b *MemoryBackend) Limits() Limits {
	return Limits{MinTTL: time.Millisecond, Resolution: time.Millisecond}
}

// Acquire implements Backend.
func (b *MemoryBackend) Acquire(ctx context.Context, req Request) (Grant, error) {
	if err := ctx.Err(); err != nil {
		return Grant{}, err
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	now := time.Now()
	if _, ok := b.endedAs(req.Name, req.Owner, now); ok {
		return Grant{}, fmt.Errorf("%w: %q: owner %q was released or abandoned", ErrNotAcquired, req.Name, req.Owner)
	}
	if g, ok := b.current(req.Name, now); ok {
		if g.owner != req.Owner {
			return Grant{}, &NotAcquiredError{Name: req.Name, RetryAfter: g.expires.Sub(now)}
		}
		g.expires = now.Add(req.TTL)
		b.leases[req.Name] = g
		return Grant{Name: req.Name, Owner: req.Owner, Token: g.token, TTL: req.TTL}, nil
	}
	tok := max(b.tokens[req.Name]+1, b.floor)
	b.tokens[req.Name] = tok
	b.leases[req.Name] = memGrant{owner: req.Owner, token: tok, expires: now.Add(req.TTL)}
	return Grant{Name: req.Name, Owner: req.Owner, Token: tok, TTL: req.TTL}, nil
}

// holds reports whether the store names g's owner and token as the live
// holder of g.Name; mu must be held.
func (b *MemoryBackend) holds(g Grant, now time.Time) (memGrant, bool) {
	cur, ok := b.current(g.Name, now)
	return cur, ok && cur.owner == g.Owner && cur.token == g.Token
}

// Renew implements Backend.
func (b *MemoryBackend) Renew(ctx context.Context, g Grant) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	now := time.Now()
	cur, ok := b.holds(g, now)
	if !ok {
		return ErrNotHeld
	}
	cur.expires = now.Add(g.TTL)
	b.leases[g.Name] = cur
	return nil
}

// Release implements Backend.
func (b *MemoryBackend) Release(ctx context.Context, g Grant) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	now := time.Now()
	_, held := b.holds(g, now)
	b.end(g.Name, g.Owner, g.TTL, held, now)
	if held {
		b.free(g.Name)
		return nil
	}
	if e, _ := b.endedAs(g.Name, g.Owner, now); e.released {
		return nil // a resent Release, or one after Abandon: the first was applied
	}
	return ErrNotHeld
}

// Abandon implements Backend.
func (b *MemoryBackend) Abandon(ctx context.Context, req Request) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	now := time.Now()
	b.end(req.Name, req.Owner, req.TTL, true, now)
	if cur, ok := b.current(req.Name, now); ok && cur.owner == req.Owner {
		b.free(req.Name)
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
func (b *MemoryBackend) RenewBatch(ctx context.Context, gs []Grant, done func(int, error)) {
	for i, g := range gs {
		done(i, b.Renew(ctx, g))
	}
}

// Forget drops every grant and every token counter, as a store that lost
// its data would (leasetest's data-loss hook). Tokens still grow across it,
// by the rule package redislease follows with the server clock: from then
// on a token is at least the wall clock at the time of the loss, in
// nanoseconds since the Unix epoch, which is greater than every token
// minted before as long as the clock is not stepped back and fewer grants
// were made than nanoseconds passed. Before the first Forget, tokens count
// 1, 2, 3 per name.
func (b *MemoryBackend) Forget() {
	b.mu.Lock()
	defer b.mu.Unlock()
	clear(b.leases)
	clear(b.tokens)
	clear(b.ended)
	b.floor = max(b.floor, fence.Token(time.Now().UnixNano()))
}

// Check implements Checker: the memory store is always set up.
func (b *MemoryBackend) Check(ctx context.Context) error { return ctx.Err() }

// Holder implements Inspector.
func (b *MemoryBackend) Holder(ctx context.Context, name string) (Holder, error) {
	if err := ctx.Err(); err != nil {
		return Holder{}, err
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	now := time.Now()
	g, ok := b.current(name, now)
	if !ok {
		return Holder{}, ErrNotHeld
	}
	return Holder{Name: name, Owner: g.owner, Token: g.token, Remaining: g.expires.Sub(now)}, nil
}
