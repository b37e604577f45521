package zklease

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/go-zookeeper/zk"

	"github.com/fencekit/fencekit/fence"
	"github.com/fencekit/fencekit/lease/driver"
)

// checkTTL refuses a TTL the backend cannot honour, before any I/O.
func (b *Backend) checkTTL(ttl time.Duration) error {
	switch {
	case ttl < MinTTL || ttl%time.Millisecond != 0:
		return fmt.Errorf("zklease: TTL %v is not a whole number of milliseconds of at least %v", ttl, MinTTL)
	case ttl > b.o.SessionTimeout:
		return fmt.Errorf("zklease: TTL %v is longer than the session timeout %v that keeps the grant", ttl, b.o.SessionTimeout)
	}
	return nil
}

func notAcquired(name string) error { return &driver.NotAcquiredError{Name: name} }

// Acquire implements driver.Backend. The lease is the lowest node under the
// name's parent:
//
//   - If req.Owner already holds it here (a retry whose answer was lost),
//     one read confirms the node and the grant is returned again.
//   - If this backend has a ticket in the queue (it has waiters, see
//     Watch) and the ticket's predecessor is still there, the answer is
//     ErrNotAcquired without any request. Once the predecessor is gone, one
//     listing tells whether the ticket is the lowest node: then it becomes
//     this owner's grant (its czxid is the token); otherwise the new
//     predecessor is watched.
//   - Otherwise a new node is created (one round trip, which also returns
//     its czxid) and the parent listed: the lowest node is granted; a node
//     that is not the lowest is kept as the ticket if this backend has
//     waiters, and deleted if not. On a name this backend found held in
//     the last few seconds, the parent is synced and listed first, and a
//     non-empty queue refuses the attempt without a write.
//   - With req.Queue, the owner's place is a node of the queue: an owner
//     in line lists it first and is granted when its place is the lowest
//     (no write); otherwise it refreshes its place, or creates one at the
//     end, and is refused (see "Waiters in line" in the package doc); the
//     refusal carries Ahead and RetryAfter when the lowest node is a place.
//
// The grant's TTL is req.TTL, counted from the send time of the request
// that created or confirmed it; the backend deletes the node when that
// passes without a Renew. It never returns a grant on a session whose
// server granted a timeout shorter than the TTL (ErrSessionTimeout).
//
// ctx bounds the wait. If it ends, the requests already sent still run to
// their end, and a node they created for this call is deleted.
//
// Errors: a *driver.NotAcquiredError (ErrNotAcquired) when another owner
// holds or is ahead in the queue; an error naming the TTL's bounds, before
// any I/O; ErrSessionTimeout; ErrSessionReplaced
// when the session changed during the attempt; ErrClosed; go-zookeeper's
// errors, wrapped, those retrying cannot fix (an ACL that refuses the
// backend, see Check) matching driver.ErrSetup; ctx's error, wrapped.
func (b *Backend) Acquire(ctx context.Context, req driver.Request) (driver.Grant, error) {
	if err := b.checkTTL(req.TTL); err != nil {
		return driver.Grant{}, err
	}
	g, err := run(b, ctx, req.Name,
		func(ns *nameState) (driver.Grant, error) { return b.acquire(ctx, ns, req) },
		func(ns *nameState, g driver.Grant, err error) {
			if err == nil {
				b.giveBack(ns, g.State.(*grantRec))
			}
		})
	if err != nil && ctx.Err() != nil && errors.Is(err, ctx.Err()) {
		return driver.Grant{}, ctxErr("acquire", req.Name, ctx)
	}
	return g, err
}

// maxQueueSteps bounds how often one attempt follows a queue that keeps
// changing under it (predecessors leaving one after the other).
const maxQueueSteps = 16

