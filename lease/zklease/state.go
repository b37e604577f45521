package zklease

import (
	"context"
	"sync"
	"time"

	"github.com/fencekit/fencekit/fence"
	"github.com/fencekit/fencekit/lease/driver"
)

// nameState is what the backend keeps for one lease name. Its fields are
// guarded by Backend.mu, except lock.
type nameState struct {
	name, parent string
	// lock is held (a value sent) by the one operation doing I/O for this
	// name; operations of one name run one at a time, each to its end,
	// even when its caller has gone (see run).
	lock chan struct{}

	ops    int                  // operations started and not finished
	grants map[string]*grantRec // live grants of this backend, by owner
	ticket *ticket              // this backend's place in the queue, for its waiters
	subs   map[*sub]struct{}    // Watch subscriptions
	ttl    time.Duration        // the TTL of the last acquire request of the name (0: none yet)
	places map[string]*place    // this backend's places in the name's line, by owner (line.go)
	line   bool                 // a queued acquire of the name was seen: Watch puts no ticket in the holder queue
}

// settleTime is how long a create for ns whose answer was lost may stay
// unsettled before the backend ends its session (findCreated): the TTL of
// the name's last acquire request, or the session timeout.
func (b *Backend) settleTime(ns *nameState) time.Duration {
	b.mu.Lock()
	defer b.mu.Unlock()
	if ns.ttl > 0 {
		return ns.ttl
	}
	return b.o.SessionTimeout
}

func (ns *nameState) idle() bool {
	return ns.ops == 0 && len(ns.grants) == 0 && ns.ticket == nil && len(ns.subs) == 0 && len(ns.places) == 0
}

// grantRec is one grant made by this backend: the opaque driver.Grant.State.
// Its first fields never change; they mirror the node at the store, whose
// name (with a random GUID) is never reused, and whose czxid and data never
// change.
type grantRec struct {
	b       *Backend
	name    string
	owner   string
	path    string
	token   fence.Token
	session int64
	ttl     time.Duration
	notify  driver.Notifier

	// Guarded by Backend.mu.
	base     time.Time // send time of the last request that confirmed the grant
	timer    *time.Timer
	ended    bool // expired here, lost with its session, or released
	expired  bool // ended here at its TTL (expire)
	released bool // ended by a Release or Abandon whose outcome was a release: recorded at the store
}

// ticket is this backend's node in a lease's queue while it has waiters
// (Watch subscriptions). Only its predecessor is watched. When it becomes
// the lowest node, the next acquire attempt of this backend turns it into a
// grant.
type ticket struct {
	path    string
	czxid   int64
	session int64
	data    string // what the node holds (waitingData, or the owner it was created for)
	// predGone is set when the watched predecessor was deleted (or the
	// watch was lost): the next attempt must list the queue again.
	predGone bool
	pred     string // the watched predecessor's path, a key of Backend.watching
	stopped  bool
}

// dropLocked ends ticket t; b.mu must be held.
func (b *Backend) dropLocked(t *ticket) {
	t.stopped = true
	if t.pred != "" {
		if w, ok := b.watching[t.pred]; ok && w.t == t {
			delete(b.watching, t.pred)
		}
	}
}

// sub is one Watch subscription.
type sub struct{ ch chan struct{} }

func (s *sub) signal() {
	select {
	case s.ch <- struct{}{}:
	default:
	}
}

// signalLocked wakes every subscriber of ns; b.mu must be held.
func signalLocked(ns *nameState) {
	for s := range ns.subs {
		s.signal()
	}
}

// nameLocked returns the state of name, creating it; b.mu must be held.
func (b *Backend) nameLocked(name string) *nameState {
	ns := b.names[name]
	if ns == nil {
		ns = &nameState{name: name, parent: ParentPath(b.o.Root, name), lock: make(chan struct{}, 1),
			grants: map[string]*grantRec{}, subs: map[*sub]struct{}{}, places: map[string]*place{}}
		b.names[name] = ns
	}
	return ns
}

// forgetIfIdleLocked removes ns from the map when nothing refers to it;
// b.mu must be held.
func (b *Backend) forgetIfIdleLocked(ns *nameState) {
	if ns.idle() && b.names[ns.name] == ns {
		delete(b.names, ns.name)
	}
}

