package etcdlease

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/fencekit/fencekit/lease/driver"
)

// Watch implements driver.Watcher. The waiters of one name in one Backend
// share one etcd watch on the lease's key, for deletions only (a release,
// an expiry, a revoke). Each deletion wakes one of them, the one that has
// waited longest without a signal, rather than all: the lease can go to one
// holder only, and the others would only send refused attempts. When the
// Backend keeps places in line for the name (Request.Queue), a deletion
// wakes the waiter that began to watch first, in the line's order; if it
// is not the first in line (the line's order and the watches' differ), it
// passes the wake on to the next, at most once per waiter. (A waiter
// that stops with a signal it did not take passes it on.) Other processes'
// waiters have watches of their own. Watch returns once etcd has confirmed
// that the watch is created, bounded by ctx: when ctx ends first (the
// confirmation is lost, the member does not answer), Watch returns ctx's
// error at once, and the etcd watch is cancelled if no other waiter shares
// it, its goroutine ending with it (TestWatchWithoutConfirmationHonoursContext).
// The watch requires a leader:
// when the member the client talks to loses its leader, the watch ends and
// every waiter is signalled, so that each tries again (and then polls).
func (b *Backend) Watch(ctx context.Context, name string) (<-chan struct{}, func(), error) {
	w := &waiter{ch: make(chan struct{}, 1)}
	b.mu.Lock()
	if b.closed {
		b.mu.Unlock()
		return nil, nil, ErrClosed
	}
	nw := b.watches[name]
	if nw == nil {
		// A name with places in line (line.go) is watched for puts too:
		// a Release that hands the name over overwrites the key.
		nw = &nameWatch{ready: make(chan struct{}), line: b.hasPlaces(name) || b.waitingFor(name)}
		if b.watches == nil {
			b.watches = make(map[string]*nameWatch)
		}
		b.watches[name] = nw
		wctx, cancel := context.WithCancel(clientv3.WithRequireLeader(b.ctx))
		nw.cancel = cancel
		b.wg.Add(1)
		go b.runNameWatch(wctx, name, nw)
	}
	nw.waiters = append(nw.waiters, w)
	b.mu.Unlock()

	var once sync.Once
	stop := func() { once.Do(func() { b.leave(name, nw, w) }) }
	select {
	case <-nw.ready:
	case <-ctx.Done():
		stop()
		return nil, nil, ctx.Err()
	}
	if nw.err != nil {
		stop()
		return nil, nil, nw.err
	}
	return w.ch, stop, nil
}

// nameWatch is the etcd watch that the waiters of one name share.
type nameWatch struct {
	cancel  context.CancelFunc
	ready   chan struct{} // closed once etcd confirmed the watch, or it failed (err)
	err     error
	waiters []*waiter // oldest first; guarded by Backend.mu
	ended   bool      // the etcd watch ended; guarded by Backend.mu
	passes  int       // wakes a refused waiter in line may still pass on (line.go); guarded by Backend.mu
	next    int       // the index in waiters of the next to wake when a wake is passed on; guarded by Backend.mu
	line    bool      // created for waiters in line: puts are watched too, for hand-overs (line.go)
	// from is the revision etcd was at when it created the watch (events
	// after it are delivered), last the revision of the last event it
	// delivered; both guarded by Backend.mu (stillRefused, line.go).
	from, last int64
}

type waiter struct{ ch chan struct{} }

// runNameWatch runs the etcd watch of nw until it ends (its last waiter
// left, the backend closed, or etcd ended it).
func (b *Backend) runNameWatch(ctx context.Context, name string, nw *nameWatch) {
	defer b.wg.Done()
	opts := []clientv3.OpOption{clientv3.WithCreatedNotify()}
	if !nw.line {
		opts = append(opts, clientv3.WithFilterPut())
	}
	wch := b.c.Watch(ctx, b.Key(name), opts...)
	resp, ok := <-wch
	switch {
	case !ok:
		nw.err = fmt.Errorf("etcdlease: watch %q: the watch ended before it was created: %w", name, errors.Join(ctx.Err(), ErrClosed))
	case resp.Err() != nil:
		nw.err = fmt.Errorf("etcdlease: watch %q: %w", name, b.setup(resp.Err()))
	case !resp.Created:
		nw.err = fmt.Errorf("etcdlease: watch %q: the first response did not confirm the watch", name)
	default:
		b.mu.Lock()
		nw.from = resp.Header.Revision
		b.mu.Unlock()
	}
	close(nw.ready)
	if nw.err == nil {
		for resp := range wch {
			if resp.Err() != nil || resp.Canceled {
				break
			}
			if len(resp.Events) > 0 {
				b.mu.Lock()
				for _, ev := range resp.Events {
					nw.last = max(nw.last, ev.Kv.ModRevision)
				}
				b.mu.Unlock()
			}
			if wake := b.wakesFor(name, resp.Events); wake {
				b.mu.Lock()
				if len(nw.waiters) > 0 && (b.hasPlaces(name) || b.waitingFor(name)) {
					// Waiters in line (line.go): only the first in line
					// can win. This Backend's waiters joined the line in
					// the order they began to watch, so the oldest is
					// woken (and stays where it is); refused for a waiter
					// ahead, it passes the wake on to the next
					// (passWake), at most once per other waiter.
					nw.passes, nw.next = len(nw.waiters)-1, 1
					signal(nw.waiters[0].ch)
				} else {
					nw.signalOne()
				}
				b.mu.Unlock()
			}
		}
	}
	// Ended: by its last waiter or the backend (nothing to tell), or by
	// etcd (a lost leader, a closed client: every waiter looks again).
	// Later waiters of the name get a new watch.
	b.mu.Lock()
	nw.ended = true
	if b.watches[name] == nw {
		delete(b.watches, name)
	}
	for _, w := range nw.waiters {
		signal(w.ch)
	}
	b.mu.Unlock()
	nw.cancel()
	for range wch { // closed by the client once the cancel is through
	}
}

