// Package etcdlease is the etcd backend of package lease, over the official
// client go.etcd.io/etcd/client/v3. It is a module of its own, so that
// users of the core library do not inherit grpc.
//
// # How a lease is kept
//
// A grant is an etcd lease of its own plus one key, "<prefix>l/<name>",
// holding the owner and attached to that lease:
//
//   - Acquire: LeaseGrant with the TTL in whole seconds (rounded up), then
//     one transaction: if the key does not exist (create revision 0), the
//     epoch key is the one this backend read (see below) and the owner is
//     not recorded as ended (see Release), put the key with the owner as
//     its value, attached to the new lease. Two round trips. The TTL etcd granted (LeaseGrantResponse.TTL: never less than
//     asked; etcd raises a TTL below its minimum) is Grant.TTL. A refused
//     attempt keeps its etcd lease, which no key is attached to, for a
//     later attempt asking the same TTL, and so does a Release (below);
//     that attempt sends only its transaction and, alongside it, a
//     keep-alive of the lease, so that the grant counts from the
//     attempt's own send time: one round trip. That is what a waiter's
//     attempts, a hand-off and an acquire after a release cost. A kept lease
//     that no attempt uses within half its TTL is left to expire at the
//     store. A retry by the same owner (an attempt whose reply was lost)
//     finds the key holding its own value and gets that grant back,
//     extended by a keep-alive. A refusal does not say how long the holder
//     has left (that would cost a round trip): waiters are woken by the
//     key's deletion instead, expiry included.
//   - Renew (driven by the Manager): a keep-alive of the grant's etcd lease
//     and, at the same time, a read-only transaction that checks that the
//     key still holds this owner, was last written by this grant's own
//     write (mod revision) and is attached to this lease. An expired or revoked lease
//     or a key that is gone or another grant's is ErrNotHeld. RenewBatch
//     checks up to 128 keys in one transaction and sends the keep-alives
//     at once: one round trip for the whole batch.
//   - Release: one transaction, the compare-and-delete: if the key is
//     still this grant's (its mod revision, owner and etcd lease), it
//     is deleted; in any case the owner is recorded as ended, in the key
//     "<prefix>e/<name>\x00<owner>" (EndedKey), attached to an etcd lease
//     that keeps it for at least driver.EndedOwnerTTL of the grant's TTL
//     (the backend grants one such lease per EndedOwnerTTL, for twice that
//     time, and attaches records to it for the first half). Every acquire
//     transaction compares that key, so an acquire request of an ended
//     owner that reaches etcd late (an attempt the Manager stopped waiting
//     for) grants nothing. One round trip; the grant's etcd lease, with
//     nothing attached any more, is kept for a later attempt, as a refused
//     attempt's is, when it was confirmed less than half its TTL ago, and
//     revoked in the background otherwise. A key
//     that is gone or another grant's is ErrNotHeld, unless the owner was
//     already recorded as ended: a release sent again after its reply was
//     lost is a release (nil), never a loss. A release whose outcome is
//     unknown (Unavailable: a broken connection, a lost leader, etcd's
//     request timeout) is sent again until answered or its context ends.
//     A Grant whose Owner or Token differ from the ones its State was made
//     for is ErrNotHeld without any request (its State names another
//     grant's lease).
//   - Abandon: one transaction that deletes the key if it holds the owner
//     (any token) and records the owner as ended, as Release does.
//   - Waiters (Watcher) watch the key for deletions: a release, an expiry
//     or a revoke wakes a waiter at once. The waiters of one name in one
//     Backend share one etcd watch, and each deletion wakes the one that
//     waited longest, not all of them (only one can win).
//   - Waiters in line (driver.Request.Queue, lease.Options.FIFO): a
//     waiter's place is the key LineKey(name, owner), attached to the etcd
//     lease its refused attempts keep alive; the line is ordered by create
//     revision, as concurrency.Mutex orders its waiters. A queued acquire
//     is the same one transaction with one more comparison (no place in
//     the line was created before the owner's own) and, when refused, the
//     owner's place put and read back: still one round trip; none when
//     the name's watch shows that nothing changed since the owner's last
//     refusal and the place needs no keep-alive yet (line.go). The Release
//     of a grant made in line hands the name over: it reads the first
//     place (a serializable read, one more round trip to the member, no
//     consensus; none when the first is one of its own Backend's waiters
//     and the Backend knows it is first), and its transaction overwrites
//     the key with that
//     waiter's owner on the etcd lease of its place; the waiter's Backend
//     sees the overwrite on its watch, and the waiter's next attempt is a
//     read-only transaction: a hand-off costs one write, as a
//     concurrency.Mutex hand-off does (see line.go). The grant counts from
//     the send time of the keep-alive that last confirmed the place's etcd
//     lease (Grant.Sent), sent by the waiter's last refused attempt, if
//     that was less than a quarter of the TTL ago; otherwise a keep-alive
//     goes beside the read. A place lapses with its etcd lease when its
//     waiter stops asking; Abandon deletes it.
//   - Holder (driver.Inspector) reads the key and the epoch key in one
//     transaction, and the lease's time to live: two round trips.
//   - Revoke (driver.Revoker, an operator's fencekit lease revoke) reads
//     the key and the epoch key, then deletes the key in one transaction
//     if it still holds the named owner at the revision of the named
//     token, recording the owner as ended ("lost"); the holder's Backend
//     sees the deletion on its watch and ends the lease at once. List and
//     Status (driver.Lister) read the lease keys and the places in line
//     under a prefix, then Holder and a count of places per name.
//   - A held grant's key is watched too (from its mod revision, so
//     nothing is missed): when the key is deleted or changed by anything
//     but this grant's Release (the lease expired at the store, an
//     operator revoked it or deleted the key), the lease ends at once
//     through Request.Notify.Lost.
//
// The Manager owns time: a grant's local deadline counts from the send time
// of the request that last confirmed it, whatever etcd does with its own
// TTL. (etcd resets every lease's remaining TTL when a new leader is
// elected, so the store may keep a grant longer than the deadline says,
// never shorter.)
//
// A request sent while the leader dies may get no answer until etcd's
// request timeout (about 5 s: the member forwarded the proposal to the dead
// leader). A blocking lease.Manager.Acquire abandons an attempt once the
// lease's validity has passed and sends it again with the same owner, so a
// waiter is not held that long: in TestLeaderKilled at TTL 1 s, an
// abandoned grant was taken over 1.6-1.8 s after its leader was killed
// (4 runs; 5.2-5.3 s before Acquire bounded its attempts). Pass TryAcquire
// a context with a timeout for the same effect.
//
// # Fencing tokens, and what survives data loss
//
// The token of a grant is the revision of the transaction that made the
// key this grant's (created it, or, for a hand-over to a waiter in line,
// overwrote it: the key's mod revision) plus a base kept in the key
// "<prefix>epoch": token = base + revision.
// Revisions grow with every write to the cluster, across leader changes and
// full restarts, so tokens strictly grow per cluster.
//
// Revisions start again at 1 when the data is lost (the data directories
// wiped, a new cluster in place of the old one). The base is what keeps
// tokens growing then: the epoch key holds the client's wall clock in
// microseconds when it was created (by the first Acquire of a cluster, or
// after it was lost), and base = that time - the key's create revision. So
// a token is at most the time of its grant in microseconds (as long as the
// cluster makes fewer than a million writes a second, which etcd cannot),
// and the first token after a loss is at least the time of the loss. Every
// acquire transaction compares the epoch key's value with the one the
// backend read, so no grant is ever minted with a base from before a loss.
// The assumption, as in package redislease but with the clients' clocks:
// no client's clock is stepped back, and the clocks of the clients differ
// by less than the time between the last grant before a loss and the first
// after it. Tokens stay below 2^53 until the year 2255.
//
// A restore from a backup rolls revisions back but also brings back the old
// epoch key, so it does not start a new epoch by itself. A Backend that
// has seen a higher revision than the restored cluster's notices (a grant's
// revision below one it saw complete before it sent the request) and
// starts a new epoch before it grants anything. Other processes cannot
// tell: after restoring etcd from a backup, delete the epoch key (etcdctl
// del <prefix>epoch) before clients come back, or restore with etcdutl
// snapshot restore --bump-revision (by more than the writes made since the
// backup) --mark-compacted, which keeps revisions growing.
//
// Exclusivity is etcd's: the create-if-absent transaction is linearizable,
// and a key is deleted only with its lease (expiry, revoke) or by an
// operator. The fencing token is what makes a holder that was paused past
// its deadline harmless at the store (packages sqlguard and blobguard).
package etcdlease