// acquire runs under the name's op lock; ctx is the caller's (run goes on
// after it ends, to settle what was sent).
func (b *Backend) acquire(ctx context.Context, ns *nameState, req driver.Request) (driver.Grant, error) {
	if b.endedHere(req.Name, req.Owner) {
		return driver.Grant{}, errOwnerEnded(req.Name, req.Owner)
	}
	b.mu.Lock()
	ns.ttl = req.TTL
	rec := ns.grants[req.Owner]
	b.mu.Unlock()
	if rec != nil {
		err := b.confirm(rec, true)
		if err == nil {
			return rec.grant(), nil
		}
		if !errors.Is(err, driver.ErrNotHeld) {
			return driver.Grant{}, err
		}
	}
	if req.Queue {
		return b.acquireQueued(ns, req)
	}

	for range maxQueueSteps {
		b.mu.Lock()
		t := ns.ticket
		gone := t != nil && t.predGone
		b.mu.Unlock()
		if t == nil {
			break
		}
		if !gone {
			return driver.Grant{}, notAcquired(req.Name)
		}
		// The ticket becomes a grant without a create, so the record of
		// an owner ended through another backend is read here, pipelined
		// with the listing (go-zookeeper sends both at once).
		endedAt := make(chan bool, 1)
		go func() {
			ok, _, err := b.conn.Exists(b.endedPath(req.Name, req.Owner))
			endedAt <- ok || err != nil
		}()
		sent := time.Now()
		kids, err := b.list(ns)
		ended := <-endedAt
		if err != nil {
			return driver.Grant{}, err
		}
		i := position(kids, baseName(t.path))
		if i == 0 && ended {
			// Refused (or the record could not be read): the ticket stays
			// for the backend's next owner.
			return driver.Grant{}, errOwnerEnded(req.Name, req.Owner)
		}
		switch {
		case i < 0:
			// Deleted by someone else (an operator), or its session
			// ended: queue again.
			b.mu.Lock()
			if ns.ticket == t {
				b.dropLocked(t)
				ns.ticket = nil
			}
			b.mu.Unlock()
			continue
		case i == 0:
			if err := b.checkSession(t.session, req.TTL); err != nil {
				return driver.Grant{}, err
			}
			b.mu.Lock()
			if ns.ticket != t {
				b.mu.Unlock()
				continue
			}
			b.dropLocked(t)
			ns.ticket = nil
			rec := b.newGrantLocked(ns, req, t.path, t.czxid, t.session, sent)
			b.mu.Unlock()
			if t.data != req.Owner {
				// Name the owner in the node for Holder, with one write
				// after the grant rather than on the hand-off's path.
				path, owner := t.path, req.Owner
				b.background(ns.name, func(*nameState) { _, _ = b.conn.Set(path, []byte(owner), -1) })
			}
			return rec.grant(), nil
		}
		if err := b.watchPred(ns, t, kids[i-1]); err != nil {
			return driver.Grant{}, err
		}
	}

	b.mu.Lock()
	queued := ns.ticket != nil
	listFirst := len(ns.subs) == 0 && b.contendedLocked(ns.name)
	b.mu.Unlock()
	if queued {
		// The queue kept changing for maxQueueSteps listings: the ticket
		// stays, and its waiters are signalled when it moves again.
		return driver.Grant{}, notAcquired(req.Name)
	}
	if listFirst {
		// Found held a moment ago: look before adding a node, which a
		// refused attempt would only delete again (two writes). A read
		// alone may be served by a member that lags (ZooKeeper orders each
		// session, not reads across clients): sync first, so that a
		// release that returned before this attempt began is seen.
		if _, err := b.conn.Sync(ns.parent); err != nil && !errors.Is(err, zk.ErrNoNode) {
			return driver.Grant{}, fmt.Errorf("zklease: acquire %q: sync %s: %w", req.Name, ns.parent, err)
		}
		kids, err := b.list(ns)
		if err != nil {
			return driver.Grant{}, err
		}
		if len(kids) > 0 {
			b.noteContention(ns.name, true, req.Owner)
			return driver.Grant{}, notAcquired(req.Name)
		}
	}
	if err := ctx.Err(); err != nil {
		// The caller left: add no node that nobody waits for.
		return driver.Grant{}, err
	}
	n, err := b.create(ns, req.Owner, req.Owner, req.TTL)
	if err != nil {
		return driver.Grant{}, err
	}
	if err := ctx.Err(); err != nil {
		// The caller left while the create was in flight (its answer came
		// late): give the node back at once, without the listing that
		// would tell whether it heads the queue (another late round trip,
		// during which it could keep the others out).
		b.deleteSure(n.path)
		return driver.Grant{}, err
	}
	kids, err := b.list(ns)
	if err != nil {
		b.deleteSure(n.path)
		return driver.Grant{}, err
	}
	i := position(kids, baseName(n.path))
	b.noteContention(ns.name, i != 0, req.Owner)
	switch {
	case i < 0:
		return driver.Grant{}, fmt.Errorf("zklease: acquire %q: the node %s vanished right after it was created (its session ended?)", req.Name, n.path)
	case i == 0:
		if err := b.checkSession(n.session, req.TTL); err != nil {
			b.deleteSure(n.path)
			return driver.Grant{}, err
		}
		b.mu.Lock()
		rec := b.newGrantLocked(ns, req, n.path, n.czxid, n.session, n.sent)
		b.mu.Unlock()
		return rec.grant(), nil
	}
	b.mu.Lock()
	var t *ticket
	// No ticket for a name with queued waiters here: their places are
	// their tickets, and a ticket, granted only to an acquire without
	// Queue, would keep the name from those behind it.
	if ns.ticket == nil && len(ns.subs) > 0 && !ns.line {
		t = &ticket{path: n.path, czxid: n.czxid, session: n.session, data: n.data}
		ns.ticket = t
	}
	b.mu.Unlock()
	if t == nil {
		b.deleteSure(n.path)
		return driver.Grant{}, notAcquired(req.Name)
	}
	if err := b.watchPred(ns, t, kids[i-1]); err != nil {
		b.dropTicket(ns, t)
		return driver.Grant{}, err
	}
	return driver.Grant{}, notAcquired(req.Name)
}

