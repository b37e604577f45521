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
// Each lease name has a line parent, LinePath(root, name), apart from the
// name's holder parent (so that an acquire without Queue, which lists only
// the holder parent, ignores the line). A queued waiter has one place in
// it: an ephemeral sequential node "<GUID>-<sequence>" holding the place's
// TTL in milliseconds and the owner ("<ttl ms>\n<owner>"). Arrival order is
// the sequence number.
//
// A place lives for its TTL after its last refresh. ZooKeeper has no TTL
// for ephemeral nodes, so the backends decide: every queued attempt writes
// its own place first (the create, or a refresh: a SetData with the same
// data), and the server stamps that write with its time (the node's
// mtime). That stamp is the attempt's "now": a place ahead whose mtime is
// more than its TTL older is lapsed. Both times are the leader's clock
// (ZooKeeper stamps a transaction where the leader orders it), so lapse is
// decided on one clock while the leader stays; after a leader change the
// new leader's clock is compared with stamps of the old one, and a place
// may lapse early or late by the skew between the two. A Manager refreshes
// its place at least every TTL/2, so a skew up to TTL/2 never takes the
// place of a live waiter.
//
// A lapsed place is deleted by the waiter that found it, with the version
// it read, so that a refresh that arrived meanwhile keeps it (the delete
// then fails, and the place counts as live). A waiter whose own place
// lapsed (deleted, or its refresh stamped more than its TTL after the
// previous one) goes to the end of the line. A backend also deletes a place
// of its own that was not refreshed within its TTL of the send time of its
// last refresh (a waiter that stopped asking), and a place's node goes with
// its session.
//
// The name goes to the first live place: an attempt is granted only when
// the holder parent is empty and no live place is ahead of its own. The
// grant is made as any grant: a node created in the holder parent (one
// transaction that also checks the ended-owner record; its czxid is the
// token) and a listing that shows it lowest, so the token rules and the
// exclusion are those of an acquire without Queue. The place is then
// deleted. A refused waiter watches the place just ahead of its own, or,
// when it is first, the holder's node: the holder's release (one delete)
// wakes exactly the first waiter.

// lineDirName is the node under Options.Root that holds the line parents.
// Escaped lease names contain no '.', so it is no lease's parent.
const lineDirName = ".line"

// LinePath returns the parent of the places in line for lease name:
// root + "/.line/" + the name escaped as in ParentPath.
func LinePath(root, name string) string {
	return root + "/" + lineDirName + "/" + escapeName(name)
}

// place is this backend's place in the line of a name, for one owner.
// Guarded by Backend.mu.
type place struct {
	path    string
	session int64
	ttl     time.Duration
	mtime   int64     // the server's stamp of the last write of the node (ms)
	base    time.Time // send time of the last write of the node
	timer   *time.Timer
	// first is set when the last attempt found no live place ahead and
	// the name held, and watched the holder's node (holderNode);
	// holderGone when that node's deletion was then notified. The next
	// attempt is then still first (places only join behind it; its own,
	// if deleted as lapsed, fails the grant's transaction) and the name
	// likely free: it goes straight to the grant.
	first      bool
	holderNode string
	holderGone bool
}

func placeData(ttl time.Duration, owner string) []byte {
	return []byte(strconv.FormatInt(ttl.Milliseconds(), 10) + "\n" + owner)
}