// dropSessionLocked ends everything of session id (every session for -1):
// its grants are ended and their notifiers returned (the caller reports them
// lost, outside the lock), its tickets are dropped and their waiters woken
// to queue again on the new session. b.mu must be held.
func (b *Backend) dropSessionLocked(id int64) []driver.Notifier {
	var lost []driver.Notifier
	for _, ns := range b.names {
		for owner, rec := range ns.grants {
			if id == -1 || rec.session == id {
				rec.endLocked()
				delete(ns.grants, owner)
				if rec.notify != nil {
					lost = append(lost, rec.notify)
				}
			}
		}
		for owner, p := range ns.places {
			if id == -1 || p.session == id {
				// Gone with its session: the waiter's next attempt joins
				// the line again.
				p.timer.Stop()
				delete(ns.places, owner)
				signalLocked(ns)
			}
		}
		if t := ns.ticket; t != nil && (id == -1 || t.session == id) {
			b.dropLocked(t)
			ns.ticket = nil
			signalLocked(ns)
		}
		b.forgetIfIdleLocked(ns)
	}
	return lost
}

func (r *grantRec) endLocked() {
	r.ended = true
	if r.timer != nil {
		r.timer.Stop()
	}
}

// startOp counts an operation on name, which the caller then runs in a
// goroutine that calls endOp. It reports false after Close.
func (b *Backend) startOp(name string) (*nameState, bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.isClosed {
		return nil, false
	}
	ns := b.nameLocked(name)
	ns.ops++
	b.wg.Add(1)
	return ns, true
}

// endOp ends an operation started with startOp.
func (b *Backend) endOp(ns *nameState) {
	b.mu.Lock()
	ns.ops--
	b.forgetIfIdleLocked(ns)
	b.mu.Unlock()
	b.wg.Done()
}

// result is what an operation returns to its caller.
type result[T any] struct {
	v   T
	err error
}

// run executes fn with the op lock of name held, in a goroutine of its own,
// and returns its result. If ctx ends first, run returns ctx's error at once
// and the operation still runs to its end; undo (if not nil) is then called
// with its result, still under the lock, to give back what nobody will use
// (a node created for a caller that left). An operation that has not got
// the lock when ctx ends is not started.
func run[T any](b *Backend, ctx context.Context, name string, fn func(*nameState) (T, error), undo func(*nameState, T, error)) (T, error) {
	var zero T
	ns, ok := b.startOp(name)
	if !ok {
		return zero, ErrClosed
	}

	var (
		mu   sync.Mutex
		gone bool
		ch   = make(chan result[T], 1)
	)
	go func() {
		defer b.endOp(ns)
		select {
		case ns.lock <- struct{}{}:
		case <-ctx.Done():
			return
		case <-b.closed:
			ch <- result[T]{err: ErrClosed}
			return
		}
		defer func() { <-ns.lock }()
		mu.Lock()
		g := gone
		mu.Unlock()
		if g {
			return
		}
		v, err := fn(ns)
		mu.Lock()
		if gone {
			mu.Unlock()
			if undo != nil {
				undo(ns, v, err)
			}
			return
		}
		ch <- result[T]{v, err}
		mu.Unlock()
	}()
	select {
	case r := <-ch:
		return r.v, b.setup(r.err)
	case <-ctx.Done():
		mu.Lock()
		defer mu.Unlock()
		select {
		case r := <-ch: // answered just before the context ended
			return r.v, b.setup(r.err)
		default:
			gone = true
			return zero, ctx.Err()
		}
	}
}

// background runs fn with the op lock of name held, in a goroutine of its
// own, for work no caller waits for (deleting a node that expired or a
// ticket nobody needs). It does nothing after Close.
func (b *Backend) background(name string, fn func(*nameState)) {
	ns, ok := b.startOp(name)
	if !ok {
		return
	}
	go func() {
		defer b.endOp(ns)
		select {
		case ns.lock <- struct{}{}:
		case <-b.closed:
			return
		}
		defer func() { <-ns.lock }()
		fn(ns)
	}()
}
