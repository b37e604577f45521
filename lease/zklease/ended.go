package zklease

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/go-zookeeper/zk"

	"github.com/fencekit/fencekit/lease/driver"
)

// Ended owners.
//
// An owner ended by Release or Abandon is recorded at the store by an
// ephemeral node, EndedPath(root, name, owner), created in the same
// transaction as the release's delete (Release) or on its own (Abandon).
// Every create of a grant's node checks, in the same transaction, that no
// such node exists (it creates and deletes it: ZooKeeper has no "absent"
// check in a Multi), so an ended owner is never granted the name again by
// a create, whichever backend sends it. A backend also remembers the owners
// it ended itself, and refuses them before any request; the hand-off of a
// ticket (which needs no create) checks that memory and reads the record,
// pipelined with the queue's listing.
//
// The record is ephemeral: it lives until the backend that made it deletes
// it, driver.EndedOwnerTTL of the grant's TTL later, or until that backend's
// session ends. That is as long as it matters: a late acquire request of a
// zklease Backend is a create of its own session, which ZooKeeper applies in
// order with that session's other requests and never after the session has
// ended; and the lease.Manager sends an owner's acquire, release and
// abandon through one Backend, one session. (Within one Backend the record
// is not even needed: an acquire whose caller stopped waiting keeps its
// name's operation lock until the store has answered, and then gives back
// what it was granted, before any later release, abandon or acquire of that
// name runs; see run. That is why ZooKeeper already settled a late
// acquire before ended owners were recorded.)

// endedDirName is the node under Options.Root that holds the ended-owner
// records. Escaped lease names contain no '.', so it is no lease's parent.
const endedDirName = ".ended"

// EndedPath returns the node that records owner as ended for the lease
// name: root + "/.ended/" + the name and the owner escaped as in
// ParentPath, joined by '.' (which the escaping never produces).
func EndedPath(root, name, owner string) string {
	return root + "/" + endedDirName + "/" + escapeName(name) + "." + escapeName(owner)
}

func (b *Backend) endedDir() string { return b.o.Root + "/" + endedDirName }

func (b *Backend) endedPath(name, owner string) string { return EndedPath(b.o.Root, name, owner) }

// endedKey names an owner of a lease.
type endedKey struct{ name, owner string }

// endedRec is an ended-owner record this backend created; its node is
// deleted when until has passed.
type endedRec struct {
	path  string
	until time.Time
	timer *time.Timer
}

// endedState is what a Backend remembers of the owners it ended.
type endedState struct {
	mu   sync.Mutex
	recs map[endedKey]*endedRec
}

// endedHere reports whether this backend ended owner of name within its
// EndedOwnerTTL.
func (b *Backend) endedHere(name, owner string) bool {
	b.endedOwners.mu.Lock()
	defer b.endedOwners.mu.Unlock()
	r := b.endedOwners.recs[endedKey{name, owner}]
	return r != nil
}

// noteEnded remembers that this backend recorded owner of name as ended,
// at the store (created: its own node) or only here (the node was another
// backend's, or an earlier one of its own), and schedules the deletion of
// its own node after driver.EndedOwnerTTL(ttl).
func (b *Backend) noteEnded(name, owner string, ttl time.Duration, created bool) {
	until := time.Now().Add(driver.EndedOwnerTTL(ttl))
	k := endedKey{name, owner}
	e := &b.endedOwners
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.recs == nil {
		e.recs = make(map[endedKey]*endedRec)
	}
	if r := e.recs[k]; r != nil {
		if until.After(r.until) {
			r.until = until
			r.timer.Reset(time.Until(until))
		}
		return
	}
	r := &endedRec{path: b.endedPath(name, owner), until: until}
	if !created {
		r.path = "" // not ours to delete
	}
	r.timer = time.AfterFunc(time.Until(until), func() { b.forgetEnded(k, r) })
	e.recs[k] = r
}

// forgetEnded runs when r is due: it deletes r's node (if this backend
// created it) and forgets it.
func (b *Backend) forgetEnded(k endedKey, r *endedRec) {
	e := &b.endedOwners
	e.mu.Lock()
	if e.recs[k] != r {
		e.mu.Unlock()
		return
	}
	if d := time.Until(r.until); d > 0 {
		r.timer.Reset(d)
		e.mu.Unlock()
		return
	}
	delete(e.recs, k)
	e.mu.Unlock()
	if r.path != "" {
		b.background(k.name, func(*nameState) { b.deleteSure(r.path) })
	}
}