import (
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/fencekit/fencekit/fence"
	"github.com/fencekit/fencekit/lease/driver"
)

// Client is the part of an etcd client the backend uses. *clientv3.Client
// satisfies it, as does a wrapper that injects faults.
type Client interface {
	clientv3.KV
	clientv3.Lease
	clientv3.Watcher
}

var (
	_ Client              = (*clientv3.Client)(nil)
	_ driver.Backend      = (*Backend)(nil)
	_ driver.Watcher      = (*Backend)(nil)
	_ driver.BatchRenewer = (*Backend)(nil)
	_ driver.Inspector    = (*Backend)(nil)
	_ driver.Checker      = (*Backend)(nil)
)

var (
	// ErrInvalidOptions is matched by New's error for unusable options.
	ErrInvalidOptions = errors.New("etcdlease: invalid options")
	// ErrClosed is returned by Acquire and Watch after Close.
	ErrClosed = errors.New("etcdlease: backend closed")
	// ErrCorruptEpoch is returned by Acquire when the epoch key holds
	// something that is not a token base this package wrote (fail closed:
	// no token is minted from it). Delete the key to start a new epoch.
	ErrCorruptEpoch = errors.New("etcdlease: corrupt epoch key")
)

// DefaultMinTTL is the shortest TTL an etcd server with the default
// election timeout (1000 ms) grants: etcd raises a lease's TTL to 1.5 ×
// the election timeout, rounded up to whole seconds.
const DefaultMinTTL = 2 * time.Second

// MaxTTL is the longest TTL etcd grants (its MaxLeaseTTL, 9,000,000,000 s).
const MaxTTL = 9_000_000_000 * time.Second

// MaxTxnOps is the number of keys RenewBatch checks in one transaction:
// etcd's default --max-txn-ops. Larger batches are split.
const MaxTxnOps = 128

// maxKeepAlives bounds the keep-alives RenewBatch has in flight at once.
const maxKeepAlives = 64

// Options configures a Backend. New starts from the defaults documented on
// each field and applies each Option in turn.
type Options struct {
	// Prefix starts every key the backend writes. Default "fencekit/". A
	// lease named N is the key Prefix+"l/"+N; the token base is the key
	// Prefix+"epoch".
	Prefix string

	// MinTTL is the shortest TTL the Manager may ask for (Limits.MinTTL): a
	// whole number of seconds, at least 1 s. Default DefaultMinTTL (2 s),
	// the minimum of a server with the default election timeout. A server
	// with an election timeout of E grants at least 1.5 × E rounded up to
	// whole seconds, whatever is asked, and Grant.TTL then says so; set
	// MinTTL to that to have the Manager refuse shorter TTLs up front.
	MinTTL time.Duration
}

// Option sets fields of Options; any func(*Options) is one.
type Option func(*Options)

// WithPrefix sets Options.Prefix.
func WithPrefix(prefix string) Option { return func(o *Options) { o.Prefix = prefix } }

// WithMinTTL sets Options.MinTTL.
func WithMinTTL(d time.Duration) Option { return func(o *Options) { o.MinTTL = d } }

// Backend stores leases in etcd. It is safe for concurrent use. Call Close
// when done: it ends the backend's watches. It does not close the client.
type Backend struct {
	c        Client
	o        Options
	epochKey string

	ctx    context.Context // parent of the backend's watches; cancelled by Close
	cancel context.CancelFunc
	wg     sync.WaitGroup // the watches' goroutines

	mu       sync.Mutex
	closed   bool
	epoch    *epoch
	seenRev  int64                 // the highest revision of a completed response, in this epoch
	spares   map[int64][]*spare    // leases of refused attempts, by TTL in seconds, oldest first
	minEpoch int64                 // the least value a new epoch may have (after a rewind)
	watches  map[string]*nameWatch // the watches waiters share, by lease name
	places   map[placeKey]*place   // waiters' places in line, by name and owner (line.go)
	waiting  map[placeKey]int      // owners with a queued attempt in flight, by name and owner (line.go)
	handed   map[placeKey]handover // grants a Release handed to this Backend's waiters, not yet taken (line.go)
	ended    map[int64]*endedLease // the etcd leases ended-owner records share, by EndedOwnerTTL in seconds

	// now is the clock of the send times and ages of etcd leases, places
	// and hand-overs: time.Now, or a test's clock (export_test.go). The
	// epoch's value is read from the wall clock itself.
	now func() time.Time
}

// since is the time elapsed since t by the Backend's clock.
func (b *Backend) since(t time.Time) time.Duration { return b.now().Sub(t) }

