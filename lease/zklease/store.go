package zklease

import (
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"time"

	"github.com/go-zookeeper/zk"
)

// The requests the backend sends, each one go-zookeeper call. go-zookeeper
// takes no context: a request ends with the server's answer, a connection
// error, or Close. The backend therefore runs every request inside an
// operation that outlives an impatient caller (see run).

// node is a node this backend created.
type node struct {
	path    string
	czxid   int64
	session int64
	sent    time.Time // when the create request was sent
	mtime   int64     // the server's stamp of the create (ms)
	data    string    // what it holds: an owner, a ticket's waitingData, or a place's placeData
}

// errExtraFailed is matched by create's error when one of its extra
// operations failed (nothing was created).
var errExtraFailed = errors.New("an operation of the transaction failed")

// ambiguous reports whether err leaves the outcome of a write unknown: the
// request may have been applied and its answer lost.
// go-zookeeper passes on the connection's own errors when a write fails
// (a closed or reset socket), as well as its ErrConnectionClosed when the
// connection broke with the request unanswered.
func ambiguous(err error) bool {
	var ne net.Error
	return errors.Is(err, zk.ErrConnectionClosed) || errors.Is(err, zk.ErrClosing) || errors.Is(err, zk.ErrNoServer) ||
		errors.Is(err, net.ErrClosed) || errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) || errors.As(err, &ne)
}

// create adds an ephemeral sequential node under ns.parent, named with a
// fresh GUID, holding the backend's identity. Its czxid comes in the same
// round trip: the create and a no-op data write to the parent are one
// transaction (Multi), so the parent's new mzxid is the node's czxid. The
// node holds data: the owner it is created for, or waitingData for a
// ticket. A
// missing parent is created (a container node, which the server deletes
// when it has been empty for a while) and the create retried. When the
// answer is lost, the backend lists the parent and looks for the GUID: the
// node is either found (and returned) or known not to exist, so no node is
// left behind unknown.
//
// When owner is not empty (a create for that owner's grant, not a ticket),
// the same transaction checks that owner is not recorded as ended (it
// creates and deletes the record's node, which fails if the node exists):
// an ended owner's create is refused at the store, with an error matching
// driver.ErrNotAcquired.
//
// settle bounds how long a create whose answer was lost may stay unsettled
// (see findCreated). extra operations go in the same transaction, after
// the others (a queued grant deletes the owner's place in line); when one
// of them fails, the error matches errExtraFailed.
func (b *Backend) create(ns *nameState, data, owner string, settle time.Duration, extra ...any) (node, error) {
	guid := newGUID()
	ops := []any{
		&zk.CreateRequest{Path: ns.parent + "/" + guid + "-", Data: []byte(data), Acl: b.o.ACL, Flags: zk.FlagEphemeralSequential},
		&zk.SetDataRequest{Path: ns.parent, Data: nil, Version: -1},
	}
	if owner != "" {
		tomb := b.endedPath(ns.name, owner)
		ops = append(ops,
			&zk.CreateRequest{Path: tomb, Acl: b.o.ACL, Flags: zk.FlagPersistent},
			&zk.DeleteRequest{Path: tomb, Version: -1})
	}
	first := len(ops)
	ops = append(ops, extra...)
	for attempt := 0; ; attempt++ {
		before, _ := b.currentSession()
		sent := time.Now()
		res, err := b.conn.Multi(ops...)
		if err == nil && len(res) == len(ops) && res[1].Stat != nil && res[0].String != "" {
			after, _ := b.currentSession()
			n := node{path: res[0].String, czxid: res[1].Stat.Mzxid, session: after, sent: sent, mtime: res[1].Stat.Mtime, data: data}
			if after == 0 || (before != 0 && after != before) {
				// The client changed sessions around the request: the
				// node belongs to a session we cannot vouch for.
				b.deleteSure(n.path)
				return node{}, fmt.Errorf("zklease: acquire %q: the session changed while the node was created; retry", ns.name)
			}
			return n, nil
		}
		if err == nil {
			return node{}, fmt.Errorf("zklease: acquire %q: unexpected answer to the create: %+v", ns.name, res)
		}
		i, opErr := failedOp(res, err)
		switch {
		case len(extra) > 0 && i >= first:
			return node{}, fmt.Errorf("zklease: acquire %q: %w: %w", ns.name, errExtraFailed, opErr)
		case i == 2 && errors.Is(opErr, zk.ErrNodeExists):
			return node{}, errOwnerEnded(ns.name, owner)
		case i == 2 && errors.Is(opErr, zk.ErrNoNode) && attempt < 3:
			if perr := b.ensureEndedDir(); perr != nil {
				return node{}, perr
			}
			continue
		case i <= 1 && errors.Is(opErr, zk.ErrNoNode) && attempt < 3:
			if perr := b.ensureParent(ns.parent); perr != nil {
				return node{}, perr
			}
			continue
		case ambiguous(err):
			n, err := b.findCreated(ns, guid, before, sent, settle, err)
			n.data = data
			return n, err
		}
		return node{}, fmt.Errorf("zklease: acquire %q: create under %s: %w", ns.name, ns.parent, err)
	}
}

