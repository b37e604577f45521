// Package memlease is a lease backend that keeps leases in this process's
// memory (driver.Backend, with every optional capability). It serves unit
// tests and runnable examples: it gives no protection across processes. It
// passes the conformance suite (lease/leasetest) like every backend.
package memlease

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/fencekit/fencekit/fence"
	"github.com/fencekit/fencekit/lease/driver"
)

// Backend keeps leases in this process's memory. The zero value is not
// usable; call New.
type Backend struct {
	mu       sync.Mutex
	leases   map[string]memGrant
	tokens   map[string]fence.Token
	watchers map[string]map[chan struct{}]struct{}
	ended    map[endedKey]ended // owners ended by Release or Abandon, and how
	lines    map[string][]place // waiters in arrival order (driver.Request.Queue)
	floor    fence.Token        // the least token to mint since the last Forget
}

type endedKey struct{ name, owner string }

// ended is how the store ended an owner, and until when it remembers.
type ended struct {
	until    time.Time
	released bool // by a Release that found the grant, or by Abandon; false: a Release found it lost
}

// place is one waiter's place in line, kept until expires unless refreshed.
type place struct {
	owner   string
	expires time.Time
}

type memGrant struct {
	owner   string
	token   fence.Token
	expires time.Time
}

var (
	_ driver.Backend      = (*Backend)(nil)
	_ driver.Watcher      = (*Backend)(nil)
	_ driver.BatchRenewer = (*Backend)(nil)
	_ driver.Inspector    = (*Backend)(nil)
	_ driver.Checker      = (*Backend)(nil)
)

// New returns an empty in-memory backend.
func New() *Backend {
	return &Backend{
		leases:   make(map[string]memGrant),
		tokens:   make(map[string]fence.Token),
		watchers: make(map[string]map[chan struct{}]struct{}),
		ended:    make(map[endedKey]ended),
		lines:    make(map[string][]place),
	}
}

// line returns the live waiters of name in arrival order, dropping the
// places that lapsed; mu must be held.
func (b *Backend) line(name string, now time.Time) []place {
	l := slices.DeleteFunc(b.lines[name], func(p place) bool { return !now.Before(p.expires) })
	if len(l) == 0 {
		delete(b.lines, name)
		return nil
	}
	b.lines[name] = l
	return l
}

// leave removes owner's place in the line of name and reports whether it
// was first; mu must be held.
func (b *Backend) leave(name, owner string, now time.Time) (first bool) {
	l := b.line(name, now)
	i := slices.IndexFunc(l, func(p place) bool { return p.owner == owner })
	if i < 0 {
		return false
	}
	if l = slices.Delete(l, i, i+1); len(l) == 0 {
		delete(b.lines, name)
	} else {
		b.lines[name] = l
	}
	return i == 0
}

// wait keeps req.Owner's place in the line of req.Name for req.TTL from
// now, at the end for a new waiter, and returns the number of live
// waiters ahead of it and the first one's place; mu must be held.
func (b *Backend) wait(req driver.Request, now time.Time) (ahead int, first place) {
	if len(b.lines) > 1024 {
		for name := range b.lines {
			b.line(name, now) // lines whose waiters all left go
		}
	}
	l := b.line(req.Name, now)
	i := slices.IndexFunc(l, func(p place) bool { return p.owner == req.Owner })
	if i < 0 {
		i = len(l)
		l = append(l, place{owner: req.Owner})
		b.lines[req.Name] = l
	}
	l[i].expires = now.Add(req.TTL)
	return i, l[0]
}