// New returns a Backend over c. It does no I/O. It returns an error
// matching ErrInvalidOptions, listing every problem, when c is nil, Prefix
// is empty, or MinTTL is not a whole number of seconds of at least 1 s.
func New(c Client, opts ...Option) (*Backend, error) {
	o := Options{Prefix: "fencekit/", MinTTL: DefaultMinTTL}
	for _, opt := range opts {
		if opt != nil {
			opt(&o)
		}
	}
	var errs []error
	if c == nil {
		errs = append(errs, fmt.Errorf("%w: client is nil", ErrInvalidOptions))
	}
	if o.Prefix == "" {
		errs = append(errs, fmt.Errorf("%w: prefix is empty (the backend's keys would mix with others')", ErrInvalidOptions))
	}
	if o.MinTTL < time.Second || o.MinTTL%time.Second != 0 {
		errs = append(errs, fmt.Errorf("%w: MinTTL is %v, it must be a whole number of seconds, at least 1s", ErrInvalidOptions, o.MinTTL))
	}
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	ctx, cancel := context.WithCancel(context.Background())
	return &Backend{
		c: c, o: o, epochKey: o.Prefix + "epoch",
		ctx: ctx, cancel: cancel,
		spares:  make(map[int64][]*spare),
		places:  make(map[placeKey]*place),
		waiting: make(map[placeKey]int),
		handed:  make(map[placeKey]handover),
		now:     time.Now,
	}, nil
}

// Options returns the backend's options, with defaults filled in.
func (b *Backend) Options() Options { return b.o }

// Key returns the etcd key of the lease name.
func (b *Backend) Key(name string) string { return b.o.Prefix + "l/" + name }

// EpochKey returns the etcd key that holds the token base.
func (b *Backend) EpochKey() string { return b.epochKey }

// Limits implements driver.Backend: whole seconds, from Options.MinTTL to
// MaxTTL; waiters are kept in line (driver.Request.Queue: see LineKey).
func (b *Backend) Limits() driver.Limits {
	return driver.Limits{MinTTL: b.o.MinTTL, MaxTTL: MaxTTL, Resolution: time.Second, Queues: true}
}

// grantState is a grant's Grant.State: what the backend needs to renew and
// release it. Only confirmed and leaseDone change once it is made.
type grantState struct {
	id    clientv3.LeaseID
	key   string
	owner string
	token fence.Token
	rev   int64 // the key's mod revision, the write that made it this grant's (a create, or a hand-over in line.go): token - epoch base
	line  bool  // granted to a waiter in line (Request.Queue): its Release hands the name to the next one
	held  *heldWatch
	secs  int64         // the TTL asked for, in seconds (the spare pool of the etcd lease once released)
	ttl   time.Duration // the TTL etcd granted
	// confirmed is the send time of the last request that confirmed the
	// etcd lease (the acquire's, a renewal's keep-alive).
	confirmed atomic.Pointer[time.Time]
	// leaseDone is set by the first of Release and a renewal that finds
	// the key gone to decide what becomes of the etcd lease once it holds
	// nothing of the grant's: kept as a spare for a later attempt (a
	// clean Release) or revoked. Whichever sets it is the only one to act,
	// so that a lease kept for another grant is never revoked by this one.
	leaseDone atomic.Bool
}

// stateOf returns g's state if g is the grant it was made for.
func stateOf(g driver.Grant) (*grantState, bool) {
	st, ok := g.State.(*grantState)
	if !ok || st == nil || st.owner != g.Owner || st.token != g.Token {
		return nil, false
	}
	return st, true
}

// ttlSeconds rounds ttl up to whole seconds.
func ttlSeconds(ttl time.Duration) (int64, error) {
	if ttl <= 0 || ttl > MaxTTL {
		return 0, fmt.Errorf("etcdlease: TTL %v is outside (0, %v]", ttl, MaxTTL)
	}
	return int64(math.Ceil(ttl.Seconds())), nil
}

// Acquire implements driver.Backend. The first attempt of an Acquire call
// costs two round trips (LeaseGrant, then the create-if-absent
// transaction); later attempts of the same call, one (the transaction and a
// keep-alive of the lease granted before, sent together). Refused
// credentials and permissions match driver.ErrSetup, with the fix (see
// Check); they end a blocking Acquire at once.
func (b *Backend) Acquire(ctx context.Context, req driver.Request) (driver.Grant, error) {
	if req.Owner == "" {
		return driver.Grant{}, errors.New("etcdlease: acquire: owner is empty")
	}
	secs, err := ttlSeconds(req.TTL)
	if err != nil {
		return driver.Grant{}, err
	}
	if b.isClosed() {
		return driver.Grant{}, ErrClosed
	}
	key := b.Key(req.Name)
	// A few rounds: the epoch may have to be read again (after a data
	// loss, or when a rewind of revisions starts a new one).
	for round := 0; ; round++ {
		g, retry, err := b.acquireOnce(ctx, req, key, secs)
		if !retry || round == 3 {
			return g, b.setup(err)
		}
	}
}