// findCreated settles a create whose answer was lost: it lists the parent
// until it can, and returns the node with the GUID if there is one. A node
// created in a session that has since ended is gone with it.
//
// A create whose answer was lost may still have been applied, and its node
// may be at the head of the queue, keeping every other client out, while
// this backend does not know its name (a sequential node's name comes in
// the answer), so it cannot delete it. When the listing cannot be had
// within settle of the create's send time (every answer is late: a client
// whose requests arrive later than go-zookeeper waits for an answer hears
// none, while its requests, and the reconnects that keep its session
// alive, still arrive), the backend ends the create's session at the store
// (endSessionBlind), which deletes the node wherever it is.
func (b *Backend) findCreated(ns *nameState, guid string, session int64, sent time.Time, settle time.Duration, cause error) (node, error) {
	if session != 0 {
		stop := make(chan struct{})
		defer close(stop)
		go func() {
			t := time.NewTimer(time.Until(sent.Add(settle)))
			defer t.Stop()
			for {
				select {
				case <-stop:
					return
				case <-b.closed:
					return
				case <-t.C:
				}
				wait := b.endSessionBlind(session)
				if wait <= 0 {
					return
				}
				t.Reset(wait)
			}
		}()
	}
	for {
		if b.isClosedNow() {
			return node{}, ErrClosed
		}
		if cur, _ := b.currentSession(); session != 0 && cur != session {
			// The session the create went out in has ended at the store
			// (sessions never come back), and the node, if any, with it.
			return node{}, fmt.Errorf("zklease: acquire %q: the answer to the create was lost (%w), and the session it was sent in has ended, with any node it made", ns.name, cause)
		}
		names, _, err := b.conn.Children(ns.parent)
		cur, _ := b.currentSession()
		if session != 0 && cur != session {
			continue
		}
		owner := session
		if owner == 0 {
			owner = cur
		}
		switch {
		case errors.Is(err, zk.ErrNoNode):
			return node{}, fmt.Errorf("zklease: acquire %q: the answer to the create was lost (%w), and no node was created", ns.name, cause)
		case err != nil:
			if !ambiguous(err) && !errors.Is(err, zk.ErrSessionExpired) {
				return node{}, fmt.Errorf("zklease: acquire %q: settling a create whose answer was lost: %w", ns.name, err)
			}
			time.Sleep(20 * time.Millisecond)
			continue
		}
		for _, n := range names {
			if strings.HasPrefix(n, guid+"-") {
				path := ns.parent + "/" + n
				sent := time.Now()
				ok, st, err := b.conn.Exists(path)
				if err != nil || !ok || st.EphemeralOwner != owner {
					b.deleteSure(path)
					return node{}, fmt.Errorf("zklease: acquire %q: the answer to the create was lost (%w); the node it made was given back", ns.name, cause)
				}
				return node{path: path, czxid: st.Czxid, session: owner, sent: sent, mtime: st.Mtime}, nil
			}
		}
		return node{}, fmt.Errorf("zklease: acquire %q: the answer to the create was lost (%w), and no node was created", ns.name, cause)
	}
}

// ensureParent creates the parent (a container) where missing, and the
// root's components (persistent) first if they are missing too.
func (b *Backend) ensureParent(parent string) error {
	createContainer := func() error {
		_, err := b.conn.CreateContainer(parent, nil, zk.FlagContainer, b.o.ACL)
		if err != nil && !errors.Is(err, zk.ErrNodeExists) {
			return err
		}
		return nil
	}
	err := createContainer()
	if !errors.Is(err, zk.ErrNoNode) {
		if err != nil {
			return fmt.Errorf("zklease: create %s: %w", parent, err)
		}
		return nil
	}
	// The root is missing (a new root, or deleted by an operator).
	p := ""
	for _, c := range strings.Split(b.o.Root[1:], "/") {
		p += "/" + c
		if _, err := b.conn.Create(p, nil, zk.FlagPersistent, b.o.ACL); err != nil && !errors.Is(err, zk.ErrNodeExists) {
			return fmt.Errorf("zklease: create %s: %w", p, err)
		}
	}
	if err := createContainer(); err != nil {
		return fmt.Errorf("zklease: create %s: %w", parent, err)
	}
	return nil
}

// list returns the parent's nodes in queue order. A listing lost with the
// connection is sent again (it is a read) until the server answers or the
// backend is closed; the caller's context bounds the caller's wait.
func (b *Backend) list(ns *nameState) ([]child, error) {
	for {
		names, _, err := b.conn.Children(ns.parent)
		switch {
		case errors.Is(err, zk.ErrNoNode):
			return nil, nil
		case err != nil && ambiguous(err) && !b.isClosedNow():
			time.Sleep(20 * time.Millisecond)
			continue
		case err != nil:
			return nil, fmt.Errorf("zklease: list %s: %w", ns.parent, err)
		}
		return parseChildren(ns.parent, names)
	}
}

// deleteSure deletes a node of ours, retrying connection errors until the
// server answers, the session the node lived in ends (and the node with
// it), or the backend is closed. A node left behind would hold a place in
// the queue for nobody.
func (b *Backend) deleteSure(path string) {
	for {
		err := b.conn.Delete(path, -1)
		switch {
		case err == nil, errors.Is(err, zk.ErrNoNode), errors.Is(err, zk.ErrSessionExpired), b.isClosedNow():
			return
		case ambiguous(err):
			time.Sleep(20 * time.Millisecond)
			continue
		}
		b.log.Warn("zklease: cannot delete a node; it lives until its session ends", "path", path, "err", err)
		return
	}
}
