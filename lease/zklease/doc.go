// Package zklease is the ZooKeeper backend of package lease, over
// github.com/go-zookeeper/zk. It is a module of its own, so that users of
// the core library do not inherit the ZooKeeper client.
//
//	b, err := zklease.New([]string{"zk1:2181", "zk2:2181", "zk3:2181"},
//		zklease.WithSessionTimeout(10*time.Second))
//	defer b.Close()
//	m, err := lease.NewManager(b, 10*time.Second) // TTL at most the session timeout
//	l, err := m.Acquire(ctx, "nightly-invoices")
//
// # How a lease is held
//
// Each lease name has a parent node, Options.Root + "/" + the name with
// every byte outside [A-Za-z0-9_-] written as %XX (so names may contain '/'
// and never collide). Under it, every contender has one ephemeral
// sequential node named "<random GUID>-<sequence>", holding the owner it
// was granted to (or, for a waiting backend's ticket, its Options.Identity
// + "/waiting"; for a queued waiter's place, see "Waiters in line"); the
// node with the lowest sequence number holds the lease
// (ZooKeeper's lock recipe). The fencing token is that node's czxid.
// Holder (driver.Inspector) reads both.
//
//   - Acquire: one Multi creates the node and writes nothing to the parent
//     (the parent's new mzxid is the node's czxid: the token comes in the
//     same round trip), one listing tells whether it is the lowest. A node
//     that is not the lowest is deleted, unless the backend has waiters.
//   - Waiting without a herd: a Backend that has waiters for a name keeps
//     one node of its own in the queue (a ticket) and watches only the node
//     just before it (ExistsW). A release is one delete; it sends one
//     notification, to the one backend behind it, whose next attempt lists
//     the queue once and turns its ticket into the grant. The in-process
//     waiters of one backend share the ticket. Manager.Acquire needs no
//     polling (its PollInterval is only a fallback).
//   - Renew: a sync, then one read (Exists) checks that the node still
//     exists with the grant's czxid in this backend's current session. The
//     sync makes the read see every write the ensemble committed before it:
//     a member behind the leader would otherwise confirm a node another
//     session (a Revoke) had deleted. RenewBatch sends one sync for the
//     whole batch.
//   - Release: one transaction (Multi) deletes the node and records the
//     owner as ended (an ephemeral node under Options.Root + "/.ended",
//     see EndedPath); the node's name is unique (the GUID), so no other
//     grant can be deleted by a late or repeated release. A transaction
//     whose answer was lost is sent again after the reconnect, in the same
//     session; finding the node gone and the record there, it is a
//     release (nil), not a loss. A grant whose session the ensemble has
//     ended (the backend is on another session, or none) is answered
//     driver.ErrNotHeld at once: its node went with the session.
//   - Revoke (driver.Revoker, an operator's fencekit lease revoke): one
//     transaction deletes the lowest node, if it names the owner and its
//     czxid is the token, and records the owner as ended; the next node is
//     then the lowest, and the holder finds its node gone at its next
//     renewal. List and Status (driver.Lister) list the root and each
//     name's queue: the lowest node is the holder, the others wait.
//   - Ended owners (driver.Backend's contract): the create of a grant's
//     node checks, in its own transaction, that the owner has no record,
//     so a released or abandoned owner is never granted again, through any
//     backend; a ticket's hand-off reads the record alongside its listing.
//     Abandon records the owner and deletes its nodes. A record lives for
//     driver.EndedOwnerTTL of the TTL, or until the session that made it
//     ends: a late create can only come from the session that sent it,
//     and ZooKeeper applies none after that session ended. Within one
//     Backend a late acquire is settled without the record anyway: the
//     abandoned operation holds the name's lock until the store answered,
//     then gives back what it got, before anything else of that name runs.
//
// # Waiters in line (FIFO)
//
// The backend keeps blocked acquires in line at the store
// (driver.Limits.Queues; lease.Options.FIFO). A queued Acquire
// (driver.Request.Queue) gives its owner a place: an ephemeral sequential
// node of the holder queue itself, under the name's parent like every
// grant's node, holding a NUL byte, the place's TTL in milliseconds, a
// newline and the owner (Holder and Abandon read the owner from it).
// Arrival order is the sequence number, and since the lowest node holds
// the name, a place becomes the grant without a write: when every node
// before it is gone, the listing that shows it lowest grants it, and its
// czxid, minted when the owner joined, is the token.
//
// Tokens still grow strictly in grant order: within a parent, sequence
// order is creation order is czxid order; grants follow sequence order
// (the lowest node holds, and a node that is not the lowest is never
// granted); a parent deleted and made again restarts its sequence numbers
// but not its czxids. The ended-owner record is read alongside the listing
// that grants a place (pipelined), as for a ticket.
//
// An acquire without Queue (TryAcquire, a Manager without FIFO) therefore
// queues behind the waiters: its node has a greater sequence number than
// theirs. It cannot "take a free name ahead of the line", but no name is
// free while a place exists: the holder's release hands the name to the
// first place at once (driver's "hands the name over at once" case). The
// tickets of Managers without FIFO and the places of FIFO ones share one
// queue, in arrival order. A Backend that has queued waiters for a name
// makes no ticket for it (a refused acquire without Queue deletes its
// node): a ticket is granted only to an acquire without Queue, and at the
// head it would keep the name from the places behind it.
//
//   - A queued attempt of an owner that has a place lists the holder
//     queue (one round trip, with the ended-record read pipelined): lowest,
//     it is granted, its TTL counted from the listing's send time. Otherwise
//     it refreshes its place (a SetData), then reads the nodes ahead and
//     watches the one just before its place (pipelined), and is refused: a
//     waiter that joins again costs a create, a listing and those reads,
//     three round trips, as the recipe's create, listing and watch. An owner without a place creates one at
//     the end (a create whose transaction checks the ended-owner record, so
//     an ended owner never joins) and lists: lowest (the name was free), it
//     is granted in those two round trips, as an acquire without Queue.
//     A refusal carries Ahead (the live places ahead) and RetryAfter (the
//     time left of the first one) when the lowest node is a place (the
//     name is kept for it). A hand-off writes nothing, so the store cannot
//     tell a place whose owner has taken the grant from one whose owner
//     has not yet listed: behind a granted place a refusal still says
//     Ahead >= 1 (driver's "no one holds it"), and RetryAfter counts from
//     that place's last refresh, not from its grant (0 once that is older
//     than the TTL: the waiter then asks at its poll interval).
//   - A place lapses when its last write is older than its TTL. ZooKeeper
//     keeps ephemeral nodes for their session, not for a time, so lapse is
//     decided by the server's stamps: the mtime of the waiter's own write
//     is "now", each place ahead is compared with its mtime. Both are the
//     leader's clock (the leader stamps each transaction), so this needs
//     no synchronized clients; after a leader change the stamps of two
//     leaders are compared, and a place may lapse early or late by their
//     skew (a Manager refreshes at least every TTL/2, so a skew below TTL/2
//     never drops a live waiter). A lapsed place is deleted by the waiter
//     that found it, in a transaction that checks that a node before it
//     still exists and that its version is the one read: a place that is
//     not the lowest is no grant, and a refresh in between keeps it. The
//     lowest node is never deleted by another backend, since its owner may
//     hold it without knowing yet: a place at the head leaves when its own
//     backend deletes it (the owner stopped asking for its TTL: the
//     backend's timer; Abandon), or with its session. A waiter whose
//     process died therefore leaves the line within its TTL while a node is
//     ahead of it, and within the session timeout once it is at the head
//     (as a holder that died does). A waiter whose own place lapsed goes to
//     the end.
//   - Abandon deletes the owner's place (one kept by this Backend, and any
//     node naming the owner; the Manager sends an owner's requests through
//     one Backend).
//   - A refused waiter watches the node just ahead of its place: a release
//     (or the end of a session) wakes the one waiter behind that node, and
//     a waiter that leaves wakes the one behind it. A refresh of the place
//     ahead sets the watch again without waking anyone. Queued waiters
//     need no ticket (Watch only subscribes).
//
// The first waiter, woken by the deletion of the node ahead, is granted in
// one round trip of reads (the listing and the ended record): no write
// stands between a release and the next grant.