// acquireOnce makes one attempt; retry reports that the epoch changed and
// the attempt should be made again.
func (b *Backend) acquireOnce(ctx context.Context, req driver.Request, key string, secs int64) (g driver.Grant, retry bool, err error) {
	ep, err := b.currentEpoch(ctx)
	if err != nil {
		return driver.Grant{}, false, err
	}
	var pl *place // the owner's place in line (queued acquires)
	if req.Queue {
		defer b.markWaiting(req)()
		if h, ok := b.takeHanded(req); ok {
			if g, ok := b.acceptHandover(ctx, req, key, secs, ep, h); ok {
				return g, false, nil
			}
		}
		if ahead, ok := b.stillRefused(req); ok {
			return driver.Grant{}, false, &driver.NotAcquiredError{Name: req.Name, Ahead: max(ahead, 1)}
		}
		pl = b.takePlace(req)
	}
	var sp *spare
	if pl != nil {
		sp = pl.sp
	} else {
		sp = b.takeSpare(secs)
	}
	var kaDone chan keepAliveResult
	if sp == nil {
		sent := b.now()
		resp, err := b.c.Grant(ctx, secs)
		if err != nil {
			return driver.Grant{}, false, fmt.Errorf("etcdlease: acquire %q: lease grant: %w", req.Name, err)
		}
		sp = &spare{id: resp.ID, secs: secs, ttl: time.Duration(resp.TTL) * time.Second, confirmed: sent}
		if resp.TTL < secs {
			b.revokeQuietly(sp.id)
			return driver.Grant{}, false, fmt.Errorf("etcdlease: acquire %q: etcd granted a TTL of %ds, shorter than the %ds asked for", req.Name, resp.TTL, secs)
		}
	} else {
		// The lease was granted by an earlier attempt: confirm it again
		// from now, alongside the transaction.
		kaDone = make(chan keepAliveResult, 1)
		go func(id clientv3.LeaseID) {
			sent := b.now()
			resp, err := b.c.KeepAliveOnce(ctx, id)
			kaDone <- keepAliveResult{sent: sent, resp: resp, err: err}
		}(sp.id)
	}
	floor := b.revisionFloor(ep)
	endKey := b.EndedKey(req.Name, req.Owner)
	cmps := []clientv3.Cmp{clientv3.Compare(clientv3.CreateRevision(key), "=", 0),
		clientv3.Compare(clientv3.Value(b.epochKey), "=", ep.value),
		clientv3.Compare(clientv3.CreateRevision(endKey), "=", 0)}
	then := []clientv3.Op{clientv3.OpPut(key, req.Owner, clientv3.WithLease(sp.id))}
	els := []clientv3.Op{clientv3.OpGet(key), clientv3.OpGet(b.epochKey), clientv3.OpGet(endKey, clientv3.WithCountOnly())}
	if req.Queue { // line.go
		cmps = append(cmps, b.lineCompare(req, pl))
		then = append(then, clientv3.OpDelete(b.LineKey(req.Name, req.Owner)))
		els = append(els, b.lineRefusalOps(req, pl, sp.id, endKey)...)
	}
	resp, txnErr := b.c.Txn(ctx).If(cmps...).Then(then...).Else(els...).Commit()
	ka := keepAliveResult{ok: true}
	if kaDone != nil {
		ka = <-kaDone
		ka.ok = ka.err == nil
		if ka.ok {
			sp.confirmed = ka.sent
		}
	}
	if txnErr != nil {
		if pl != nil {
			pl.refused = 0       // the outcome is unknown: the next attempt asks
			b.keepPlace(req, pl) // its key is there, whatever the outcome
		}
		// The outcome is unknown: if the put was applied, the key is
		// attached to this lease, which therefore cannot serve another
		// attempt. The next attempt of this owner finds the key its own
		// and extends it; otherwise the lease expires.
		return driver.Grant{}, false, fmt.Errorf("etcdlease: acquire %q: %w", req.Name, txnErr)
	}
	b.sawRevision(ep, resp.Header.Revision)

	if resp.Succeeded {
		rev := resp.Header.Revision
		if rev <= floor {
			// The cluster's revisions went back (a restore from a
			// backup): this token could repeat one granted before.
			// Undo the grant, start a new epoch and try again.
			b.revokeQuietly(sp.id)
			if err := b.newEpochAfterRewind(ctx, ep, floor); err != nil {
				return driver.Grant{}, false, err
			}
			return driver.Grant{}, true, nil
		}
		if !ka.ok {
			// The key is ours, but the lease was not confirmed from
			// this attempt's send time: it may expire before the local
			// deadline would say. Give it back.
			b.revokeQuietly(sp.id)
			return driver.Grant{}, false, fmt.Errorf("etcdlease: acquire %q: the lease granted earlier could not be kept alive: %w", req.Name, ka.err)
		}
		return b.granted(req, key, sp.id, secs, sp.ttl, sp.confirmed, ep.base+rev, rev), false, nil
	}

	kvs := resp.Responses[0].GetResponseRange().GetKvs()
	var ahead int
	if req.Queue && ka.ok {
		// The owner's place, if the refusal put or kept it on sp's
		// lease, owns that lease from now on: it is no spare.
		var kept bool
		if ahead, kept = b.placeAfterRefusal(req, sp, resp); kept {
			ka.ok = false
		}
	}
	if eps := resp.Responses[1].GetResponseRange().GetKvs(); len(eps) == 0 || string(eps[0].Value) != ep.value {
		// The epoch changed (the data was lost, or an operator deleted
		// the key): read it again and retry.
		b.dropEpoch(ep)
		if ka.ok {
			b.putSpare(sp)
		}
		return driver.Grant{}, true, nil
	}
	if resp.Responses[2].GetResponseRange().GetCount() > 0 {
		// The owner was released or abandoned: this is a request nobody
		// waits for any more (or a retry of one), and must grant nothing.
		if ka.ok {
			b.putSpare(sp)
		}
		return driver.Grant{}, false, fmt.Errorf("%w: %q: owner %q was released or abandoned (%q exists)", driver.ErrNotAcquired, req.Name, req.Owner, endKey)
	}
	if len(kvs) == 0 && req.Queue {
		// Free, but kept for the waiters ahead in line.
		if ka.ok {
			b.putSpare(sp)
		}
		b.passWake(req.Name)
		return driver.Grant{}, false, &driver.NotAcquiredError{Name: req.Name, Ahead: max(ahead, 1)}
	}
	if len(kvs) == 0 {
		return driver.Grant{}, false, fmt.Errorf("etcdlease: acquire %q: the transaction failed but the key is absent, the epoch unchanged and the owner not ended", req.Name)
	}
	kv := kvs[0]
	if string(kv.Value) != req.Owner {
		if ka.ok {
			b.putSpare(sp)
		}
		if req.Queue {
			b.passHandover(req.Name, string(kv.Value))
		}
		return driver.Grant{}, false, &driver.NotAcquiredError{Name: req.Name}
	}
	// Ours already: an earlier attempt's reply was lost. Extend that
	// grant and return its token.
	id := clientv3.LeaseID(kv.Lease)
	ttl, confirmed := sp.ttl, sp.confirmed
	if id != sp.id || !ka.ok {
		if id != sp.id && ka.ok {
			b.putSpare(sp)
		}
		confirmed = b.now()
		kr, err := b.c.KeepAliveOnce(ctx, id)
		if err != nil {
			return driver.Grant{}, false, fmt.Errorf("etcdlease: acquire %q: extending the grant this owner already holds: %w", req.Name, err)
		}
		ttl = time.Duration(kr.TTL) * time.Second
	}
	return b.granted(req, key, id, secs, ttl, confirmed, ep.base+kv.ModRevision, kv.ModRevision), false, nil
}

type keepAliveResult struct {
	sent time.Time
	resp *clientv3.LeaseKeepAliveResponse
	err  error
	ok   bool
}

// granted makes the Grant on the etcd lease id (asked for secs, granted
// ttl, last confirmed by a request sent at confirmed), and watches its key
// for a loss when the Manager asked to be told.
func (b *Backend) granted(req driver.Request, key string, id clientv3.LeaseID, secs int64, ttl time.Duration, confirmed time.Time, token, rev int64) driver.Grant {
	st := &grantState{id: id, key: key, owner: req.Owner, token: fence.Token(token), rev: rev, line: req.Queue, secs: secs, ttl: ttl}
	st.confirmed.Store(&confirmed)
	if req.Queue {
		b.forgetHandover(req)
	}
	if req.Notify != nil {
		st.held = b.watchHeld(st, req.Notify)
	}
	return driver.Grant{Name: req.Name, Owner: req.Owner, Token: st.token, TTL: ttl, State: st}
}

