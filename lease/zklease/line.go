package zklease

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/go-zookeeper/zk"

	"github.com/fencekit/fencekit/lease/driver"
)

// Waiters in line (driver.Limits.Queues, Request.Queue).
//
// A queued waiter's place is a node of the holder queue itself: an
// ephemeral sequential node "<GUID>-<sequence>" under the name's parent,
// as every grant's node and every ticket, holding placeData (the place's
// TTL in milliseconds and the owner). Arrival order is the sequence
// number, and the lowest node holds the name (ZooKeeper's lock recipe), so
// a place needs no write to become a grant: once every node before it is
// gone, the listing that shows it lowest is the grant, and its czxid is
// the token. Tokens grow in grant order: sequence order is creation order
// is czxid order within a parent, grants follow sequence order, and a
// parent that was deleted and made again restarts its sequence numbers,
// never its czxids (see "What is guaranteed" in the package doc).
//
// A place lives for its TTL after its last refresh. ZooKeeper has no TTL
// for ephemeral nodes, so the backends decide: a queued attempt that is not
// granted writes its own place (the create, or a refresh: a SetData with
// the same data), and the server stamps that write with its time (the
// node's mtime). That stamp is the attempt's "now": a place ahead whose
// mtime is more than its TTL older is lapsed. Both times are the leader's
// clock, so lapse is decided on one clock while the leader stays; after a
// leader change a place may lapse early or late by the skew between the
// two leaders' clocks.
//
// A lapsed place is deleted by the waiter that found it, in a transaction
// that also checks that a node before it still exists (so the place is not
// the lowest, and no grant: a place is granted only as the lowest) and
// that its version is the one read (a refresh in between keeps it). The
// lowest node is never deleted by another backend: it may be a grant whose
// holder does not know it yet, whose deadline counts from its listing. It
// leaves with its own backend (a release, an Abandon, the place's or the
// grant's TTL timer) or with its session. A waiter whose own place lapsed
// (deleted, or its refresh stamped more than its TTL after the previous
// one) goes to the end of the line.

// placeMark starts the data of a place, so that it is never read as an
// owner's name.
const placeMark = "\x00"

// place is this backend's place in the line of a name, for one owner: a
// node under the name's parent. Guarded by Backend.mu.
type place struct {
	path    string
	czxid   int64
	session int64
	ttl     time.Duration
	mtime   int64     // the server's stamp of the last write of the node (ms)
	base    time.Time // send time of the last write of the node
	timer   *time.Timer
}

func placeData(ttl time.Duration, owner string) []byte {
	return []byte(placeMark + strconv.FormatInt(ttl.Milliseconds(), 10) + "\n" + owner)
}

// parsePlace reads a place's data; ok is false when it is not one.
func parsePlace(data []byte) (ttl time.Duration, owner string, ok bool) {
	s, isPlace := strings.CutPrefix(string(data), placeMark)
	if !isPlace {
		return 0, "", false
	}
	i := strings.IndexByte(s, '\n')
	if i < 0 {
		return 0, "", false
	}
	ms, err := strconv.ParseInt(s[:i], 10, 64)
	if err != nil || ms <= 0 {
		return 0, "", false
	}
	return time.Duration(ms) * time.Millisecond, s[i+1:], true
}

// nodeOwner returns the owner a node of the holder queue names: a grant's
// or a ticket's data, or a place's owner.
func nodeOwner(data []byte) string {
	if _, owner, ok := parsePlace(data); ok {
		return owner
	}
	return string(data)
}

// lapsed reports whether a place written at mtime with the given TTL has
// lapsed at the server time now (both in ms).
func lapsed(now, mtime int64, ttl time.Duration) bool {
	return now-mtime > ttl.Milliseconds()
}