// wakesFor reports whether events on the key of name should wake a waiter:
// a deletion does, and so does a hand-over to one of this Backend's waiters
// (recorded for its next attempt, line.go); a put that grants the name
// does not.
func (b *Backend) wakesFor(name string, events []*clientv3.Event) bool {
	wake := false
	for _, ev := range events {
		if ev.Type == mvccpb.DELETE {
			wake = true
			continue
		}
		b.mu.Lock()
		b.placesLeft(name, string(ev.Kv.Value))
		if b.sawHandover(name, ev.Kv) {
			wake = true
		}
		b.mu.Unlock()
	}
	return wake
}

// signalOne wakes the waiter that has waited longest without a signal, and
// moves it to the back. Backend.mu must be held.
func (nw *nameWatch) signalOne() {
	for i, w := range nw.waiters {
		if len(w.ch) == 0 {
			signal(w.ch)
			nw.waiters = append(append(nw.waiters[:i:i], nw.waiters[i+1:]...), w)
			return
		}
	}
}

func signal(ch chan struct{}) {
	select {
	case ch <- struct{}{}:
	default:
	}
}

// leave removes w from nw. A signal w did not take goes to another waiter;
// the last waiter to leave ends the etcd watch.
func (b *Backend) leave(name string, nw *nameWatch, w *waiter) {
	b.mu.Lock()
	defer b.mu.Unlock()
	for i, x := range nw.waiters {
		if x == w {
			nw.waiters = append(nw.waiters[:i:i], nw.waiters[i+1:]...)
			break
		}
	}
	if len(w.ch) > 0 && !nw.ended {
		nw.signalOne()
	}
	if len(nw.waiters) == 0 {
		if b.watches[name] == nw {
			delete(b.watches, name)
		}
		nw.cancel()
	}
}

// heldWatch watches a held grant's key, so that a loss the store makes (an
// expiry, a revoke, a deletion) ends the lease at once.
type heldWatch struct {
	releasing atomic.Bool // set by Release before it revokes: the deletion to come is its own
	cancel    context.CancelFunc
}

// heldRetry is the pause before a held grant's watch is made again after it
// ended without news (the client reconnecting, say).
const heldRetry = 100 * time.Millisecond

// watchHeld starts watching st's key from the revision after its creation:
// a deletion, or a put by anyone else, that happens after the grant is seen
// even if the watch is created later. It ends when the loss is reported,
// when Release stops it, or when the backend closes.
func (b *Backend) watchHeld(st *grantState, n driver.Notifier) *heldWatch {
	ctx, cancel := context.WithCancel(b.ctx)
	h := &heldWatch{cancel: cancel}
	b.mu.Lock()
	if b.closed {
		b.mu.Unlock()
		cancel()
		return h
	}
	b.wg.Add(1)
	b.mu.Unlock()
	go func() {
		defer b.wg.Done()
		from := st.rev + 1
		for {
			next, cause := b.followHeld(ctx, st, from)
			if cause != nil && !h.releasing.Load() {
				n.Lost(cause)
			}
			if cause != nil || ctx.Err() != nil {
				return
			}
			from = next
			select {
			case <-ctx.Done():
				return
			case <-time.After(heldRetry):
			}
		}
	}()
	return h
}

// followHeld watches st's key from revision from until the watch ends. It
// returns the revision to watch from next, and the cause of a loss if the
// key was deleted or overwritten.
func (b *Backend) followHeld(ctx context.Context, st *grantState, from int64) (next int64, lost error) {
	ctx, cancel := context.WithCancel(ctx)
	wch := b.c.Watch(ctx, st.key, clientv3.WithRev(from))
	defer func() {
		cancel()
		for range wch { // closed by the client once the cancel is through
		}
	}()
	for resp := range wch {
		if resp.CompactRevision > 0 {
			// The history from "from" on is compacted: look at the key as
			// it is now, and watch on from there.
			next, err := b.checkHeld(ctx, st)
			if errors.Is(err, driver.ErrNotHeld) {
				return from, err
			}
			if err == nil {
				from = next
			}
			return from, nil
		}
		for _, ev := range resp.Events {
			from = ev.Kv.ModRevision + 1
			switch {
			case ev.Type == mvccpb.DELETE:
				return from, fmt.Errorf("%w: %q: its key was deleted at revision %d (the etcd lease expired or was revoked, or the key was deleted)", driver.ErrNotHeld, st.key, ev.Kv.ModRevision)
			case ev.Kv.ModRevision != st.rev || clientv3.LeaseID(ev.Kv.Lease) != st.id || string(ev.Kv.Value) != st.owner:
				return from, fmt.Errorf("%w: %q: its key was overwritten at revision %d", driver.ErrNotHeld, st.key, ev.Kv.ModRevision)
			}
		}
	}
	return from, nil
}

// checkHeld reads st's key and returns the revision to watch from, or an
// error matching driver.ErrNotHeld if the key is no longer st's.
func (b *Backend) checkHeld(ctx context.Context, st *grantState) (int64, error) {
	resp, err := b.c.Get(ctx, st.key)
	if err != nil {
		return 0, err
	}
	if len(resp.Kvs) == 0 || resp.Kvs[0].ModRevision != st.rev || clientv3.LeaseID(resp.Kvs[0].Lease) != st.id {
		return 0, fmt.Errorf("%w: %q: the key is gone or another grant's", driver.ErrNotHeld, st.key)
	}
	return resp.Header.Revision + 1, nil
}