// contendedFor is how long a name counts as contended after a listing
// showed another node ahead of this backend's.
const contendedFor = 5 * time.Second

// maxContended bounds the names remembered as contended.
const maxContended = 4096

// contention is what the backend remembers of a name it found held.
type contention struct {
	at    time.Time
	owner string // the owner of the refused attempt
}

// noteContention records whether the last listing of name, for owner,
// showed someone ahead. An attempt on a contended name lists the queue
// before it creates a node: a refused attempt then costs a sync and a read
// instead of a create and a delete, and an uncontended one keeps its two
// round trips. Watch names its ticket after the refused owner (the Manager
// subscribes right after a refused attempt, and that owner claims the
// ticket), so that the grant needs no write.
func (b *Backend) noteContention(name string, contended bool, owner string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if !contended {
		delete(b.contended, name)
		return
	}
	if len(b.contended) >= maxContended {
		now := time.Now()
		for n, c := range b.contended {
			if now.Sub(c.at) > contendedFor {
				delete(b.contended, n)
			}
		}
		if len(b.contended) >= maxContended {
			return
		}
	}
	b.contended[name] = contention{at: time.Now(), owner: owner}
}

// contendedLocked reports whether name was found contended recently; b.mu
// must be held.
func (b *Backend) contendedLocked(name string) bool {
	c, ok := b.contended[name]
	return ok && time.Since(c.at) < contendedFor
}

// ticketDataLocked is what a new ticket for name holds: the owner of the
// last refused attempt on it, if recent, else waitingData; b.mu must be
// held.
func (b *Backend) ticketDataLocked(name string) string {
	if c, ok := b.contended[name]; ok && time.Since(c.at) < contendedFor {
		return c.owner
	}
	return b.waitingData()
}