// keepPlace refreshes req.Owner's place p (nil: none), or puts the owner
// at the end of the line when it has none or its place lapsed, and returns
// the place with the server's stamp of that write. It runs under the
// name's op lock.
func (b *Backend) keepPlace(ns *nameState, req driver.Request, p *place) (*place, error) {
	data := placeData(req.TTL, req.Owner)
	if p != nil {
		sent := time.Now()
		st, err := b.conn.Set(p.path, data, -1)
		switch {
		case err == nil && st.EphemeralOwner == p.session && !lapsed(st.Mtime, p.mtime, p.ttl):
			b.mu.Lock()
			if ns.places[req.Owner] == p {
				p.mtime, p.base, p.ttl = st.Mtime, sent, req.TTL
				p.timer.Reset(time.Until(sent.Add(req.TTL)))
			}
			b.mu.Unlock()
			return p, nil
		case err == nil, errors.Is(err, zk.ErrNoNode), errors.Is(err, zk.ErrSessionExpired):
			// Lapsed (written more than its TTL after the previous write,
			// or deleted as lapsed), or gone with its session: to the end
			// of the line.
			b.dropPlace(ns, req.Owner, p)
		default:
			return nil, fmt.Errorf("zklease: acquire %q: refresh the place in line %s: %w", req.Name, p.path, err)
		}
	}
	// The create checks, in its transaction, that the owner is not
	// recorded as ended: an ended owner never joins.
	n, err := b.create(ns, string(data), req.Owner, req.TTL)
	if err != nil {
		return nil, err
	}
	return b.addPlace(ns, req, n), nil
}

// addPlace records a new place of req.Owner and starts its TTL timer.
func (b *Backend) addPlace(ns *nameState, req driver.Request, n node) *place {
	p := &place{path: n.path, czxid: n.czxid, session: n.session, ttl: req.TTL, mtime: n.mtime, base: n.sent}
	owner := req.Owner
	b.mu.Lock()
	defer b.mu.Unlock()
	ns.line = true
	ns.places[owner] = p
	p.timer = time.AfterFunc(time.Until(n.sent.Add(req.TTL)), func() { b.lapsePlace(ns.name, owner, p) })
	return p
}

// lapsePlace runs at a place's TTL: if no refresh moved it, the place is
// forgotten and its node deleted (the waiter stopped asking).
func (b *Backend) lapsePlace(name, owner string, p *place) {
	b.mu.Lock()
	ns := b.names[name]
	if ns == nil || ns.places[owner] != p || b.isClosed {
		b.mu.Unlock()
		return
	}
	if d := time.Until(p.base.Add(p.ttl)); d > 0 {
		p.timer.Reset(d)
		b.mu.Unlock()
		return
	}
	b.mu.Unlock()
	b.background(name, func(ns *nameState) { b.dropPlace(ns, owner, p) })
}

// dropPlace forgets owner's place p and deletes its node; it runs under
// the name's op lock (or in an operation of the name).
func (b *Backend) dropPlace(ns *nameState, owner string, p *place) {
	b.mu.Lock()
	if ns.places[owner] != p {
		b.mu.Unlock()
		return
	}
	delete(ns.places, owner)
	p.timer.Stop()
	session := b.session
	b.mu.Unlock()
	if p.session == session {
		b.deleteSure(p.path)
	}
}

// ahead is what a queued attempt learns of the nodes ahead of its place.
type ahead struct {
	live      int    // live places ahead
	pred      string // the path of the last node ahead still there ("" if none)
	headPlace bool   // the lowest node is a place: the name is kept for it
	firstLeft time.Duration
}

// nodesAhead reads the nodes before index i of kids (one read each,
// pipelined), deletes the places among them that lapsed at the server time
// now and are not the lowest, and counts the live places.
func (b *Backend) nodesAhead(ns *nameState, kids []child, i int, now int64) ahead {
	type read struct {
		path string
		data []byte
		st   *zk.Stat
		err  error
	}
	reads := make([]chan read, i)
	for k := range i {
		ch := make(chan read, 1)
		reads[k] = ch
		path := ns.parent + "/" + kids[k].name
		go func() {
			data, st, err := b.conn.Get(path)
			ch <- read{path, data, st, err}
		}()
	}
	var a ahead
	for k := range i {
		r := <-reads[k]
		if errors.Is(r.err, zk.ErrNoNode) {
			continue
		}
		ttl, _, isPlace := parsePlace(r.data)
		if r.err == nil && isPlace {
			if lapsed(now, r.st.Mtime, ttl) && a.pred != "" {
				// Delete it with the version read (a refresh that came in
				// meanwhile keeps it), and only while a node before it
				// exists: it is then not the lowest, so not a grant.
				_, err := b.conn.Multi(
					&zk.CheckVersionRequest{Path: a.pred, Version: -1},
					&zk.DeleteRequest{Path: r.path, Version: r.st.Version})
				if err == nil {
					continue
				}
			}
			if a.live == 0 {
				a.firstLeft = max(ttl-time.Duration(now-r.st.Mtime)*time.Millisecond, 0)
			}
			a.live++
			if a.pred == "" {
				a.headPlace = true
			}
		}
		// A grant, a ticket, a live place, or unreadable: it stays ahead.
		a.pred = r.path
	}
	return a
}