// Renew implements driver.Backend: a keep-alive of the grant's etcd lease and
// a read-only transaction that checks its key, sent together (one round
// trip).
func (b *Backend) Renew(ctx context.Context, g driver.Grant) error {
	var err error
	b.RenewBatch(ctx, []driver.Grant{g}, func(_ int, e error) { err = e })
	return err
}

// RenewBatch implements driver.BatchRenewer: the keys of up to MaxTxnOps
// grants are checked in one read-only transaction (larger batches in
// several, sent together), and the grants' keep-alives are sent at the same
// time, up to 64 at once (etcd has no keep-alive of several leases in one
// message). A grant is renewed (nil) only if its keep-alive succeeded and its
// key holds its owner, was created by it and is attached to its lease;
// otherwise its error matches driver.ErrNotHeld, or is the store's error.
// A grant whose State is not the one Acquire made for it (another owner's
// or token's) is ErrNotHeld, and nothing is sent for it. Each grant's
// outcome is reported (done) as soon as its keep-alive and its chunk's
// check have both answered.
func (b *Backend) RenewBatch(ctx context.Context, gs []driver.Grant, done func(i int, err error)) {
	report := done
	done = func(i int, err error) { report(i, b.setup(err)) }
	sts := make([]*grantState, len(gs))
	var live []int
	for i, g := range gs {
		st, ok := stateOf(g)
		if !ok {
			done(i, fmt.Errorf("%w: %q: the grant's state is not the one made for owner %q with token %d", driver.ErrNotHeld, g.Name, g.Owner, g.Token))
			continue
		}
		sts[i] = st
		live = append(live, i)
	}
	if len(live) == 0 {
		return
	}
	checks := make([]error, len(gs))
	checked := make([]chan struct{}, len(gs)) // closed once gs[i]'s check answered
	var wg sync.WaitGroup
	for start := 0; start < len(live); start += MaxTxnOps {
		chunk := live[start:min(start+MaxTxnOps, len(live))]
		c := make(chan struct{})
		for _, i := range chunk {
			checked[i] = c
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer close(c)
			b.checkKeys(ctx, gs, sts, chunk, checks)
		}()
	}
	inflight := make(chan struct{}, maxKeepAlives)
	for _, i := range live {
		wg.Add(1)
		inflight <- struct{}{}
		go func() {
			defer wg.Done()
			sent := b.now()
			_, err := b.c.KeepAliveOnce(ctx, sts[i].id)
			<-inflight
			if err == nil {
				sts[i].confirmed.Store(&sent)
			}
			var ka error
			switch {
			case errors.Is(err, rpctypes.ErrLeaseNotFound):
				ka = fmt.Errorf("%w: %q: its etcd lease %x expired or was revoked", driver.ErrNotHeld, gs[i].Name, int64(sts[i].id))
			case err != nil:
				ka = fmt.Errorf("etcdlease: renew %q: keep-alive: %w", gs[i].Name, err)
			}
			<-checked[i]
			switch {
			case errors.Is(ka, driver.ErrNotHeld):
				done(i, ka)
			case errors.Is(checks[i], driver.ErrNotHeld):
				if ka == nil && sts[i].leaseDone.CompareAndSwap(false, true) {
					// The lease is alive but holds nothing of ours: let
					// it go now rather than after its TTL.
					b.revokeQuietly(sts[i].id)
				}
				done(i, checks[i])
			case ka != nil:
				done(i, ka)
			default:
				done(i, checks[i])
			}
		}()
	}
	wg.Wait()
}

// checkKeys reads the keys of the grants gs[i] for i in idx in one
// transaction and records in out[i] whether each is still that grant's.
func (b *Backend) checkKeys(ctx context.Context, gs []driver.Grant, sts []*grantState, idx []int, out []error) {
	ops := make([]clientv3.Op, len(idx))
	for j, i := range idx {
		ops[j] = clientv3.OpGet(sts[i].key)
	}
	resp, err := b.c.Txn(ctx).Then(ops...).Commit()
	for j, i := range idx {
		if err != nil {
			out[i] = fmt.Errorf("etcdlease: renew %q: checking the key: %w", gs[i].Name, err)
			continue
		}
		kvs := resp.Responses[j].GetResponseRange().GetKvs()
		st := sts[i]
		switch {
		case len(kvs) == 0:
			out[i] = fmt.Errorf("%w: %q: the key is gone", driver.ErrNotHeld, gs[i].Name)
		case string(kvs[0].Value) != st.owner || kvs[0].ModRevision != st.rev || clientv3.LeaseID(kvs[0].Lease) != st.id:
			out[i] = fmt.Errorf("%w: %q: the key belongs to another grant", driver.ErrNotHeld, gs[i].Name)
		}
	}
}

// EndedKey returns the etcd key that records owner as ended (released or
// abandoned) for the lease name: Prefix+"e/"+name+"\x00"+owner (a name
// has no control characters, so the NUL separates it from the owner). It
// is attached to an etcd lease of at least driver.EndedOwnerTTL of the
// grant's TTL, and expires with it.
func (b *Backend) EndedKey(name, owner string) string {
	return b.o.Prefix + "e/" + name + "\x00" + owner
}

// How an owner ended, as its ended record (EndedKey) says.
const (
	endedReleased  = "released"  // by a Release that found its grant
	endedAbandoned = "abandoned" // by Abandon
	endedLost      = "lost"      // by a Release that found the grant gone
)