// newGrantLocked records a grant of node path to req.Owner, confirmed by a
// request sent at sent, and starts its TTL timer; b.mu must be held.
func (b *Backend) newGrantLocked(ns *nameState, req driver.Request, path string, czxid, session int64, sent time.Time) *grantRec {
	rec := &grantRec{b: b, name: ns.name, owner: req.Owner, path: path, token: fence.Token(czxid),
		session: session, ttl: req.TTL, notify: req.Notify, base: sent}
	ns.grants[req.Owner] = rec
	rec.timer = time.AfterFunc(time.Until(sent.Add(req.TTL)), rec.expire)
	return rec
}

func fenceToken(czxid int64) fence.Token { return fence.Token(czxid) }

func (r *grantRec) grant() driver.Grant {
	return driver.Grant{Name: r.name, Owner: r.owner, Token: r.token, TTL: r.ttl, State: r}
}

// sessionEnded reports whether the ensemble ended rec's session, and if so
// ends rec. b.session changes only when a session ends at the store (an
// expiry, or a connect answered with another session; sessions never come
// back), so a grant of another session than the current one has lost its
// node with its session.
func (b *Backend) sessionEnded(rec *grantRec) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.session == rec.session {
		return false
	}
	rec.endLocked()
	if ns := b.names[rec.name]; ns != nil && ns.grants[rec.owner] == rec {
		delete(ns.grants, rec.owner)
		b.forgetIfIdleLocked(ns)
	}
	return true
}

// expire runs at the grant's TTL: if no renewal moved it, the grant ends
// and its node is deleted, so that a holder that stopped renewing (its
// work hung, while its session lives on) does not keep the lease.
func (r *grantRec) expire() {
	b := r.b
	b.mu.Lock()
	if r.ended || b.isClosed {
		b.mu.Unlock()
		return
	}
	if d := time.Until(r.base.Add(r.ttl)); d > 0 {
		r.timer.Reset(d)
		b.mu.Unlock()
		return
	}
	r.endLocked()
	r.expired = true
	if ns := b.names[r.name]; ns != nil && ns.grants[r.owner] == r {
		delete(ns.grants, r.owner)
		b.forgetIfIdleLocked(ns)
	}
	b.mu.Unlock()
	b.background(r.name, func(*nameState) { b.deleteSure(r.path) })
}

// giveBack ends a grant nobody will use and deletes its node; it runs
// under the name's op lock.
func (b *Backend) giveBack(ns *nameState, rec *grantRec) {
	b.mu.Lock()
	rec.endLocked()
	if ns.grants[rec.owner] == rec {
		delete(ns.grants, rec.owner)
	}
	b.mu.Unlock()
	b.deleteSure(rec.path)
}