// stopEnded stops the deletion timers (Close: the session's end deletes
// the nodes).
func (b *Backend) stopEnded() {
	e := &b.endedOwners
	e.mu.Lock()
	defer e.mu.Unlock()
	for k, r := range e.recs {
		r.timer.Stop()
		delete(e.recs, k)
	}
}

// ensureEndedDir creates the records' parent (persistent) where missing,
// and the root's components first if they are missing too.
func (b *Backend) ensureEndedDir() error {
	dir := b.endedDir()
	_, err := b.conn.Create(dir, nil, zk.FlagPersistent, b.o.ACL)
	if errors.Is(err, zk.ErrNoNode) {
		p := ""
		for _, c := range strings.Split(b.o.Root[1:], "/") {
			p += "/" + c
			if _, err := b.conn.Create(p, nil, zk.FlagPersistent, b.o.ACL); err != nil && !errors.Is(err, zk.ErrNodeExists) {
				return fmt.Errorf("zklease: create %s: %w", p, err)
			}
		}
		_, err = b.conn.Create(dir, nil, zk.FlagPersistent, b.o.ACL)
	}
	if err != nil && !errors.Is(err, zk.ErrNodeExists) {
		return fmt.Errorf("zklease: create %s: %w", dir, err)
	}
	return nil
}

// recordEnded creates the record of owner of name (alone), retrying
// connection errors until the server answers. existed reports that a
// record was there already.
func (b *Backend) recordEnded(name, owner string, ttl time.Duration) (existed bool, err error) {
	path := b.endedPath(name, owner)
	for attempt := 0; ; attempt++ {
		_, err := b.conn.Create(path, nil, zk.FlagEphemeral, b.o.ACL)
		switch {
		case err == nil:
			b.noteEnded(name, owner, ttl, true)
			return false, nil
		case errors.Is(err, zk.ErrNodeExists):
			b.noteEnded(name, owner, ttl, false)
			return true, nil
		case errors.Is(err, zk.ErrNoNode) && attempt < 3:
			if err := b.ensureEndedDir(); err != nil {
				return false, err
			}
			continue
		case ambiguous(err) && !b.isClosedNow():
			// A create sent again after its answer was lost finds its
			// own node: existed, which is what it is.
			time.Sleep(20 * time.Millisecond)
			continue
		}
		return false, fmt.Errorf("zklease: record %q of %q as ended: %w", owner, name, err)
	}
}

// errOwnerEnded is Acquire's refusal of an owner recorded as ended.
func errOwnerEnded(name, owner string) error {
	return fmt.Errorf("%w: %q: owner %q was released or abandoned", driver.ErrNotAcquired, name, owner)
}

// failedOp returns the index and error of the operation that made a Multi
// fail: ZooKeeper answers the ones before it with no error and the ones
// after with a runtime inconsistency.
func failedOp(res []zk.MultiResponse, err error) (int, error) {
	for i, r := range res {
		if r.Error != nil {
			return i, r.Error
		}
	}
	return -1, err
}

// releaseNode deletes the node at path of the grant g and, in the same
// transaction, records g.Owner as ended; it runs under the name's op lock.
// A transaction whose answer is lost is sent again until the server answers;
// the record tells whether an earlier attempt was applied. See Release for
// the outcomes.
func (b *Backend) releaseNode(g driver.Grant, path string, expired bool) error {
	tomb := b.endedPath(g.Name, g.Owner)
	resent := false
	for {
		res, err := b.conn.Multi(
			&zk.DeleteRequest{Path: path, Version: -1},
			&zk.CreateRequest{Path: tomb, Acl: b.o.ACL, Flags: zk.FlagEphemeral},
		)
		if err == nil {
			b.noteEnded(g.Name, g.Owner, g.TTL, true)
			if expired {
				return fmt.Errorf("%w: %q (token %d): the grant had expired here (its TTL passed without a renewal)", driver.ErrNotHeld, g.Name, g.Token)
			}
			return nil
		}
		if ambiguous(err) && !b.isClosedNow() {
			resent = true
			time.Sleep(20 * time.Millisecond)
			continue
		}
		i, opErr := failedOp(res, err)
		switch {
		case i == 1 && errors.Is(opErr, zk.ErrNoNode):
			if err := b.ensureEndedDir(); err != nil {
				return err
			}
			continue
		case i == 1 && errors.Is(opErr, zk.ErrNodeExists):
			// The owner was ended already (an Abandon, or a Release
			// through another backend): delete the node alone.
			b.noteEnded(g.Name, g.Owner, g.TTL, false)
			b.deleteSure(path)
			return nil
		case i == 0 && errors.Is(opErr, zk.ErrNoNode):
			// The node is gone. If the owner's record exists, an earlier
			// attempt of this release (whose answer was lost), or another
			// Release or an Abandon, ended it: a release. Otherwise the
			// grant expired or was lost.
			existed, err := b.recordEnded(g.Name, g.Owner, g.TTL)
			switch {
			case err != nil:
				return err
			case existed:
				return nil
			case resent:
				// Cannot happen while the session lives (the record was
				// created with the delete); said plainly if it does.
				return fmt.Errorf("zklease: release %q (token %d): the outcome is unknown: the answer was lost and the node is gone without the record of its release", g.Name, g.Token)
			}
			return fmt.Errorf("%w: %q (token %d): the grant had expired or was lost", driver.ErrNotHeld, g.Name, g.Token)
		case errors.Is(opErr, zk.ErrSessionExpired) && resent:
			return fmt.Errorf("zklease: release %q (token %d): the outcome is unknown: the answer was lost, then the session ended (%w); either way the node is gone", g.Name, g.Token, opErr)
		}
		return fmt.Errorf("zklease: release %q: delete %s: %w", g.Name, path, err)
	}
}