// Release implements driver.Backend in one round trip: one transaction
// that, if the key is still this grant's (its mod revision, owner and
// etcd lease), deletes it, and in any case puts the key that records the
// owner as ended (EndedKey), attached to an etcd lease that keeps it for
// driver.EndedOwnerTTL of the grant's TTL; when the key is not this grant's,
// the transaction also reads whether the owner had been ended before. The
// grant's own etcd lease, with nothing attached to it any more, is then
// kept for a later attempt of this Backend (afterRelease) or revoked in the
// background (if the revoke is lost, it expires after its TTL).
//
// The Release of a grant made in line (Request.Queue) first reads the
// line's first place (serializable, one more round trip; not when the
// Backend knows that one of its own waiters is first) and, in the same one
// transaction, hands the name to that waiter instead of deleting the key,
// if the place is still there and first (line.go).
//
// It returns nil when it deleted or handed over the key, or when the owner had already
// been ended by a Release that deleted it or by an Abandon: a release sent
// again after its first reply was lost (etcd's client resends a request
// whose connection broke; this backend resends a release whose outcome is
// unknown, below) finds its own record and is a release, not a loss. It
// returns an error matching driver.ErrNotHeld when the key had expired or
// was another grant's (and again for a release resent after one that found
// that: the record says "lost"), and when g's State is not the one Acquire made for it (without
// any request).
//
// A transaction whose outcome is unknown (the connection broke, the
// leader changed, etcd's request timeout) is sent again until it is
// answered or ctx ends; the error then says that the outcome is unknown.
// The first Release of a backend for a given EndedOwnerTTL also grants the
// etcd lease that the ended records of that TTL share (one more round trip,
// then about once per EndedOwnerTTL).
func (b *Backend) Release(ctx context.Context, g driver.Grant) error {
	st, ok := stateOf(g)
	if !ok {
		return driver.ErrNotHeld
	}
	if st.held != nil {
		st.held.releasing.Store(true)
		// Ended without waiting: its goroutine is the backend's (Close
		// waits for it), and the release need not wait for the client.
		defer st.held.cancel()
	}
	released := false
	defer func() { b.afterRelease(st, released) }()
	endKey := b.EndedKey(g.Name, g.Owner)
	var next *mvccpb.KeyValue // the first waiter in line, to hand the name to (line.go)
	if st.line {
		if next = b.localFirst(g.Name); next == nil {
			next = b.firstInLine(ctx, g.Name)
		}
	}
	var resp *clientv3.TxnResponse
	err := b.endOwner(ctx, g.TTL, func(tomb clientv3.LeaseID) (err error) {
		mine := []clientv3.Cmp{clientv3.Compare(clientv3.ModRevision(st.key), "=", st.rev),
			clientv3.Compare(clientv3.Value(st.key), "=", st.owner),
			clientv3.Compare(clientv3.LeaseValue(st.key), "=", st.id)}
		ended := clientv3.OpPut(endKey, endedReleased, clientv3.WithLease(tomb))
		// Not held: record the owner as ended by a loss, unless it was
		// ended before, and then read how.
		notHeld := clientv3.OpTxn(
			[]clientv3.Cmp{clientv3.Compare(clientv3.Version(endKey), "=", 0)},
			[]clientv3.Op{clientv3.OpPut(endKey, endedLost, clientv3.WithLease(tomb))},
			[]clientv3.Op{clientv3.OpGet(endKey)})
		if next == nil {
			resp, err = b.c.Txn(ctx).If(mine...).Then(clientv3.OpDelete(st.key), ended).Else(notHeld).Commit()
			return err
		}
		// Hand the name over if next is still first in line; otherwise
		// release as above (the inner transaction).
		cmps, then := b.handOver(st.key, g.Name, next)
		resp, err = b.c.Txn(ctx).If(slices.Concat(mine, cmps)...).Then(append(then, ended)...).
			Else(clientv3.OpTxn(mine, []clientv3.Op{clientv3.OpDelete(st.key), ended}, []clientv3.Op{notHeld})).
			Commit()
		if err == nil && resp.Succeeded {
			b.handedHere(g.Name, next, resp.Header.Revision)
		}
		if err == nil && !resp.Succeeded {
			inner := resp.Responses[0].GetResponseTxn()
			if inner == nil {
				return fmt.Errorf("etcdlease: release %q: the transaction's answer lacks its inner transaction", g.Name)
			}
			resp = (*clientv3.TxnResponse)(inner)
		}
		return err
	})
	if err != nil {
		return fmt.Errorf("etcdlease: release %q: %w", g.Name, b.setup(err))
	}
	if resp.Succeeded {
		released = true
		return nil
	}
	if before := resp.Responses[0].GetResponseTxn(); before != nil && !before.Succeeded {
		if kvs := before.Responses[0].GetResponseRange().GetKvs(); len(kvs) > 0 && string(kvs[0].Value) != endedLost {
			// Released before: by an earlier attempt of this release
			// whose reply was lost, or by an Abandon. (One that found
			// the grant lost answers ErrNotHeld again.)
			return nil
		}
	}
	return fmt.Errorf("%w: %q: its key had expired or was another grant's", driver.ErrNotHeld, g.Name)
}

// Abandon implements driver.Backend in one round trip (plus, as for
// Release, the shared etcd lease of the ended records once per
// EndedOwnerTTL): one transaction that, if the lease's key holds
// req.Owner (whatever its token), reads and deletes it, and in any case
// puts EndedKey(req.Name, req.Owner), which every acquire transaction
// compares: the abandoned request, if it reaches etcd later, grants
// nothing. The etcd lease of a deleted key is revoked in the background.
// It returns nil whether or not the owner held the name; an outcome that
// stays unknown is sent again until ctx ends, as Release does.
func (b *Backend) Abandon(ctx context.Context, req driver.Request) error {
	if req.Owner == "" {
		return errors.New("etcdlease: abandon: owner is empty")
	}
	if _, err := ttlSeconds(req.TTL); err != nil {
		return err
	}
	key, endKey := b.Key(req.Name), b.EndedKey(req.Name, req.Owner)
	var resp *clientv3.TxnResponse
	err := b.endOwner(ctx, req.TTL, func(tomb clientv3.LeaseID) (err error) {
		then := []clientv3.Op{clientv3.OpGet(key), clientv3.OpDelete(key), clientv3.OpPut(endKey, endedAbandoned, clientv3.WithLease(tomb))}
		els := []clientv3.Op{clientv3.OpPut(endKey, endedAbandoned, clientv3.WithLease(tomb))}
		if req.Queue { // the owner leaves the line (line.go)
			then = append(then, clientv3.OpDelete(b.LineKey(req.Name, req.Owner)))
			els = append(els, clientv3.OpDelete(b.LineKey(req.Name, req.Owner)))
		}
		resp, err = b.c.Txn(ctx).If(clientv3.Compare(clientv3.Value(key), "=", req.Owner)).Then(then...).Else(els...).Commit()
		return err
	})
	if req.Queue && err == nil {
		b.dropPlace(req)
	}
	if err != nil {
		return fmt.Errorf("etcdlease: abandon %q: %w", req.Name, b.setup(err))
	}
	if resp.Succeeded {
		if kvs := resp.Responses[0].GetResponseRange().GetKvs(); len(kvs) > 0 && kvs[0].Lease != 0 {
			b.revokeInBackground(clientv3.LeaseID(kvs[0].Lease))
		}
	}
	return nil
}

// endedLease is an etcd lease that ended-owner records share.
type endedLease struct {
	id    clientv3.LeaseID
	until time.Time // a record attached before then lives at least its EndedOwnerTTL
}

