package etcdlease

import (
	"context"
	"slices"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
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
// ahead of it. An attempt that etcd would refuse as it refused the last
// one sends nothing (stillRefused): the place was confirmed less than an
// eighth of its TTL ago, and the name's watch, created at or before that
// refusal, has seen no change of the key since (the attempt a blocking
// Acquire makes right after its Watch begins, and its polls while nothing
// happens). A waiter that stops asking (its process died) loses its
// place when its etcd lease expires, one TTL (in whole seconds, rounded
// up) after its last attempt that reached etcd; Abandon deletes the place
// at once.
//
// The hand-over. The Release of a grant made to a waiter in line (so the
// name is used in line) first finds the line's first place: one of its own
// Backend's waiters whose places ahead have all left, as the Backend's
// watch saw (localFirst), or else by a read (a serializable read, answered
// by the member the client talks to, without consensus). It then hands
// the name to it in its one transaction: if the grant is still
// the releaser's and that place is still the first of the line, the
// lease's key is overwritten with the waiter's owner, attached to the etcd
// lease of its place, and the place deleted. The write's revision mints
// the waiter's token (token = base + the key's mod revision, for every
// grant), so tokens still grow in grant order. Otherwise (the place is
// gone, another is now first, the line is empty) the transaction releases
// as without a line. The waiter's Backend sees the overwrite on its watch
// of the key, records the hand-over and wakes the waiter (a Backend that
// handed the name to one of its own waiters records it as the transaction
// returns, before its watch sees it), whose next attempt only checks it:
// a read-only transaction (the key holds the owner, at that revision, on
// that etcd lease; the epoch and the owner not ended). The grant counts
// from the send time of the keep-alive that last confirmed the place's
// etcd lease, sent by the waiter's last refused attempt, when that was
// less than a quarter of the TTL ago (driver.Grant.Sent): etcd keeps the
// lease, and the key now attached to it, that long from then. Otherwise a keep-alive of the lease goes beside
// the read, so that the grant counts from the attempt's send time. A
// hand-over costs one write, the release's, and one read, as a
// concurrency.Mutex hand-over costs one write (and two reads). A waiter handed the name that has
// died holds it until its place's etcd lease expires, as long as its
// place would have kept the name free for it.
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
	// refused is the revision at which the owner's last attempt was
	// refused (0: not known), and ahead the keys of the places that were
	// before its own then, less those this Backend has seen leave since
	// (placesLeft): when none is left, the place is first in line.
	refused int64
	ahead   []string
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
	if b.since(p.sp.confirmed) >= p.sp.ttl*3/4 {
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
			if b.since(q.sp.confirmed) >= q.sp.ttl {
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
	mine := b.LineKey(req.Name, req.Owner)
	var before []string
	for _, kv := range resp.Responses[3].GetResponseRange().GetKvs() {
		if k := string(kv.Key); k != mine {
			before = append(before, k)
		}
	}
	ahead = len(before)
	kvs := resp.Responses[5].GetResponseRange().GetKvs()
	if len(kvs) == 0 || clientv3.LeaseID(kvs[0].Lease) != sp.id {
		return ahead, false
	}
	b.keepPlace(req, &place{sp: sp, rev: kvs[0].CreateRevision, refused: resp.Header.Revision, ahead: before})
	return ahead, true
}

// stillRefused reports whether req.Owner's queued attempt would be refused
// as its last one was, without asking etcd: this Backend keeps its place,
// confirmed less than an eighth of its TTL ago (so an attempt need not keep
// it alive yet: the next one, at most PollInterval <= TTL/2 later, still
// finds the place within takePlace's three quarters), and the watch of the
// name (Watch) was created at or
// before the revision of that refusal and has delivered no event of the key
// since. The key has then not changed since the refusal, which found it
// another owner's: etcd would refuse again. (A hand-over to the owner is a
// change: the watch records it, and the attempt takes it.) That is the
// attempt a blocking Acquire sends right after its Watch, in case a release
// came before the watch began, and each of its polls while nothing happens.
// The place's key is left as it is; ahead is the count of the last
// refusal.
func (b *Backend) stillRefused(req driver.Request) (ahead int, ok bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	p, nw := b.places[placeKey{req.Name, req.Owner}], b.watches[req.Name]
	if p == nil || p.refused == 0 || nw == nil || nw.ended || nw.from == 0 || nw.from > p.refused || nw.last > p.refused ||
		b.since(p.sp.confirmed) >= p.sp.ttl/8 {
		return 0, false
	}
	return len(p.ahead), true
}

// placesLeft records that the owner's place in the line of name is gone:
// a put of the lease's key naming owner (a grant in line or a hand-over)
// deletes it in the same transaction. Backend.mu must be held.
func (b *Backend) placesLeft(name, owner string) {
	gone := b.LineKey(name, owner)
	for k, p := range b.places {
		if k.name == name && len(p.ahead) > 0 {
			p.ahead = slices.DeleteFunc(p.ahead, func(key string) bool { return key == gone })
		}
	}
}

// localFirst returns, as the line's first place, the place of one of this
// Backend's waiters of name that is first in line by what the Backend
// knows: every place that was ahead of it at its last refusal has left
// since (placesLeft). The Release that hands the name over then needs no
// read of the line (firstInLine); its transaction checks that the place
// is still there and first, as for a place it read. nil if there is none.
func (b *Backend) localFirst(name string) *mvccpb.KeyValue {
	b.mu.Lock()
	defer b.mu.Unlock()
	var first *place
	var owner string
	for k, p := range b.places {
		if k.name == name && p.rev > 0 && p.refused > 0 && len(p.ahead) == 0 && (first == nil || p.rev < first.rev) {
			first, owner = p, k.owner
		}
	}
	if first == nil {
		return nil
	}
	return &mvccpb.KeyValue{Key: []byte(b.LineKey(name, owner)), CreateRevision: first.rev, Value: []byte(owner), Lease: int64(first.sp.id)}
}

// dropPlace forgets the owner's place (Abandon deletes its key) and
// revokes its lease in the background.
func (b *Backend) dropPlace(req driver.Request) {
	b.mu.Lock()
	k := placeKey{req.Name, req.Owner}
	p, ok := b.places[k]
	delete(b.places, k)
	delete(b.handed, k)
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

// waitingFor reports whether an owner has a queued attempt for name in
// flight in this Backend. Backend.mu must be held.
func (b *Backend) waitingFor(name string) bool {
	for k := range b.waiting {
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

// markWaiting records that req.Owner has a queued attempt in flight (its
// place is out of Backend.places meanwhile), until the returned func is
// called: a hand-over to it is then recorded (see Watch).
func (b *Backend) markWaiting(req driver.Request) func() {
	k := placeKey{req.Name, req.Owner}
	b.mu.Lock()
	b.waiting[k]++
	b.mu.Unlock()
	return func() {
		b.mu.Lock()
		if b.waiting[k]--; b.waiting[k] <= 0 {
			delete(b.waiting, k)
		}
		b.mu.Unlock()
	}
}

// inLine reports whether owner waits in the line of name in this Backend
// (a place kept, or an attempt in flight). Backend.mu must be held.
func (b *Backend) inLine(name, owner string) bool {
	k := placeKey{name, owner}
	_, ok := b.places[k]
	return ok || b.waiting[k] > 0
}

// handover is a grant a Release made to a waiter by overwriting the
// lease's key (see the top of this file), as the waiter's watch saw it.
type handover struct {
	rev   int64            // the overwrite's revision: the key's mod revision
	lease clientv3.LeaseID // the etcd lease of the waiter's place, now the grant's
	at    time.Time        // when the watch saw it
}

// sawHandover records, from a put on the lease's key seen by the watch of
// its name, a hand-over to one of this Backend's waiters, and reports
// whether it was one. A put that created the key is a grant, not a
// hand-over. Backend.mu must be held.
func (b *Backend) sawHandover(name string, kv *mvccpb.KeyValue) bool {
	if kv.ModRevision == kv.CreateRevision {
		return false
	}
	return b.recordHandover(name, string(kv.Value), kv.ModRevision, clientv3.LeaseID(kv.Lease))
}

// handedHere records a hand-over that a Release of this Backend made, at
// revision rev, to next (the place it handed the name to), when next is
// one of this Backend's waiters: the waiter's next attempt takes it at
// once, even before the watch of the name delivers the overwrite (until
// then stillRefused would refuse it as its last attempt was refused).
func (b *Backend) handedHere(name string, next *mvccpb.KeyValue, rev int64) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.placesLeft(name, string(next.Value))
	b.recordHandover(name, string(next.Value), rev, clientv3.LeaseID(next.Lease))
}

// recordHandover records a hand-over of name to owner at revision rev, on
// the etcd lease of its place, if owner waits in line in this Backend, and
// reports whether it did. Backend.mu must be held.
func (b *Backend) recordHandover(name, owner string, rev int64, lease clientv3.LeaseID) bool {
	if !b.inLine(name, owner) {
		return false
	}
	if len(b.handed) >= 1024 {
		for k, h := range b.handed {
			if b.since(h.at) > time.Minute {
				delete(b.handed, k)
			}
		}
	}
	b.handed[placeKey{name, owner}] = handover{rev: rev, lease: lease, at: b.now()}
	return true
}

// takeHanded returns, and forgets, the hand-over to req.Owner the watch
// recorded, if any.
func (b *Backend) takeHanded(req driver.Request) (handover, bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	k := placeKey{req.Name, req.Owner}
	h, ok := b.handed[k]
	delete(b.handed, k)
	return h, ok
}

// forgetHandover forgets a hand-over to req.Owner once it holds the name
// (an attempt found the grant without the record's help).
func (b *Backend) forgetHandover(req driver.Request) {
	b.mu.Lock()
	delete(b.handed, placeKey{req.Name, req.Owner})
	b.mu.Unlock()
}

// passHandover wakes the next of this Backend's waiters of name when a
// queued attempt was refused because the name was handed over to holder,
// another of this Backend's waiters, which the wake missed.
func (b *Backend) passHandover(name, holder string) {
	b.mu.Lock()
	_, ok := b.handed[placeKey{name, holder}]
	b.mu.Unlock()
	if ok {
		b.passWake(name)
	}
}

// acceptHandover takes the grant h that a Release handed to req.Owner,
// without a write: a read-only, linearizable transaction checks that the
// key still holds the owner at h's revision on h's etcd lease, that the
// epoch is ep (and its key older than the hand-over) and that the owner was
// not ended. h's etcd lease is the one of the owner's place, kept alive by
// the owner's refused attempts: when this Backend kept the place and the
// lease was confirmed less than a quarter of its TTL ago (placeLease), etcd
// keeps the grant for its TTL from that confirmation's send time, and the
// grant counts from there (driver.Grant.Sent) without a keep-alive;
// otherwise a keep-alive goes beside the read, so that the grant counts
// from this attempt. ok is false when any of that does not hold: the
// attempt then goes on as any other.
func (b *Backend) acceptHandover(ctx context.Context, req driver.Request, key string, secs int64, ep *epoch, h handover) (g driver.Grant, ok bool) {
	floor := b.revisionFloor(ep)
	sent, ttl, fresh := b.placeLease(req, h.lease)
	var kaDone chan keepAliveResult
	if !fresh {
		kaDone = make(chan keepAliveResult, 1)
		go func() {
			sent := b.now()
			resp, err := b.c.KeepAliveOnce(ctx, h.lease)
			kaDone <- keepAliveResult{sent: sent, resp: resp, err: err}
		}()
	}
	resp, err := b.c.Txn(ctx).If(
		clientv3.Compare(clientv3.Value(key), "=", req.Owner),
		clientv3.Compare(clientv3.ModRevision(key), "=", h.rev),
		clientv3.Compare(clientv3.LeaseValue(key), "=", h.lease),
		clientv3.Compare(clientv3.Value(b.epochKey), "=", ep.value),
		clientv3.Compare(clientv3.CreateRevision(b.epochKey), "<", h.rev),
		clientv3.Compare(clientv3.CreateRevision(b.EndedKey(req.Name, req.Owner)), "=", 0),
	).Then(
		// A read of its own: etcd serves a transaction with no
		// operation, or with serializable reads only, from the member's
		// own state, which may not have the hand-over yet; a
		// linearizable read makes the whole transaction linearizable.
		clientv3.OpGet(key, clientv3.WithCountOnly()),
	).Commit()
	ok = err == nil && resp.Succeeded && resp.Header.Revision >= floor
	// (A read older than a revision seen complete before it was sent: the
	// revisions went back, and the attempt that follows starts a new
	// epoch.)
	if kaDone != nil {
		ka := <-kaDone
		ok = ok && ka.err == nil && ka.resp.TTL > 0
		if ok {
			sent, ttl = ka.sent, time.Duration(ka.resp.TTL)*time.Second
		}
	}
	if !ok {
		return driver.Grant{}, false
	}
	b.sawRevision(ep, resp.Header.Revision)
	if p := b.takePlace(req); p != nil && p.sp.id != h.lease {
		b.putSpare(p.sp) // nothing is attached to it any more
	}
	g = b.granted(req, key, h.lease, secs, ttl, sent, ep.base+h.rev, h.rev)
	if fresh {
		g.Sent = sent
	}
	return g, true
}

// placeLease reports, when this Backend keeps req.Owner's place on the etcd
// lease id and confirmed that lease less than a quarter of its TTL ago, the
// send time of that confirmation and the lease's TTL: etcd keeps the lease,
// and any key attached to it, for at least that TTL from then (a keep-alive
// is answered after it was sent; a new leader extends every lease).
func (b *Backend) placeLease(req driver.Request, id clientv3.LeaseID) (sent time.Time, ttl time.Duration, ok bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	p := b.places[placeKey{req.Name, req.Owner}]
	if p == nil || p.sp.id != id || b.since(p.sp.confirmed) >= p.sp.ttl/4 {
		return time.Time{}, 0, false
	}
	return p.sp.confirmed, p.sp.ttl, true
}

// firstInLine returns the first place in the line of name, read from the
// member the client talks to (serializable: it may be a little behind,
// which the hand-over's comparisons catch), or nil if the line is empty or
// the read failed.
func (b *Backend) firstInLine(ctx context.Context, name string) *mvccpb.KeyValue {
	resp, err := b.c.Get(ctx, b.linePrefix(name), append(clientv3.WithFirstCreate(), clientv3.WithSerializable())...)
	if err != nil || len(resp.Kvs) == 0 {
		return nil
	}
	return resp.Kvs[0]
}

// handOver is the hand-over of the lease's key to next, the first place
// in the line of name when Release read it: the comparisons (next is still
// there and first) and the writes (the key overwritten with next's owner,
// on next's etcd lease; the place deleted).
func (b *Backend) handOver(key, name string, next *mvccpb.KeyValue) ([]clientv3.Cmp, []clientv3.Op) {
	return []clientv3.Cmp{
			clientv3.Compare(clientv3.CreateRevision(string(next.Key)), "=", next.CreateRevision),
			clientv3.Compare(clientv3.CreateRevision(b.linePrefix(name)).WithPrefix(), ">", next.CreateRevision-1),
		}, []clientv3.Op{
			clientv3.OpPut(key, string(next.Value), clientv3.WithLease(clientv3.LeaseID(next.Lease))),
			clientv3.OpDelete(string(next.Key)),
		}
}