// Abandon implements driver.Backend: it records req.Owner as ended at the
// store (an ephemeral node, see EndedPath, which every create of a grant's
// node checks in its transaction), then deletes every node of req.Name's
// queue that names req.Owner (one listing, one read per node, pipelined):
// the grant the owner holds, whatever its token, and a node of a create
// that was applied but whose grant was never made. It also deletes the
// owner's place in line, when this Backend keeps one. This backend's own
// ticket is kept: it is its waiters' place, and becomes a grant only
// through an attempt that checks the record. It returns nil whether or not
// the owner held anything.
//
// Within one Backend an abandoned attempt needs none of this: its
// operation keeps the name's lock until the store answered and then gives
// back what it was granted, and Abandon runs after it. Abandon makes the
// refusal hold for any backend, as the contract asks.
//
// Like the other calls it runs to its end even when ctx ends first (ctx
// bounds the wait). Errors: ErrClosed, go-zookeeper's errors (wrapped),
// ctx's error (wrapped).
func (b *Backend) Abandon(ctx context.Context, req driver.Request) error {
	if req.Owner == "" {
		return errors.New("zklease: abandon: owner is empty")
	}
	_, err := run(b, ctx, req.Name, func(ns *nameState) (struct{}, error) {
		b.mu.Lock()
		rec := ns.grants[req.Owner]
		if rec != nil {
			rec.endLocked()
			rec.released = true
			delete(ns.grants, req.Owner)
		}
		var ticket string
		if ns.ticket != nil {
			ticket = ns.ticket.path
		}
		// Nodes this Backend holds for other owners are never req.Owner's,
		// whatever their data says: a ticket claimed by another owner still
		// reads the owner it was made for until the claim's rewrite of its
		// data, which may run after this Abandon.
		held := make(map[string]bool, len(ns.grants))
		for _, g := range ns.grants {
			held[g.path] = true
		}
		b.mu.Unlock()
		if _, err := b.recordEnded(req.Name, req.Owner, req.TTL); err != nil {
			return struct{}{}, err
		}
		if rec != nil {
			b.deleteSure(rec.path)
		}
		b.mu.Lock()
		p := ns.places[req.Owner]
		b.mu.Unlock()
		if p != nil {
			// A waiter that gave up leaves the line at once.
			b.dropPlace(ns, req.Owner, p)
		}
		kids, err := b.list(ns)
		if err != nil {
			return struct{}{}, err
		}
		type read struct {
			path string
			data []byte
			err  error
		}
		reads := make(chan read, len(kids))
		n := 0
		for _, k := range kids {
			path := ns.parent + "/" + k.name
			if path == ticket || (rec != nil && path == rec.path) || held[path] {
				continue
			}
			n++
			go func() {
				data, _, err := b.conn.Get(path)
				reads <- read{path, data, err}
			}()
		}
		for range n {
			r := <-reads
			if r.err == nil && nodeOwner(r.data) == req.Owner {
				b.deleteSure(r.path)
			}
		}
		return struct{}{}, nil
	}, nil)
	if err != nil && ctx.Err() != nil && errors.Is(err, ctx.Err()) {
		return ctxErr("abandon", req.Name, ctx)
	}
	return err
}