// endOwner runs txn, a transaction that records an owner as ended for
// EndedOwnerTTL(ttl), with an etcd lease that keeps the record that long.
// The backend grants such a lease for twice that time and attaches
// records to it for the first half, so that most calls need no grant. A
// transaction etcd refuses because that lease is gone (revoked by an
// operator, lost with the data) is sent again with a new lease; one whose
// outcome is unknown (a broken connection, a lost leader, etcd's request
// timeout) is sent again after a short pause until it is answered or ctx
// ends: every transaction endOwner runs is idempotent.
func (b *Backend) endOwner(ctx context.Context, ttl time.Duration, txn func(clientv3.LeaseID) error) error {
	secs := int64(math.Ceil(driver.EndedOwnerTTL(ttl).Seconds()))
	var unknown error
	for attempt := 0; ; attempt++ {
		id, err := b.endedLease(ctx, secs)
		if err == nil {
			err = txn(id)
			if errors.Is(err, rpctypes.ErrLeaseNotFound) && attempt < 3 {
				b.dropEndedLease(secs, id)
				continue
			}
		}
		if err == nil {
			return nil
		}
		if ctx.Err() != nil || !outcomeUnknown(err) {
			if unknown != nil {
				// An earlier attempt may have been applied.
				return fmt.Errorf("the outcome is unknown (an earlier attempt may have been applied: %w): %w", unknown, err)
			}
			return err
		}
		unknown = err
		select {
		case <-ctx.Done():
			return fmt.Errorf("the outcome is unknown (%w): %w", unknown, ctx.Err())
		case <-time.After(resendPause):
		}
	}
}

// resendPause is the pause before a request whose outcome is unknown is sent
// again.
const resendPause = 50 * time.Millisecond

// outcomeUnknown reports whether err leaves a request's outcome unknown:
// etcd's client and server say so with the gRPC code Unavailable (a broken
// connection, no leader, a leader change, the request timeout).
func outcomeUnknown(err error) bool {
	if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return false
	}
	if st, ok := status.FromError(err); ok && st.Code() == codes.Unavailable {
		return true
	}
	var ee rpctypes.EtcdError
	return errors.As(rpctypes.Error(err), &ee) && ee.Code() == codes.Unavailable
}

// endedLease returns an etcd lease that keeps a record attached now for at
// least secs seconds, granting one if needed.
func (b *Backend) endedLease(ctx context.Context, secs int64) (clientv3.LeaseID, error) {
	b.mu.Lock()
	el := b.ended[secs]
	b.mu.Unlock()
	if el != nil && b.now().Before(el.until) {
		return el.id, nil
	}
	sent := b.now()
	resp, err := b.c.Grant(ctx, 2*secs)
	if err != nil {
		return 0, fmt.Errorf("granting the etcd lease of ended-owner records: %w", err)
	}
	el = &endedLease{id: resp.ID, until: sent.Add(time.Duration(resp.TTL-secs) * time.Second)}
	b.mu.Lock()
	if b.ended == nil {
		b.ended = make(map[int64]*endedLease)
	}
	b.ended[secs] = el
	b.mu.Unlock()
	return el.id, nil
}

// dropEndedLease forgets the ended-record lease id, found gone at the store.
func (b *Backend) dropEndedLease(secs int64, id clientv3.LeaseID) {
	b.mu.Lock()
	if el := b.ended[secs]; el != nil && el.id == id {
		delete(b.ended, secs)
	}
	b.mu.Unlock()
}

// afterRelease decides, once, what becomes of the etcd lease of st after
// its Release: when that Release deleted or handed over the key (released)
// and the lease was confirmed less than half its TTL ago, nothing is
// attached to it any more and it is kept as a spare, so that a later
// attempt sends its transaction and a keep-alive of it, together, instead
// of a LeaseGrant first, and no revoke is sent; otherwise it is revoked in
// the background.
func (b *Backend) afterRelease(st *grantState, released bool) {
	if !st.leaseDone.CompareAndSwap(false, true) {
		return // a Release before, or a renewal, has decided
	}
	if confirmed := *st.confirmed.Load(); released && b.since(confirmed) < st.ttl/2 &&
		b.putSpare(&spare{id: st.id, secs: st.secs, ttl: st.ttl, confirmed: confirmed}) {
		return
	}
	b.revokeInBackground(st.id)
}

// revokeInBackground revokes a lease nothing of ours is attached to any
// more, in a goroutine Close waits for (bounded by a second, as
// revokeQuietly). After Close it does nothing: the lease expires.
func (b *Backend) revokeInBackground(id clientv3.LeaseID) {
	b.mu.Lock()
	if b.closed {
		b.mu.Unlock()
		return
	}
	b.wg.Add(1)
	b.mu.Unlock()
	go func() {
		defer b.wg.Done()
		b.revokeQuietly(id)
	}()
}

// revokeQuietly revokes a lease the backend granted and no longer needs,
// best effort, bounded by a second: one that stays expires after its TTL.
func (b *Backend) revokeQuietly(id clientv3.LeaseID) {
	ctx, cancel := context.WithTimeout(b.ctx, time.Second)
	defer cancel()
	_, _ = b.c.Revoke(ctx, id)
}

func (b *Backend) isClosed() bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.closed
}

// Close ends the backend's watches and waits for their goroutines. It does
// not close the client, and does not release grants: held leases expire
// after their TTL unless released first. Acquire and Watch fail with
// ErrClosed afterwards; Renew and Release keep working.
func (b *Backend) Close() error {
	b.mu.Lock()
	b.closed = true
	b.spares = map[int64][]*spare{}
	b.mu.Unlock()
	b.cancel()
	b.wg.Wait()
	return nil
}

// spare is an etcd lease granted by an attempt that was refused, or the
// lease of a grant that was released: no key is attached to it, so any
// later attempt asking the same TTL may use it.
type spare struct {
	id        clientv3.LeaseID
	secs      int64         // the TTL asked for
	ttl       time.Duration // the TTL granted
	confirmed time.Time     // send time of the last request that confirmed it
}

// maxSpares bounds the spare leases kept per TTL; more are left to expire
// at the store.
const maxSpares = 256

// takeSpare returns a spare lease granted with a TTL of secs, fresh enough
// to be kept alive (confirmed less than half its TTL ago), or nil.
func (b *Backend) takeSpare(secs int64) *spare {
	b.mu.Lock()
	defer b.mu.Unlock()
	pool := b.spares[secs]
	for len(pool) > 0 {
		sp := pool[len(pool)-1]
		pool = pool[:len(pool)-1]
		if b.since(sp.confirmed) < sp.ttl/2 {
			b.spares[secs] = pool
			return sp
		}
		// The newest is stale, so all are: they expire at the store.
		pool = pool[:0]
	}
	b.spares[secs] = pool
	return nil
}