// parsePlace reads a place's data; ok is false when it is not one.
func parsePlace(data []byte) (ttl time.Duration, owner string, ok bool) {
	s := string(data)
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

// lapsed reports whether a place written at mtime with the given TTL has
// lapsed at the server time now (both in ms).
func lapsed(now, mtime int64, ttl time.Duration) bool {
	return now-mtime > ttl.Milliseconds()
}

// keepPlace puts req.Owner in the line of ns, or refreshes its place, and
// returns the place with the server's stamp of that write. It runs under
// the name's op lock.
func (b *Backend) keepPlace(ns *nameState, req driver.Request) (*place, error) {
	data := placeData(req.TTL, req.Owner)
	b.mu.Lock()
	p := ns.places[req.Owner]
	b.mu.Unlock()
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
	return b.newPlace(ns, req, data)
}

// newPlace creates req.Owner's place at the end of the line of ns, in one
// transaction that also checks that the owner is not recorded as ended
// (see create) and writes the line parent, whose new stat stamps the
// create. It runs under the name's op lock.
func (b *Backend) newPlace(ns *nameState, req driver.Request, data []byte) (*place, error) {
	line := LinePath(b.o.Root, req.Name)
	tomb := b.endedPath(req.Name, req.Owner)
	for attempt := 0; ; attempt++ {
		guid := newGUID()
		ops := []any{
			&zk.CreateRequest{Path: line + "/" + guid + "-", Data: data, Acl: b.o.ACL, Flags: zk.FlagEphemeralSequential},
			&zk.SetDataRequest{Path: line, Data: nil, Version: -1},
			&zk.CreateRequest{Path: tomb, Acl: b.o.ACL, Flags: zk.FlagPersistent},
			&zk.DeleteRequest{Path: tomb, Version: -1},
		}
		before, _ := b.currentSession()
		sent := time.Now()
		res, err := b.conn.Multi(ops...)
		if err == nil && len(res) == len(ops) && res[1].Stat != nil && res[0].String != "" {
			after, _ := b.currentSession()
			if after == 0 || (before != 0 && after != before) {
				b.deleteSure(res[0].String)
				return nil, fmt.Errorf("zklease: acquire %q: the session changed while the place in line was created; retry", req.Name)
			}
			return b.addPlace(ns, req, res[0].String, after, res[1].Stat.Mtime, sent), nil
		}
		if err == nil {
			return nil, fmt.Errorf("zklease: acquire %q: unexpected answer to the create of a place in line: %+v", req.Name, res)
		}
		i, opErr := failedOp(res, err)
		switch {
		case i == 2 && errors.Is(opErr, zk.ErrNodeExists):
			return nil, errOwnerEnded(req.Name, req.Owner)
		case i == 2 && errors.Is(opErr, zk.ErrNoNode) && attempt < 3:
			if perr := b.ensureEndedDir(); perr != nil {
				return nil, perr
			}
			continue
		case i >= 0 && i <= 1 && errors.Is(opErr, zk.ErrNoNode) && attempt < 3:
			if perr := b.ensureLineParent(line); perr != nil {
				return nil, perr
			}
			continue
		case ambiguous(err):
			// The answer was lost: find the node by its GUID, or learn
			// that it was not created.
			path, st, ferr := b.findPlace(line, guid, before)
			if ferr != nil {
				return nil, fmt.Errorf("zklease: acquire %q: the answer to the create of a place in line was lost (%w): %w", req.Name, err, ferr)
			}
			if path == "" {
				return nil, fmt.Errorf("zklease: acquire %q: the answer to the create of a place in line was lost, and no place was created: %w", req.Name, err)
			}
			return b.addPlace(ns, req, path, st.EphemeralOwner, st.Mtime, sent), nil
		}
		return nil, b.setup(fmt.Errorf("zklease: acquire %q: create a place in line under %s: %w", req.Name, line, err))
	}
}

// addPlace records a new place of req.Owner and starts its TTL timer.
func (b *Backend) addPlace(ns *nameState, req driver.Request, path string, session, mtime int64, sent time.Time) *place {
	p := &place{path: path, session: session, ttl: req.TTL, mtime: mtime, base: sent}
	owner := req.Owner
	b.mu.Lock()
	defer b.mu.Unlock()
	ns.line = true
	ns.places[owner] = p
	p.timer = time.AfterFunc(time.Until(sent.Add(req.TTL)), func() { b.lapsePlace(ns.name, owner, p) })
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

// findPlace settles a create of a place whose answer was lost: it lists the
// line until it can and returns the node with the GUID, if any ("" when
// none). A node of a session that has since ended is gone with it.
func (b *Backend) findPlace(line, guid string, session int64) (string, *zk.Stat, error) {
	for {
		if b.isClosedNow() {
			return "", nil, ErrClosed
		}
		if cur, _ := b.currentSession(); session != 0 && cur != session {
			return "", nil, nil
		}
		names, _, err := b.conn.Children(line)
		switch {
		case errors.Is(err, zk.ErrNoNode):
			return "", nil, nil
		case err != nil && (ambiguous(err) || errors.Is(err, zk.ErrSessionExpired)):
			time.Sleep(20 * time.Millisecond)
			continue
		case err != nil:
			return "", nil, err
		}
		for _, n := range names {
			if strings.HasPrefix(n, guid+"-") {
				path := line + "/" + n
				ok, st, err := b.conn.Exists(path)
				if err != nil || !ok || (session != 0 && st.EphemeralOwner != session) {
					b.deleteSure(path)
					return "", nil, nil
				}
				return path, st, nil
			}
		}
		return "", nil, nil
	}
}

// ensureLineParent creates a name's line parent (a container) where
// missing, and the line directory and the root's components (persistent)
// first if they are missing too.
func (b *Backend) ensureLineParent(line string) error {
	_, err := b.conn.CreateContainer(line, nil, zk.FlagContainer, b.o.ACL)
	if errors.Is(err, zk.ErrNoNode) {
		p := ""
		for _, c := range strings.Split(b.o.Root[1:]+"/"+lineDirName, "/") {
			p += "/" + c
			if _, err := b.conn.Create(p, nil, zk.FlagPersistent, b.o.ACL); err != nil && !errors.Is(err, zk.ErrNodeExists) {
				return fmt.Errorf("zklease: create %s: %w", p, err)
			}
		}
		_, err = b.conn.CreateContainer(line, nil, zk.FlagContainer, b.o.ACL)
	}
	if err != nil && !errors.Is(err, zk.ErrNodeExists) {
		return fmt.Errorf("zklease: create %s: %w", line, err)
	}
	return nil
}

// listLine returns the places in the line of name, in arrival order. A
// listing lost with the connection is sent again until the server answers.
func (b *Backend) listLine(name string) ([]child, error) {
	line := LinePath(b.o.Root, name)
	for {
		names, _, err := b.conn.Children(line)
		switch {
		case errors.Is(err, zk.ErrNoNode):
			return nil, nil
		case err != nil && ambiguous(err) && !b.isClosedNow():
			time.Sleep(20 * time.Millisecond)
			continue
		case err != nil:
			return nil, fmt.Errorf("zklease: list %s: %w", line, err)
		}
		return parseChildren(line, names)
	}
}

// ahead is what a queued attempt learns of the places ahead of its own.
type ahead struct {
	live      int    // live places ahead
	pred      string // the path of the last live place ahead ("" if none)
	firstLeft time.Duration
}

// placesAhead reads the places before index i of line (one read each,
// pipelined), deletes those that lapsed at the server time now, and counts
// the others.
func (b *Backend) placesAhead(name string, line []child, i int, now int64) ahead {
	dir := LinePath(b.o.Root, name)
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
		path := dir + "/" + line[k].name
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
		if r.err == nil {
			if ttl, _, ok := parsePlace(r.data); ok && lapsed(now, r.st.Mtime, ttl) {
				// Delete it with the version read: a refresh that came in
				// meanwhile keeps it, and it is then live.
				err := b.conn.Delete(r.path, r.st.Version)
				if err == nil || errors.Is(err, zk.ErrNoNode) {
					continue
				}
			} else if ok && a.live == 0 {
				a.firstLeft = ttl - time.Duration(now-r.st.Mtime)*time.Millisecond
			}
		}
		// Live, or unreadable: it keeps its place.
		a.live++
		a.pred = r.path
	}
	return a
}

// acquireQueued is Acquire with Request.Queue: it keeps req.Owner's place
// in line and grants the name only when no one holds it and no live place
// is ahead of the owner's. It runs under the name's op lock, after the
// checks of an ended owner and of a grant the owner holds already.
//
// An owner that has a place looks first (the holder queue and the line,
// one round trip): first in line with the name free, it needs no clock (no
// place ahead to judge) and goes straight to the grant, without writing
// its place. Otherwise it writes its place, whose stamp is the clock that
// judges the places ahead.
func (b *Backend) acquireQueued(ns *nameState, req driver.Request) (driver.Grant, error) {
	b.mu.Lock()
	had := ns.places[req.Owner]
	b.mu.Unlock()
	var (
		kids, line []child
		err        error
	)
	if had != nil {
		b.mu.Lock()
		fast := had.first && had.holderGone
		had.first, had.holderGone = false, false
		b.mu.Unlock()
		if fast {
			return b.grantQueued(ns, req, had)
		}
		kids, line, err = b.readLine(ns)
		if err != nil {
			return driver.Grant{}, err
		}
		if position(line, baseName(had.path)) == 0 && len(kids) == 0 {
			return b.grantQueued(ns, req, had)
		}
	}
	p, err := b.keepPlace(ns, req)
	if err != nil {
		return driver.Grant{}, err
	}
	if p != had {
		// A new place, at the end of the line: look again. (Both
		// listings follow the place's write in the session's order, so
		// they see at least what the server had applied before it.)
		if kids, line, err = b.readLine(ns); err != nil {
			return driver.Grant{}, err
		}
	}
	// An old listing is good enough for a place that was already in line:
	// the places created since are behind it, and the refusal it may lead
	// to is sent again.
	i := position(line, baseName(p.path))
	if i < 0 {
		// Deleted as lapsed after the write (a waiter whose clock ran
		// ahead), or gone with the session: the next attempt joins again.
		b.dropPlace(ns, req.Owner, p)
		return driver.Grant{}, notAcquired(req.Name)
	}
	a := b.placesAhead(req.Name, line, i, p.mtime)
	if len(kids) > 0 || a.live > 0 {
		watch := a.pred
		if watch == "" {
			watch = ns.parent + "/" + kids[0].name
		}
		b.mu.Lock()
		p.first, p.holderNode, p.holderGone = a.live == 0, watch, false
		b.mu.Unlock()
		b.watchLine(ns, watch)
		if len(kids) > 0 {
			return driver.Grant{}, notAcquired(req.Name)
		}
		return driver.Grant{}, &driver.NotAcquiredError{Name: req.Name, Ahead: a.live, RetryAfter: max(a.firstLeft, 0)}
	}
	return b.grantQueued(ns, req, p)
}

// readLine lists the holder queue of ns and its line, pipelined.
func (b *Backend) readLine(ns *nameState) (kids, line []child, err error) {
	type listing struct {
		kids []child
		err  error
	}
	held := make(chan listing, 1)
	go func() {
		kids, err := b.list(ns)
		held <- listing{kids, err}
	}()
	line, lerr := b.listLine(ns.name)
	h := <-held
	if h.err != nil {
		return nil, nil, h.err
	}
	if lerr != nil {
		return nil, nil, lerr
	}
	return h.kids, line, nil
}

// grantQueued grants the name to req.Owner, first in line with the name
// free, as an acquire without Queue does (a create, then a listing that
// shows it lowest), and takes p out of the line in the create's
// transaction.
func (b *Backend) grantQueued(ns *nameState, req driver.Request, p *place) (driver.Grant, error) {
	n, err := b.create(ns, req.Owner, req.Owner, req.TTL, &zk.DeleteRequest{Path: p.path, Version: -1})
	b.mu.Lock()
	if ns.places[req.Owner] == p && (err == nil || errors.Is(err, errExtraFailed)) {
		// Deleted with the create, or already gone (deleted as lapsed
		// by a waiter behind it, or with its session).
		delete(ns.places, req.Owner)
		p.timer.Stop()
	}
	b.mu.Unlock()
	if errors.Is(err, errExtraFailed) {
		return driver.Grant{}, notAcquired(req.Name)
	}
	if err != nil {
		return driver.Grant{}, err
	}
	kids, err := b.list(ns)
	if err != nil {
		b.deleteSure(n.path)
		return driver.Grant{}, err
	}
	switch j := position(kids, baseName(n.path)); {
	case j < 0:
		return driver.Grant{}, fmt.Errorf("zklease: acquire %q: the node %s vanished right after it was created (its session ended?)", req.Name, n.path)
	case j > 0:
		// An acquire without Queue took the name meanwhile (use one mode
		// per name, or this happens): the place went with the create, so
		// the owner joins the line again, at its end.
		b.deleteSure(n.path)
		if _, err := b.keepPlace(ns, req); err != nil {
			return driver.Grant{}, err
		}
		b.watchLine(ns, ns.parent+"/"+kids[0].name)
		return driver.Grant{}, notAcquired(req.Name)
	}
	if err := b.checkSession(n.session, req.TTL); err != nil {
		b.deleteSure(n.path)
		return driver.Grant{}, err
	}
	b.mu.Lock()
	rec := b.newGrantLocked(ns, req, n.path, n.czxid, n.session, n.sent)
	b.mu.Unlock()
	return rec.grant(), nil
}

// watchLine watches path (the place ahead, or the holder's node) for a
// queued waiter of ns: its deletion signals ns's Watch subscribers. A data
// change (a refresh of the place ahead) sets the watch again without a
// signal. It runs under the name's op lock.
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

// onLineEvent handles a notification for a path watched by a queued
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
	if typ == zk.EventNodeDeleted {
		for _, p := range ns.places {
			if p.first && p.holderNode == path {
				p.holderGone = true
			}
		}
	}
	signalLocked(ns)
	return true
}