// acquireQueued is Acquire with Request.Queue. It runs under the name's op
// lock, after the checks of an ended owner and of a grant the owner holds
// already.
//
// An owner that has a place looks first: one listing, with the read of
// the owner's ended-record pipelined. When its place is the lowest node,
// that listing is the grant (no write: the hand-off is a read). Otherwise,
// or without a place, it writes its place (a refresh, or a create at the
// end of the line that a listing follows, and which is granted if lowest),
// reads the nodes ahead and watches the one just ahead (all pipelined),
// passes those that lapsed, and is refused; when none of them is left (its
// listing was older than its write), it lists again, and is granted.
func (b *Backend) acquireQueued(ns *nameState, req driver.Request) (driver.Grant, error) {
	b.mu.Lock()
	ns.line = true
	p := ns.places[req.Owner]
	t := ns.ticket
	b.mu.Unlock()
	if t != nil {
		// A ticket that Watch put in the holder queue before this
		// Backend saw a queued attempt of the name (a first attempt that
		// failed left no place, and the name's state was forgotten).
		// Only an acquire without Queue claims a ticket, so at the head
		// it would keep the line refused for as long as the subscription
		// lasts: give it back. Its subscribers are queued waiters, whose
		// attempts watch the node ahead of their own places.
		b.dropTicket(ns, t)
	}
	var kids []child
	if p != nil {
		g, ok, k, err := b.grantIfFirst(ns, req, p)
		if ok || err != nil {
			return g, err
		}
		kids = k
		if position(kids, baseName(p.path)) < 0 {
			// Deleted as lapsed, or gone with its session: join again.
			b.dropPlace(ns, req.Owner, p)
			p = nil
		}
	}
	np, err := b.keepPlace(ns, req, p)
	if err != nil {
		return driver.Grant{}, err
	}
	if np != p {
		// A new place, at the end of the line: a listing after its create
		// tells whether it is the lowest (an empty name: granted).
		g, ok, k, err := b.grantIfFirst(ns, req, np)
		if ok || err != nil {
			return g, err
		}
		kids = k
	}
	// An old listing is good enough for a place that was already in line:
	// the nodes created since are behind it, and the refusal it may lead
	// to is sent again.
	i := position(kids, baseName(np.path))
	if i < 0 {
		b.dropPlace(ns, req.Owner, np)
		return driver.Grant{}, notAcquired(req.Name)
	}
	// The watch of the node just ahead goes out with the reads of the
	// nodes ahead (pipelined); if that node turns out gone, or lapsed and
	// deleted, the last one still there is watched after.
	var before string
	watched := make(chan struct{})
	if i > 0 {
		before = ns.parent + "/" + kids[i-1].name
		go func() {
			defer close(watched)
			b.watchLine(ns, before)
		}()
	} else {
		close(watched)
	}
	a := b.nodesAhead(ns, kids, i, np.mtime)
	<-watched
	if a.pred == "" {
		// Every node ahead is gone, read after this attempt's own write
		// of its place: the listing was older than that (another
		// session's delete had not reached this session's member yet, as
		// after an Abandon through another member), and nothing can be
		// ahead of the place now (nodes created later are behind it). A
		// listing sent after the write is at least that recent, and
		// grants.
		g, ok, _, err := b.grantIfFirst(ns, req, np)
		if ok || err != nil {
			return g, err
		}
		b.mu.Lock()
		signalLocked(ns)
		b.mu.Unlock()
		return driver.Grant{}, notAcquired(req.Name)
	}
	if a.pred != before {
		b.watchLine(ns, a.pred)
	}
	if a.headPlace {
		return driver.Grant{}, &driver.NotAcquiredError{Name: req.Name, Ahead: a.live, RetryAfter: a.firstLeft}
	}
	return driver.Grant{}, notAcquired(req.Name)
}

