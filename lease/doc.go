// Package lease hands out leases that carry fencing tokens.
//
// A lease is a named, time-limited grant to one holder. Each grant carries a
// fence.Token that is strictly greater than every token granted before for
// the same name, minted atomically with the grant by the Backend. While the
// holder works, the lease renews itself in the background (a heartbeat); when
// the holder is done it releases the lease, and a holder blocked in Acquire
// is woken at once where the backend can notify it.
//
// # What a lease guarantees, and what it does not
//
// A lease gives liveness: some holder makes progress, and a holder that
// crashed is replaced within about one TTL. A lease alone never gives
// safety. A holder that is paused (a stop-the-world GC, a suspended VM, CPU
// throttling, a reply held up in the network) can wake up believing it still
// holds a lease that expired and was granted to someone else. Safety comes
// only from the storage: every write presents the lease's token and the store
// rejects a token older than the newest it has accepted (Kleppmann, "How to
// do distributed locking", 2016). Packages sqlguard and blobguard do that for
// PostgreSQL and S3; pass them Lease.Token.
//
// What this package does guarantee:
//
//   - Exclusive: while a lease is valid at the store, no other holder is
//     granted it (the backend's compare-and-set).
//   - Tokens only grow per name, and are never 0 (the backend's minting; see
//     each backend for what survives data loss).
//   - Loss is noticed before expiry: a Lease's local deadline is the
//     monotonic time at which the last successful acquire or renew request
//     was sent (or an earlier request the store answered for the grant's
//     store-side lease, when the backend proves the grant with a read:
//     driver.Grant.Sent), plus the TTL, minus Options.SafetyMargin. From that moment
//     Lease.Err and the Context's Err report the lease lost (they read the
//     clock), and the Manager's timer cancels the Context, whether or not
//     the store can be reached (a timer runs when the Go runtime gets to
//     it: on a loaded machine, milliseconds to tens of milliseconds late;
//     check Err before a write that must not be late). A renew that finds
//     another owner cancels it at once.
//   - Safe release: Release ends the lease for its holder (Err, the
//     Context) before it sends the request that frees the name, so a waiter
//     it wakes never overlaps the holder's validity; it deletes only if the
//     store still names this holder, reports a lost lease as lost, is
//     harmless when repeated (a request the client resent after a lost
//     reply is still a release, not a loss), and works when the caller's
//     context is already cancelled.
//   - No ghost grants: an acquire request the Manager stopped waiting for
//     is abandoned at the store (Backend.Abandon), and the store remembers
//     ended owners for EndedOwnerTTL, so such a request arriving late
//     grants nothing.
//
// The local deadline assumes that the store's clock and the holder's
// monotonic clock advance at the same rate, up to the safety margin; the
// default margin follows the Redlock drift allowance (1% of the TTL plus
// 2 milliseconds, from the Redis distributed-lock documentation). It
// cannot protect a holder that is paused between checking its lease and
// writing: that is what fencing tokens are for.
//
// # Use
//
// Create one Manager per process (or per set of options) over a Backend,
// acquire a lease, do the work under its Context, write with its Token, and
// release it:
//
//	m, err := lease.NewManager(backend, 10*time.Second)
//	l, err := m.Acquire(ctx, "invoices")
//	defer l.Release(context.Background())
//	err = doWork(l.Context(), l.Token())
//
// For "at most N holders at once", NewSemaphore makes a semaphore of N
// permits, each a lease of its own slot with its own tokens (see
// Semaphore: fence per slot).
//
// # Waiting in line (FIFO)
//
// By default a blocked Acquire retries when the holder releases (or when
// its grant runs out), and any waiter may win: nothing bounds how long one
// waiter starves. With Options.FIFO (WithFIFO), each blocked Acquire takes
// a place in a line at the store, in arrival order, and the lease goes to
// the oldest live waiter. A waiter keeps its place by asking again at
// least every PollInterval (at most TTL/2), gives it up when its context
// ends, and loses it within one TTL when its process dies, so that a dead
// waiter never blocks the line for longer. An attempt that the store did
// not answer within the lease's validity is abandoned, and the waiter
// starts again at the end of the line. Tokens are minted as for any
// grant. TryAcquire does not wait, so it does not queue: it takes a free
// lease ahead of the line, as a Manager without FIFO does; use one mode
// per lease name. Backends that keep a line (driver.Limits.Queues):
// memlease, redislease, pglease in both modes, etcdlease and zklease.
// dynamolease does not, and NewManager refuses FIFO over it (its package
// doc says why).
//
// The in-memory backend, package memlease (memlease.New), serves unit
// tests and examples.
// The stores' backends are modules of their own, so that a program using one
// store never inherits another store's client: lease/redislease (Redis),
// lease/pglease (PostgreSQL), lease/etcdlease (etcd) and lease/zklease
// (ZooKeeper), each under github.com/fencekit/fencekit/. This package and
// the core module need only the standard library.
//
// # Time, at scale
//
// A Manager serves the deadlines and heartbeats of all its leases from one
// timer. Heartbeats that fall due within Options.RenewBatchWindow of each
// other are sent together (one pipeline, where the backend implements
// BatchRenewer), so thousands of leases renewed together also share a
// deadline. When such a group's deadline comes, ending each lease (a lock,
// a context cancellation) takes time, so the Manager starts on a large group
// early, by about what it will take, at most half the safety margin: a lease
// may be reported lost that much before its Deadline, never after it because
// of the Manager's own work. Lease.Err reads the clock itself and never
// reports a lease valid at or past its deadline.
//
// # Writing a backend
//
// The contract a backend implements, and how to write one, is package
// driver (lease/driver); a backend imports it, never this package.
package lease