// confirm checks at the store that rec's node still exists, with its
// token, in rec's session, and moves rec's TTL to count from the send time
// of the first request it sent. It returns ErrNotHeld when the node is gone
// or not rec's.
//
// With sync set, a sync goes first: the member this connection talks to
// may be behind the leader (ZooKeeper orders one session's requests, not
// those of different sessions), and without it a member that has not yet
// applied another session's delete (a Revoke, an operator's cleanup)
// would confirm a grant the ensemble already ended. RenewBatch sends one
// sync for the whole batch and confirms each grant without its own.
func (b *Backend) confirm(rec *grantRec, sync bool) error {
	b.mu.Lock()
	ended := rec.ended
	b.mu.Unlock()
	if ended {
		return fmt.Errorf("%w: %q (token %d) expired or was lost here", driver.ErrNotHeld, rec.name, rec.token)
	}
	sent := time.Now()
	if sync {
		if err := b.syncMember(rec.path); err != nil {
			return fmt.Errorf("zklease: renew %q: %w", rec.name, err)
		}
	}
	ok, st, err := b.conn.Exists(rec.path)
	if err != nil {
		return fmt.Errorf("zklease: renew %q: %w", rec.name, err)
	}
	if !ok || st.Czxid != int64(rec.token) || st.EphemeralOwner != rec.session {
		b.mu.Lock()
		rec.endLocked()
		if ns := b.names[rec.name]; ns != nil && ns.grants[rec.owner] == rec {
			delete(ns.grants, rec.owner)
		}
		b.mu.Unlock()
		return fmt.Errorf("%w: %q (token %d): the node %s is gone", driver.ErrNotHeld, rec.name, rec.token, rec.path)
	}
	if err := b.checkSession(rec.session, rec.ttl); err != nil {
		if errors.Is(err, ErrSessionReplaced) {
			return fmt.Errorf("%w: %w", driver.ErrNotHeld, err)
		}
		return err
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if rec.ended {
		// The TTL ran out (and the node is being deleted) while the read
		// was in flight.
		return fmt.Errorf("%w: %q (token %d) expired while it was being renewed", driver.ErrNotHeld, rec.name, rec.token)
	}
	if sent.After(rec.base) {
		rec.base = sent
		rec.timer.Reset(time.Until(sent.Add(rec.ttl)))
	}
	return nil
}

// record returns the grant record of g if g names it exactly, or an error
// matching ErrNotHeld. The record mirrors the store: its node's name is
// unique (a random GUID), and the node's czxid and session never change, so
// comparing owner and token with it compares them with the store.
func record(g driver.Grant) (*grantRec, error) {
	rec, ok := g.State.(*grantRec)
	switch {
	case !ok || rec == nil:
		return nil, fmt.Errorf("%w: %q: the grant was not made by zklease", driver.ErrNotHeld, g.Name)
	case rec.owner != g.Owner || rec.token != g.Token || rec.name != g.Name:
		return nil, fmt.Errorf("%w: %q: the store names owner %q with token %d, not %q with token %d", driver.ErrNotHeld, g.Name, rec.owner, rec.token, g.Owner, g.Token)
	}
	return rec, nil
}

// Renew implements driver.Backend with a sync and one read: after the
// sync has brought the connection's member up to the leader, the node must
// still exist, with the grant's token as its czxid, in this backend's
// current session; the grant's TTL then counts from the sync's send time.
// A grant made by another Backend is renewed by that one (its State names
// it), which keeps its TTL and whose session holds its node.
//
// Errors: driver.ErrNotHeld (wrapped, with the reason) when the node is
// gone, the grant expired here or its session ended, or owner or token do
// not match; ErrSessionTimeout; ErrClosed; go-zookeeper's errors, wrapped;
// ctx's error, wrapped.
func (b *Backend) Renew(ctx context.Context, g driver.Grant) error {
	return b.renew(ctx, g, true)
}

// renew is Renew, with the sync left out when the caller has just sent
// one on this backend's connection (RenewBatch).
func (b *Backend) renew(ctx context.Context, g driver.Grant, sync bool) error {
	rec, err := record(g)
	if err != nil {
		return err
	}
	if rec.b != b {
		// The grant's TTL is kept by the backend that made it (its
		// State names it, in this process): renew it there, after a
		// sync on its own connection.
		return rec.b.renew(ctx, g, true)
	}
	return b.async(ctx, "renew", g.Name, func() error { return b.confirm(rec, sync) })
}

// syncMember sends a sync for path: the member this connection talks to
// answers once it has applied everything the leader had committed when the
// sync reached it, and ZooKeeper answers this session's later reads after
// that. A path that does not exist (a sync names one only to route it) is
// no error.
func (b *Backend) syncMember(path string) error {
	if _, err := b.conn.Sync(path); err != nil && !errors.Is(err, zk.ErrNoNode) {
		return fmt.Errorf("sync: %w", err)
	}
	return nil
}

// async runs fn in a goroutine the backend waits for at Close, and returns
// its result or, if ctx ends first, ctx's error.
func (b *Backend) async(ctx context.Context, op, name string, fn func() error) error {
	b.mu.Lock()
	if b.isClosed {
		b.mu.Unlock()
		return ErrClosed
	}
	b.wg.Add(1)
	b.mu.Unlock()
	done := make(chan error, 1)
	go func() {
		defer b.wg.Done()
		done <- fn()
	}()
	select {
	case err := <-done:
		return b.setup(err)
	case <-ctx.Done():
		return ctxErr(op, name, ctx)
	}
}

// maxBatchInFlight bounds the renew requests RenewBatch has in flight.
const maxBatchInFlight = 64

// RenewBatch implements driver.BatchRenewer: the renewals go out together,
// pipelined on the one connection (go-zookeeper writes each request as
// soon as it is queued and matches the answers), so a batch costs about
// one round trip. ZooKeeper has no multi-read in the protocol version
// go-zookeeper speaks, and a Multi of check operations would be a logged
// write.
// One sync goes first, for the whole batch (see confirm); if it fails,
// each grant is renewed with a sync of its own, so each reports its own
// outcome.
// Each grant's outcome is reported (done) as soon as its answer arrives.
func (b *Backend) RenewBatch(ctx context.Context, gs []driver.Grant, done func(i int, err error)) {
	synced := b.async(ctx, "renew", "", func() error { return b.syncMember(b.o.Root) }) == nil
	sem := make(chan struct{}, maxBatchInFlight)
	var wg sync.WaitGroup
	for i, g := range gs {
		sem <- struct{}{}
		wg.Add(1)
		go func() {
			defer wg.Done()
			err := b.renew(ctx, g, !synced)
			<-sem
			done(i, err)
		}()
	}
	wg.Wait()
}

// Release implements driver.Backend: one transaction (Multi) deletes the
// grant's node if it still exists (its name is unique to the grant, so no
// other grant can be deleted by it), which wakes the one waiter watching
// it, and records the owner as ended (an ephemeral node, see EndedPath), so
// that an acquire of that owner arriving later is refused. One request. A
// grant can be released through any Backend on the same ensemble.
//
// It returns nil when it deleted the node, and when the owner had already
// been ended (its record exists): a transaction whose answer was lost is
// sent again after the client reconnects, and the second finds the node
// gone, deleted by the first, which created the record in the same
// transaction; a release that was applied is a release, never a loss. It
// returns driver.ErrNotHeld when the node is gone without that record
// (expired, lost with its session, deleted by someone else), when the
// grant's TTL ran out here, or when owner or token do not match the grant.
// A second Release of a grant this backend released returns nil without a
// request.
//
// A transaction whose answer is lost is sent again until the server
// answers, even after ctx ended, so the node is never left behind. Other
// errors: ErrClosed, go-zookeeper's errors (wrapped), ctx's error (wrapped).
func (b *Backend) Release(ctx context.Context, g driver.Grant) error {
	rec, err := record(g)
	if err != nil {
		return err
	}
	if rec.b == b {
		b.mu.Lock()
		released := rec.released
		b.mu.Unlock()
		if released {
			return nil
		}
		if b.sessionEnded(rec) {
			// An ephemeral node ends with its session, at the store:
			// nothing to delete, and no need to wait for a server (or for
			// a background delete of the node, which holds the name) to
			// learn it.
			return fmt.Errorf("%w: %q (token %d): its session ended at the store, and the node with it", driver.ErrNotHeld, g.Name, g.Token)
		}
	}
	_, err = run(b, ctx, g.Name, func(ns *nameState) (struct{}, error) {
		var expired bool
		if rec.b == b {
			b.mu.Lock()
			if rec.released {
				b.mu.Unlock()
				return struct{}{}, nil
			}
			expired = rec.expired
			rec.endLocked()
			if ns.grants[rec.owner] == rec {
				delete(ns.grants, rec.owner)
			}
			b.mu.Unlock()
		}
		err := b.releaseNode(g, rec.path, expired)
		if err == nil && rec.b == b {
			b.mu.Lock()
			rec.released = true
			b.mu.Unlock()
		}
		return struct{}{}, err
	}, nil)
	if err != nil && ctx.Err() != nil && errors.Is(err, ctx.Err()) {
		return ctxErr("release", g.Name, ctx)
	}
	return err
}