// putSpare keeps sp, a lease no key is attached to, for a later attempt,
// and reports whether it did (not after Close, nor beyond maxSpares).
func (b *Backend) putSpare(sp *spare) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed || len(b.spares[sp.secs]) >= maxSpares {
		return false
	}
	b.spares[sp.secs] = append(b.spares[sp.secs], sp)
	return true
}

// epoch is the token base read from the epoch key.
type epoch struct {
	value string // the key's value, compared by every acquire transaction
	base  int64  // token = base + revision
}

// currentEpoch returns the cached epoch, reading (or creating) the epoch key
// if there is none: one round trip, once per epoch.
func (b *Backend) currentEpoch(ctx context.Context) (*epoch, error) {
	b.mu.Lock()
	ep := b.epoch
	b.mu.Unlock()
	if ep != nil {
		return ep, nil
	}
	b.mu.Lock()
	least := b.minEpoch
	b.mu.Unlock()
	value := strconv.FormatInt(max(time.Now().UnixMicro(), least), 10)
	resp, err := b.c.Txn(ctx).
		If(clientv3.Compare(clientv3.CreateRevision(b.epochKey), "=", 0)).
		Then(clientv3.OpPut(b.epochKey, value)).
		Else(clientv3.OpGet(b.epochKey)).
		Commit()
	if err != nil {
		return nil, fmt.Errorf("etcdlease: reading the epoch key %q: %w", b.epochKey, err)
	}
	createRev := resp.Header.Revision
	if !resp.Succeeded {
		kvs := resp.Responses[0].GetResponseRange().GetKvs()
		if len(kvs) == 0 {
			return nil, fmt.Errorf("etcdlease: the epoch key %q exists and does not (deleted meanwhile?); try again", b.epochKey)
		}
		value, createRev = string(kvs[0].Value), kvs[0].CreateRevision
	}
	return b.setEpoch(value, createRev)
}

// setEpoch parses and caches an epoch key's value.
func (b *Backend) setEpoch(value string, createRev int64) (*epoch, error) {
	us, err := strconv.ParseInt(value, 10, 64)
	if err != nil || us <= 0 || createRev <= 0 || us <= createRev || strconv.FormatInt(us, 10) != value {
		return nil, fmt.Errorf("%w: %q holds %.40q (create revision %d), not a time in microseconds", ErrCorruptEpoch, b.epochKey, value, createRev)
	}
	ep := &epoch{value: value, base: us - createRev}
	b.mu.Lock()
	b.epoch, b.seenRev = ep, 0
	b.mu.Unlock()
	return ep, nil
}

// dropEpoch forgets ep if it is still the cached one.
func (b *Backend) dropEpoch(ep *epoch) {
	b.mu.Lock()
	if b.epoch == ep {
		b.epoch, b.seenRev = nil, 0
	}
	b.mu.Unlock()
}

// revisionFloor returns the highest revision of a response of epoch ep that
// completed before now: a write sent from now on gets a greater one, unless
// the cluster's history was rolled back.
func (b *Backend) revisionFloor(ep *epoch) int64 {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.epoch != ep {
		return 0
	}
	return b.seenRev
}

// sawRevision records the revision of a completed response of epoch ep.
func (b *Backend) sawRevision(ep *epoch, rev int64) {
	b.mu.Lock()
	if b.epoch == ep && rev > b.seenRev {
		b.seenRev = rev
	}
	b.mu.Unlock()
}

// newEpochAfterRewind deletes the epoch key after the cluster's revisions
// went back to floor or below, so that the next Acquire makes a new one; its
// value is then at least ep's highest token seen + 1, so every later token
// is greater than every token of ep this backend has seen.
func (b *Backend) newEpochAfterRewind(ctx context.Context, ep *epoch, floor int64) error {
	b.mu.Lock()
	b.minEpoch = max(b.minEpoch, ep.base+floor+1)
	b.mu.Unlock()
	_, err := b.c.Txn(ctx).
		If(clientv3.Compare(clientv3.Value(b.epochKey), "=", ep.value)).
		Then(clientv3.OpDelete(b.epochKey)).
		Commit()
	b.dropEpoch(ep)
	if err != nil {
		return fmt.Errorf("etcdlease: the cluster's revisions went back to %d or below (restored from a backup?); starting a new epoch: %w", floor, err)
	}
	return nil
}

// Holder implements driver.Inspector: the key and the epoch key, read in one
// transaction, name the owner and the token; the grant's etcd lease, asked
// for its time to live, gives Remaining: in whole seconds, truncated by
// etcd, so a lower bound (0 means less than a second). Two round trips. It
// returns an error matching driver.ErrNotHeld when the key is absent (or
// its lease was gone by the second request).
func (b *Backend) Holder(ctx context.Context, name string) (driver.Holder, error) {
	resp, err := b.c.Txn(ctx).Then(clientv3.OpGet(b.Key(name)), clientv3.OpGet(b.epochKey)).Commit()
	if err != nil {
		return driver.Holder{}, fmt.Errorf("etcdlease: holder of %q: %w", name, b.setup(err))
	}
	kvs := resp.Responses[0].GetResponseRange().GetKvs()
	if len(kvs) == 0 {
		return driver.Holder{}, fmt.Errorf("%w: %q is free", driver.ErrNotHeld, name)
	}
	kv := kvs[0]
	eps := resp.Responses[1].GetResponseRange().GetKvs()
	if len(eps) == 0 || eps[0].CreateRevision > kv.ModRevision {
		return driver.Holder{}, fmt.Errorf("etcdlease: holder of %q: the key was created before the current epoch key (%q), so its token cannot be told", name, b.epochKey)
	}
	us, err := strconv.ParseInt(string(eps[0].Value), 10, 64)
	if err != nil || us <= eps[0].CreateRevision {
		return driver.Holder{}, fmt.Errorf("%w: %q holds %.40q", ErrCorruptEpoch, b.epochKey, eps[0].Value)
	}
	h := driver.Holder{Name: name, Owner: string(kv.Value), Token: fence.Token(us - eps[0].CreateRevision + kv.ModRevision)}
	ttl, err := b.c.TimeToLive(ctx, clientv3.LeaseID(kv.Lease))
	switch {
	case err != nil:
		return driver.Holder{}, fmt.Errorf("etcdlease: holder of %q: time to live of its lease: %w", name, err)
	case ttl.TTL < 0:
		// -1: the lease is gone (revoked or expired since the read above).
		return driver.Holder{}, fmt.Errorf("%w: %q: its lease ran out", driver.ErrNotHeld, name)
	}
	// etcd reports whole seconds, truncated: 0 is less than a second left
	// (or expired, with the key not yet deleted: etcd revokes expired
	// leases every 500 ms), and the key still keeps everyone else out.
	h.Remaining = time.Duration(ttl.TTL) * time.Second
	return h, nil
}