// grantIfFirst lists the holder queue, with the read of req.Owner's ended
// record pipelined, and grants the name to req.Owner when its place p is
// the lowest node: the place's node becomes the grant's, its czxid the
// token, and the grant's TTL counts from the listing's send time (the
// lowest node is deleted by no one but this backend, at that TTL, and its
// session lives at least the session timeout after the listing). ok
// reports a grant; kids is the listing.
func (b *Backend) grantIfFirst(ns *nameState, req driver.Request, p *place) (g driver.Grant, ok bool, kids []child, err error) {
	type endedRead struct {
		found bool
		err   error
	}
	endedAt := make(chan endedRead, 1)
	go func() {
		found, _, err := b.conn.Exists(b.endedPath(req.Name, req.Owner))
		endedAt <- endedRead{found, err}
	}()
	sent := time.Now()
	kids, err = b.list(ns)
	ended := <-endedAt
	if err != nil {
		return driver.Grant{}, false, nil, err
	}
	if ended.found {
		// Ended through another backend: the place would keep the name,
		// or a place in line, for no one.
		b.dropPlace(ns, req.Owner, p)
		return driver.Grant{}, false, nil, errOwnerEnded(req.Name, req.Owner)
	}
	if position(kids, baseName(p.path)) != 0 {
		return driver.Grant{}, false, kids, nil
	}
	if ended.err != nil {
		// Not granted without the record's answer; the place stays.
		return driver.Grant{}, false, nil, fmt.Errorf("zklease: acquire %q: read the ended-owner record: %w", req.Name, ended.err)
	}
	if err := b.checkSession(p.session, req.TTL); err != nil {
		b.dropPlace(ns, req.Owner, p)
		return driver.Grant{}, false, nil, err
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if ns.places[req.Owner] != p {
		// Gone with its session meanwhile.
		return driver.Grant{}, false, kids, nil
	}
	delete(ns.places, req.Owner)
	p.timer.Stop()
	rec := b.newGrantLocked(ns, req, p.path, p.czxid, p.session, sent)
	return rec.grant(), true, nil, nil
}

// watchLine watches path (the node just ahead of a queued waiter's place)
// for a queued waiter of ns: its deletion signals ns's Watch subscribers.
// A data change (a refresh of the place ahead) sets the watch again without
// a signal. It runs under the name's op lock.
func (b *Backend) watchLine(ns *nameState, path string) {
	b.mu.Lock()
	if b.isClosed || b.lineWatch[path] == ns {
		// Already set: a ZooKeeper watch stays until it fires.
		b.mu.Unlock()
		return
	}
	b.lineWatch[path] = ns
	b.mu.Unlock()
	ok, _, _, err := b.conn.ExistsW(path)
	if err != nil || !ok {
		b.mu.Lock()
		if b.lineWatch[path] == ns {
			delete(b.lineWatch, path)
		}
		signalLocked(ns)
		b.mu.Unlock()
	}
}

// onLineEventLocked handles a notification for a path watched by a queued
// waiter; b.mu must be held. It reports whether path was one.
func (b *Backend) onLineEventLocked(path string, typ zk.EventType) bool {
	ns, ok := b.lineWatch[path]
	if !ok {
		return false
	}
	delete(b.lineWatch, path)
	if typ == zk.EventNodeDataChanged {
		b.mu.Unlock()
		b.background(ns.name, func(ns *nameState) { b.watchLine(ns, path) })
		b.mu.Lock()
		return true
	}
	b.notified.Add(1)
	signalLocked(ns)
	return true
}