// A request whose answer is lost does not leave a node behind: a create is
// settled by listing the parent for its GUID (the recipe's "protected"
// names; when no listing is answered within the TTL, a client whose every
// answer is late, the backend ends its session at the store, which deletes
// the node: see blindclose.go; a create answered after its caller left is
// deleted at once), a delete is sent again until the server answers, and a call
// whose context ends keeps running in the background until the store has
// answered, then gives back what it made. go-zookeeper's calls take no
// context; the backend's do, and always return when it ends.
//
// # TTLs and sessions
//
// ZooKeeper keeps nodes per session, not per lease: an ephemeral node lives
// until it is deleted or its session expires, which the ensemble does when
// it has heard nothing from the client for the session timeout. The
// Manager's TTL is mapped, not refused: it may be anything from MinTTL to
// Options.SessionTimeout, and
//
//   - the backend ends a grant that was not renewed within its TTL of the
//     send time of its last acquire or renew request (it deletes the node),
//     so that a holder whose work stopped but whose process and session live
//     on does not keep the lease: the TTL behaves as on other stores;
//   - a holder that crashed or lost the ensemble keeps its node until its
//     session expires: a takeover then waits for the session timeout (plus
//     up to one tickTime, the servers' expiry granularity), not the TTL.
//     Choose a TTL equal to the session timeout unless the holders' work can
//     hang.
//
// The Manager renews every lease: a live session does not mean live
// work. Each renewal is a request of the session, so it also keeps the
// session alive. A lease's local deadline is
// the send time of the last acquire or renew request the ensemble answered,
// plus the TTL, minus the Manager's safety margin. The ensemble keeps the
// session at least the session timeout after it handled that request, so
// the deadline comes before any other holder can be granted the lease, as
// long as the session timeout the server granted is at least the TTL: the
// backend reads the granted timeout and the session ID from every connect
// response on the wire (go-zookeeper does not expose them), and refuses to
// grant or renew otherwise (ErrSessionTimeout).
//
// One failure escapes that bound: a follower forwards the session touches it
// receives to the leader every tickTime/2; if it answers a renewal and then
// loses the leader before forwarding it, the session may expire up to one
// renew interval plus tickTime/2 earlier than counted. A session timeout at
// least that much longer than the TTL covers it; the fencing token covers
// it in any case.
//
// A session that expires (the ensemble ended it) or is replaced
// (go-zookeeper opens a new session after an expiry and carries on, later
// calls succeeding) ends every lease of the old session at once: each is
// reported lost (lease.LostExpired) with ErrSessionExpired or
// ErrSessionReplaced as the cause, read from the
// server's connect response before go-zookeeper sends anything on the new
// session. A mere disconnection ends nothing: the client reconnects within
// the session, possibly to another member, and the leases stay valid until
// their deadlines. Close ends the session, and with it every lease
// (ErrClosed).
//
// # What is guaranteed
//
//   - Exclusive: a grant is made only when a listing taken after the
//     node's create shows it as the lowest node. ZooKeeper orders all
//     writes through its leader (Zab) and serves each session in order, so
//     that listing reflects every node created before it; no two nodes can
//     both be the lowest. This holds across leader changes and through any
//     member (TestLeaderKilledWhileHeld, TestExclusiveAcrossMembers).
//   - Tokens only grow: a czxid is epoch<<32 | counter, global to the
//     ensemble and growing with every transaction; a new leader starts a
//     greater epoch; it is kept on disk across restarts of every member.
//     The holder is always the lowest node, so grants follow creation order
//     and their czxids grow, also when a parent is deleted and created
//     again (its sequence numbers restart, czxids do not)
//     (TestTokensGrowAcrossEnsembleRestart, the conformance suite).
//   - Loss is noticed before expiry, as described above, and pushed at once
//     when the session ends (TestIsolatedHolderLosesBeforeExpiryAndIsFenced).
//
// The previous holder's node is gone only when it released, its session
// expired (after its local deadline, as above), or the backend ended the
// grant at its TTL (after its deadline too). A node deleted by someone else
// (an operator, another client) ends the lease at the holder's next
// renewal, which finds the node gone; until then two holders may overlap,
// and their tokens order them at the guards.
//
// What is not guaranteed: if the ensemble's data is wiped (members reinstalled with
// empty data directories) or restored from an older snapshot, zxids start
// again from a lower epoch and counter, and so do tokens. Nothing survives
// in the store to prevent it. The guards then reject every write of the new
// holders as stale (they fail closed: no stale write lands, but no new
// holder can write) until tokens pass the old ones, which for an emptied
// ensemble means never; clients that were connected across the wipe are
// refused by the servers (they have seen a later zxid) and keep
// reconnecting. Do not wipe an ensemble that issued tokens to fenced
// stores; deleting the backend's nodes (an operator's deleteall) keeps
// tokens growing (with the overlap described above for a held node).
//
// Sequence numbers are a signed 32-bit counter per parent: after 2^31
// creates under one name's parent, Acquire fails with an error saying so
// until the parent is deleted while no one holds or waits (it is a
// container node, which the server deletes when it has stayed empty).
//
// The backend needs ZooKeeper 3.5 or later (container nodes, Multi); it is
// tested against Debian's 3.8.0, on three-node ensembles started by the
// tests (package internal/testkit/zktest).
package zklease
