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
//     was sent, plus the TTL, minus Options.SafetyMargin. At that moment the
//     lease's Context is cancelled, whether or not the store can be reached.
//     A renew that finds another owner cancels it at once.
//   - Safe release: Release deletes only if the store still names this
//     holder, reports a lost lease as lost, is harmless when repeated, and
//     works when the caller's context is already cancelled.
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
//	m, err := lease.NewManager(backend, lease.Options{TTL: 10 * time.Second})
//	l, err := m.Acquire(ctx, "invoices")
//	defer l.Release(context.Background())
//	err = doWork(l.Context(), l.Token())
//
// The in-memory backend (NewMemoryBackend) serves unit tests and examples;
// package redislease is the Redis backend.
package lease
