package etcdlease

import (
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/fencekit/fencekit/lease/driver"
)

// Waiters in line (driver.Request.Queue, lease.Options.FIFO).
//
// A waiter's place is a key, LineKey(name, owner), attached to an etcd
// lease of the waiter's own: the one its refused attempts keep alive
// (kept by the Backend as the owner's place, not as a spare for others).
// The line is ordered by the keys' create revisions, as etcd's
// concurrency.Mutex orders its waiters. A queued acquire transaction adds
// one comparison to the create-if-absent one: every key of the line was
// created at or after the owner's own place (or, before the owner has a
// place, the line is empty); when granted, it also deletes the owner's
// place. When refused, it puts the owner's place if it has none (unless
// the owner was ended), and reads its create revision and the places
// ahead of it. A waiter that stops asking (its process died) loses its
// place when its etcd lease expires, one TTL (in whole seconds, rounded
// up) after its last attempt; Abandon deletes the place at once.

// LineKey returns the etcd key of owner's place in the line of the lease
// name: Prefix+"w/"+name+"\x00"+owner. The line of name is every key with
// the prefix Prefix+"w/"+name+"\x00".
func (b *Backend) LineKey(name, owner string) string {
	return b.linePrefix(name) + owner
}

func (b *Backend) linePrefix(name string) string { return b.o.Prefix + "w/" + name + "\x00" }

// place is a waiter's place in line, as this Backend last saw it.
type place struct {
	sp  *spare // the etcd lease the place's key is attached to
	rev int64  // the key's create revision (0: not known yet)
}

type placeKey struct{ name, owner string }

// takePlace returns the owner's place and removes it from the Backend (an
// attempt is using it), or nil. A place whose lease was not confirmed for
// three quarters of its TTL is dropped: its key may be gone with it.
func (b *Backend) takePlace(req driver.Request) *place {
	b.mu.Lock()
	defer b.mu.Unlock()
	k := placeKey{req.Name, req.Owner}
	p, ok := b.places[k]
	if !ok {
		return nil
	}
	delete(b.places, k)
	if time.Since(p.sp.confirmed) >= p.sp.ttl*3/4 {
		return nil
	}
	return p
}

// keepPlace records the owner's place for its next attempt.
func (b *Backend) keepPlace(req driver.Request, p *place) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed {
		return
	}
	if len(b.places) > 1024 {
		for k, q := range b.places {
			if time.Since(q.sp.confirmed) >= q.sp.ttl {
				delete(b.places, k)
			}
		}
	}
	b.places[placeKey{req.Name, req.Owner}] = p
}

// lineCompare is the queued acquire's comparison: the owner is first in
// line (no place created before its own; an empty line when it has none).
func (b *Backend) lineCompare(req driver.Request, p *place) clientv3.Cmp {
	if p == nil || p.rev == 0 {
		return clientv3.Compare(clientv3.CreateRevision(b.linePrefix(req.Name)).WithPrefix(), "=", 0)
	}
	return clientv3.Compare(clientv3.CreateRevision(b.linePrefix(req.Name)).WithPrefix(), ">", p.rev-1)
}

// lineRefusalOps are the queued acquire's reads and writes when it is
// refused, after the three of every acquire: the places ahead (keys
// only), the owner's place put if it has none, was not ended and does not
// hold the lease, and the owner's place read back.
func (b *Backend) lineRefusalOps(req driver.Request, p *place, id clientv3.LeaseID, endKey string) []clientv3.Op {
	mine := b.LineKey(req.Name, req.Owner)
	ahead := []clientv3.OpOption{clientv3.WithPrefix(), clientv3.WithKeysOnly()}
	if p != nil && p.rev > 0 {
		ahead = append(ahead, clientv3.WithMaxCreateRev(p.rev-1))
	}
	return []clientv3.Op{
		clientv3.OpGet(b.linePrefix(req.Name), ahead...),
		clientv3.OpTxn(
			[]clientv3.Cmp{clientv3.Compare(clientv3.CreateRevision(mine), "=", 0), clientv3.Compare(clientv3.CreateRevision(endKey), "=", 0)},
			// Not when the owner holds the lease (a retried attempt
			// whose grant's reply was lost): a holder has no place.
			[]clientv3.Op{clientv3.OpTxn(
				[]clientv3.Cmp{clientv3.Compare(clientv3.Value(b.Key(req.Name)), "=", req.Owner)},
				nil,
				[]clientv3.Op{clientv3.OpPut(mine, req.Owner, clientv3.WithLease(id))})},
			nil),
		clientv3.OpGet(mine),
	}
}

// placeAfterRefusal reads the refused queued acquire's answer: the owner's
// place (kept for its next attempt when its key is attached to sp's
// lease, which the place then owns) and the number of places ahead of it.
func (b *Backend) placeAfterRefusal(req driver.Request, sp *spare, resp *clientv3.TxnResponse) (ahead int, kept bool) {
	if len(resp.Responses) < 6 {
		return 0, false
	}
	ahead = len(resp.Responses[3].GetResponseRange().GetKvs())
	kvs := resp.Responses[5].GetResponseRange().GetKvs()
	if len(kvs) == 0 || clientv3.LeaseID(kvs[0].Lease) != sp.id {
		return ahead, false
	}
	b.keepPlace(req, &place{sp: sp, rev: kvs[0].CreateRevision})
	return ahead, true
}

// dropPlace forgets the owner's place (Abandon deletes its key) and
// revokes its lease in the background.
func (b *Backend) dropPlace(req driver.Request) {
	b.mu.Lock()
	k := placeKey{req.Name, req.Owner}
	p, ok := b.places[k]
	delete(b.places, k)
	b.mu.Unlock()
	if ok {
		b.revokeInBackground(p.sp.id)
	}
}

// hasPlaces reports whether the Backend keeps a place in the line of name
// for one of its waiters. Backend.mu must be held.
func (b *Backend) hasPlaces(name string) bool {
	for k := range b.places {
		if k.name == name {
			return true
		}
	}
	return false
}

// passWake wakes the next of this Backend's waiters of name after a queued
// attempt was refused for a waiter ahead while the name was free: the
// waiter the last deletion woke was not the first in line (see Watch).
func (b *Backend) passWake(name string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if nw := b.watches[name]; nw != nil && nw.passes > 0 && nw.next < len(nw.waiters) {
		nw.passes--
		signal(nw.waiters[nw.next].ch)
		nw.next++
	}
}
