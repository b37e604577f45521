package zklease

import (
	"context"
	"errors"
	"sync"

	"github.com/go-zookeeper/zk"
)

// Watch implements driver.Watcher without a herd: the backend puts one node
// of its own (a ticket) in the lease's queue for all its waiters of the
// name, and watches only the node just before it. When that node is
// deleted, one notification reaches this backend alone; its waiters are
// signalled, and the next acquire attempt lists the queue once and turns
// the ticket into a grant if it is now the lowest node (otherwise it
// watches the new predecessor). A release therefore wakes one backend, not
// every waiter of the ensemble.
//
// Watch returns once the ticket is in the queue and its predecessor's watch
// is set (a release after that is signalled); if the ticket is already the
// lowest node, the channel is signalled at once. stop ends the subscription;
// when the last subscription of the name ends, the ticket is deleted. A
// lost session drops the ticket and signals the waiters, whose next
// attempt queues again. ctx bounds the requests of the subscription only.
// Errors: ErrClosed, go-zookeeper's errors (wrapped), ctx's error
// (wrapped).
func (b *Backend) Watch(ctx context.Context, name string) (<-chan struct{}, func(), error) {
	s := &sub{ch: make(chan struct{}, 1)}
	_, err := run(b, ctx, name, func(ns *nameState) (struct{}, error) {
		b.mu.Lock()
		ns.subs[s] = struct{}{}
		t := ns.ticket
		if t != nil && t.predGone {
			s.signal()
		}
		line := ns.line
		b.mu.Unlock()
		if t != nil || line {
			// Queued waiters (line.go) need no ticket: their places
			// are nodes of the queue, and their attempts watch the node
			// ahead.
			return struct{}{}, nil
		}
		if err := b.queue(ns); err != nil {
			b.mu.Lock()
			delete(ns.subs, s)
			b.mu.Unlock()
			return struct{}{}, err
		}
		return struct{}{}, nil
	}, func(ns *nameState, _ struct{}, err error) {
		if err == nil {
			b.unsubscribe(ns, s)
		}
	})
	if err != nil {
		if ctx.Err() != nil && errors.Is(err, ctx.Err()) {
			return nil, nil, ctxErr("watch", name, ctx)
		}
		return nil, nil, err
	}
	var once sync.Once
	stop := func() {
		once.Do(func() { b.background(name, func(ns *nameState) { b.unsubscribe(ns, s) }) })
	}
	return s.ch, stop, nil
}

// queue puts a ticket for ns in the queue and watches its predecessor; it
// runs under the name's op lock.
func (b *Backend) queue(ns *nameState) error {
	b.mu.Lock()
	data := b.ticketDataLocked(ns.name)
	b.mu.Unlock()
	n, err := b.create(ns, data, "", b.settleTime(ns))
	if err != nil {
		return err
	}
	kids, err := b.list(ns)
	if err != nil {
		b.deleteSure(n.path)
		return err
	}
	i := position(kids, baseName(n.path))
	if i < 0 {
		return errors.New("zklease: watch " + ns.name + ": the ticket vanished right after it was created (its session ended?)")
	}
	t := &ticket{path: n.path, czxid: n.czxid, session: n.session, data: n.data}
	b.mu.Lock()
	ns.ticket = t
	if i == 0 {
		t.predGone = true
		signalLocked(ns)
	}
	b.mu.Unlock()
	if i == 0 {
		return nil
	}
	if err := b.watchPred(ns, t, kids[i-1]); err != nil {
		b.dropTicket(ns, t)
		return err
	}
	return nil
}

// watchPred sets a watch on the node before ticket t. If that node is
// already gone, t is marked so and the waiters are signalled; otherwise the
// notification is handled by onEvent, on go-zookeeper's receiving
// goroutine, with no goroutine of ours in between. The watch is registered
// with the backend before the request goes out, so a notification that
// follows the answer at once is not missed. It runs under the name's op
// lock.
func (b *Backend) watchPred(ns *nameState, t *ticket, pred child) error {
	path := ns.parent + "/" + pred.name
	b.mu.Lock()
	if ns.ticket != t || t.stopped || b.isClosed {
		b.mu.Unlock()
		return nil
	}
	if t.pred != "" {
		delete(b.watching, t.pred)
	}
	t.pred, t.predGone = path, false
	b.watching[path] = watchEntry{ns: ns, t: t}
	b.mu.Unlock()
	ok, _, _, err := b.conn.ExistsW(path)
	b.mu.Lock()
	defer b.mu.Unlock()
	if err != nil || !ok {
		if w, found := b.watching[path]; found && w.t == t {
			delete(b.watching, path)
		}
		if err == nil && ns.ticket == t {
			t.predGone = true
			signalLocked(ns)
		}
	}
	return err
}

// watchEntry is a ticket waiting for its predecessor's notification.
type watchEntry struct {
	ns *nameState
	t  *ticket
}

// onNodeEvent handles a watch notification (or the loss of a watch) for
// path: the ticket that watched it is marked and its waiters signalled. A
// change of the predecessor's data (its owner written after a hand-off to
// it) wakes no one: the watch is set again. It runs on go-zookeeper's
// receiving goroutine and must not block.
func (b *Backend) onNodeEvent(path string, typ zk.EventType) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.onLineEventLocked(path, typ)
	w, ok := b.watching[path]
	if !ok {
		return
	}
	if typ == zk.EventNodeDataChanged {
		name, t := w.ns.name, w.t
		b.mu.Unlock()
		b.background(name, func(ns *nameState) { b.rewatch(ns, t, path) })
		b.mu.Lock()
		return
	}
	delete(b.watching, path)
	if w.ns.ticket == w.t {
		b.notified.Add(1)
		w.t.predGone = true
		signalLocked(w.ns)
	}
}

// rewatch sets the watch on ticket t's predecessor again after it fired
// for a data change; it runs under the name's op lock.
func (b *Backend) rewatch(ns *nameState, t *ticket, path string) {
	b.mu.Lock()
	current := ns.ticket == t && t.pred == path && !t.stopped
	b.mu.Unlock()
	if !current {
		return
	}
	ok, _, _, err := b.conn.ExistsW(path)
	if err == nil && ok {
		return
	}
	// Gone meanwhile, or the watch could not be set: let the waiters look.
	b.onNodeEvent(path, zk.EventNodeDeleted)
}

// dropTicket removes ticket t and deletes its node; it runs under the
// name's op lock.
func (b *Backend) dropTicket(ns *nameState, t *ticket) {
	b.mu.Lock()
	b.dropLocked(t)
	if ns.ticket == t {
		ns.ticket = nil
	}
	b.mu.Unlock()
	b.deleteSure(t.path)
}

// unsubscribe ends subscription s, and deletes the ticket when it was the
// last one; it runs under the name's op lock.
func (b *Backend) unsubscribe(ns *nameState, s *sub) {
	b.mu.Lock()
	delete(ns.subs, s)
	t := ns.ticket
	last := len(ns.subs) == 0 && t != nil
	b.mu.Unlock()
	if last {
		b.dropTicket(ns, t)
	}
}