// endedAs returns how owner of name was ended within driver.EndedOwnerTTL, and
// forgets records past it; mu must be held.
func (b *Backend) endedAs(name, owner string, now time.Time) (e ended, ok bool) {
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
func (b *Backend) end(name, owner string, ttl time.Duration, released bool, now time.Time) {
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
	b.ended[k] = ended{until: now.Add(driver.EndedOwnerTTL(ttl)), released: released}
}

// free deletes the grant of name and wakes its waiters; mu must be held.
func (b *Backend) free(name string) {
	delete(b.leases, name)
	b.wake(name)
}

// wake signals the watchers of name; mu must be held.
func (b *Backend) wake(name string) {
	for ch := range b.watchers[name] {
		select {
		case ch <- struct{}{}:
		default:
		}
	}
}

// current returns the live grant of name; mu must be held.
func (b *Backend) current(name string, now time.Time) (memGrant, bool) {
	g, ok := b.leases[name]
	if ok && !now.Before(g.expires) {
		delete(b.leases, name)
		return memGrant{}, false
	}
	return g, ok
}

// Limits implements driver.Backend: any whole number of milliseconds, and
// waiters kept in line (Request.Queue): the name goes to the oldest live
// waiter when it is free.
func (b *Backend) Limits() driver.Limits {
	return driver.Limits{MinTTL: time.Millisecond, Resolution: time.Millisecond, Queues: true}
}

// Acquire implements driver.Backend.
func (b *Backend) Acquire(ctx context.Context, req driver.Request) (driver.Grant, error) {
	if err := ctx.Err(); err != nil {
		return driver.Grant{}, err
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	now := time.Now()
	if _, ok := b.endedAs(req.Name, req.Owner, now); ok {
		return driver.Grant{}, fmt.Errorf("%w: %q: owner %q was released or abandoned", driver.ErrNotAcquired, req.Name, req.Owner)
	}
	if g, ok := b.current(req.Name, now); ok {
		if g.owner != req.Owner {
			if req.Queue {
				b.wait(req, now)
			}
			return driver.Grant{}, &driver.NotAcquiredError{Name: req.Name, RetryAfter: g.expires.Sub(now),
				Holder: driver.Holder{Name: req.Name, Owner: g.owner, Token: g.token, Remaining: g.expires.Sub(now)}}
		}
		g.expires = now.Add(req.TTL)
		b.leases[req.Name] = g
		return driver.Grant{Name: req.Name, Owner: req.Owner, Token: g.token, TTL: req.TTL}, nil
	}
	if req.Queue {
		if ahead, first := b.wait(req, now); ahead > 0 {
			return driver.Grant{}, &driver.NotAcquiredError{Name: req.Name, RetryAfter: first.expires.Sub(now), Ahead: ahead}
		}
		b.leave(req.Name, req.Owner, now)
	}
	tok := max(b.tokens[req.Name]+1, b.floor)
	b.tokens[req.Name] = tok
	b.leases[req.Name] = memGrant{owner: req.Owner, token: tok, expires: now.Add(req.TTL)}
	return driver.Grant{Name: req.Name, Owner: req.Owner, Token: tok, TTL: req.TTL}, nil
}

// holds reports whether the store names g's owner and token as the live
// holder of g.Name; mu must be held.
func (b *Backend) holds(g driver.Grant, now time.Time) (memGrant, bool) {
	cur, ok := b.current(g.Name, now)
	return cur, ok && cur.owner == g.Owner && cur.token == g.Token
}

// Renew implements driver.Backend.
func (b *Backend) Renew(ctx context.Context, g driver.Grant) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	now := time.Now()
	cur, ok := b.holds(g, now)
	if !ok {
		return driver.ErrNotHeld
	}
	cur.expires = now.Add(g.TTL)
	b.leases[g.Name] = cur
	return nil
}

// Release implements driver.Backend.
func (b *Backend) Release(ctx context.Context, g driver.Grant) error {
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
	return driver.ErrNotHeld
}

// Abandon implements driver.Backend.
func (b *Backend) Abandon(ctx context.Context, req driver.Request) error {
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
	if _, held := b.current(req.Name, now); b.leave(req.Name, req.Owner, now) && !held {
		b.wake(req.Name) // the name is free, and the next waiter is first now
	}
	return nil
}

// Watch implements driver.Watcher.
func (b *Backend) Watch(ctx context.Context, name string) (<-chan struct{}, func(), error) {
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

// RenewBatch implements driver.BatchRenewer.
func (b *Backend) RenewBatch(ctx context.Context, gs []driver.Grant, done func(int, error)) {
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
func (b *Backend) Forget() {
	b.mu.Lock()
	defer b.mu.Unlock()
	clear(b.leases)
	clear(b.tokens)
	clear(b.ended)
	clear(b.lines)
	b.floor = max(b.floor, fence.Token(time.Now().UnixNano()))
}

// Check implements driver.Checker: the memory store is always set up.
func (b *Backend) Check(ctx context.Context) error { return ctx.Err() }

// Holder implements driver.Inspector.
func (b *Backend) Holder(ctx context.Context, name string) (driver.Holder, error) {
	if err := ctx.Err(); err != nil {
		return driver.Holder{}, err
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	now := time.Now()
	g, ok := b.current(name, now)
	if !ok {
		return driver.Holder{}, driver.ErrNotHeld
	}
	return driver.Holder{Name: name, Owner: g.owner, Token: g.token, Remaining: g.expires.Sub(now)}, nil
}
