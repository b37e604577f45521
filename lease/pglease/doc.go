// Package pglease is the PostgreSQL backend of package lease, over a pgx v5
// pool, in one of two modes chosen with Options.Mode.
//
//	pool, err := pgxpool.New(ctx, url)
//	b, err := pglease.New(pool)                                  // table mode
//	b, err := pglease.New(pool, pglease.WithMode(pglease.ModeSession)) // advisory locks
//	defer b.Close()
//	m, err := lease.NewManager(b, 10*time.Second)
//
// Both modes need fencekit's migrations (migrations.Up, or fencekit migrate
// up), which create LeaseTable and SessionLeaseTable, EndedTable and
// SessionEndedTable for the owners each mode ended, and WaiterTable and
// SessionWaiterTable for waiters in line; Options.Schema names the schema
// they are in.
//
// # Table mode (the default)
//
// Each lease name has a row {owner, token, expires_at} in LeaseTable, and
// each operation is one statement on any connection of the pool (one round
// trip once pgx has prepared it on that connection), so it works through
// connection poolers in any mode:
//
//   - Acquire: INSERT ... ON CONFLICT DO UPDATE, which takes the row if it is
//     free or expired, or extends it if the same owner holds it (a retried
//     request: same token); when another owner holds it, the same statement
//     returns the holder's remaining time, from the stored expiry, as
//     NotAcquiredError.RetryAfter (read by a function that runs only on a
//     refusal). While the statement's snapshot shows another owner's live
//     grant, it refuses without trying the row, so that the waiters of a
//     busy name do not queue for the row's lock (ON CONFLICT locks the row
//     even when it grants nothing), nor the holder's statements behind
//     them.
//   - Renew: an UPDATE of the expiry only if the row still holds the grant's
//     owner and token and has not expired. RenewBatch renews any number of
//     grants in one UPDATE over unnested arrays (one round trip).
//   - Release: if the row holds the grant's owner and token and has not
//     expired, it is marked free (it stays: it carries the name's token)
//     and the release is announced with NOTIFY on Channel, in the same
//     statement; the row is written whatever it holds, so the statement
//     holds its lock. Whatever the outcome, the owner is recorded as
//     ended: a row {name, owner, ended_at, until, ends} of EndedTable,
//     until the server's clock + driver.EndedOwnerTTL. A Release of an
//     owner already ended, or of a grant whose row is already free with
//     its token, returns nil: pgx never sends a statement twice, but a
//     caller may retry a Release whose reply was lost, and that retry is
//     a release, not a loss. The Release commits without waiting for the
//     WAL flush (synchronous_commit off for its transaction): a grant that
//     follows it commits with the flush, which makes the release durable
//     first, and a release lost in a crash (or in a failover to a standby
//     that had not received it) leaves the grant to expire at the store,
//     as a crashed holder's would. Waiting for the flush would cost every
//     release a disk write, held under the server's one lock for
//     notifying commits (NOTIFY), so that releases of all names would
//     commit one at a time.
//   - Abandon: one INSERT ... ON CONFLICT DO UPDATE that frees the row if
//     the owner holds it (any token), records the owner as ended (creating
//     a free row for a name that has none, so that a late request finds a
//     row to lock) and announces a release.
//   - Acquire refuses an owner recorded as ended: an acquire request that
//     reaches the server after its sender stopped waiting for it (the Manager
//     abandoned the attempt; even after another grant was used and released)
//     grants nothing. Acquire asks the migrations' function
//     fencekit_lease_owner_ended from the lease row's ON CONFLICT condition,
//     which is evaluated once the row is locked: the function reads
//     EndedTable from a snapshot of its own, so it sees a release that
//     committed while the acquire waited for the row (a subquery of the
//     statement would read its older snapshot). Every statement that records
//     ended owners holds the name's lease row first, so those of one name run
//     one at a time. An Abandon, and one Release in 16 at random, deletes the
//     name's rows whose until has passed, so a name keeps about as many rows
//     as owners it ended within EndedOwnerTTL (10 s at least), and each
//     statement reads or writes one of them by its key: what an acquire or a
//     release costs does not grow with churn.
//
// Expiry is computed by the server's clock: clock_timestamp(), read once per
// statement after the statement has its table locks (not now(), which is
// the transaction's start and would predate a wait for a lock). The store
// keeps a grant until that reading plus the TTL, which is never earlier
// than the request's send time plus the TTL; the Manager's local deadline
// counts from the send time minus a safety margin, so the holder gives up
// first as long as the server's clock and the holder's run at the same rate.
// Statements run under READ COMMITTED (the server's default): under
// REPEATABLE READ or SERIALIZABLE, contending acquires fail with
// serialization errors (SQLSTATE 40001) instead of waiting.
//
// # Session mode (advisory locks)
//
// A lease is a session-level advisory lock (pg_try_advisory_lock on a 64-bit
// key hashed from Options.Schema and the name), taken on a connection that
// is acquired from the pool and kept out of it for the life of the lease
// (Grant.State holds it), together with an expiry in the name's row of
// SessionLeaseTable. Each held lease occupies one connection of the pool;
// give the backend a pool of its own if your other work must not wait for
// connections.
//
// The lock alone would not be exclusive. The server frees it the moment it
// ends the session (pg_terminate_backend, idle_session_timeout, a restart,
// a failover, a keepalive that gave up), while the holder, if it hears
// nothing (a partition), counts its lease valid until its local deadline:
// measured with the lock alone, TTL 3 s, the next holder was granted 123-133
// ms after the session ended, and the first read valid 2.8 s longer. So
// every grant and every renewal also sets the row's expiry to the server's
// clock + TTL (which is never before the request's send time + TTL, as in
// table mode), and a new holder is granted the name only once that expiry
// has passed or the holder released it. Measured with the expiry, TTL 2 s:
// the next holder was granted 1.99-2.02 s after the session ended, 0.15-0.18
// s after the first holder's local deadline (TestServerEndedSessionIsWaitedOut).
// Session mode thus gives the exclusivity of table mode; what it adds is
// that a holder that can hear the server learns at once that its session
// ended (below). The price: a renewal writes the row (a commit), as in table
// mode, and after a server-ended session that the holder could not report
// the next holder waits out the TTL, as after a crashed holder.
//
//   - Acquire: one statement takes the lock without waiting and, only if it
//     got it, writes the token row if that row's expiry has passed (or the
//     row was released) and the owner was not ended (as table mode's
//     Acquire), minting the token as table mode does, setting the expiry,
//     and setting the session's idle_session_timeout to the TTL; otherwise
//     it unlocks what it took, and the refusal carries the row's time left
//     as NotAcquiredError.RetryAfter. The timeout ends the session of a
//     holder that stops renewing (a crash that left the socket open, a
//     paused process) after one TTL, which frees the lock.
//   - Renew: one statement on the pinned connection extends the row's
//     expiry if the same server process still holds the lock (pg_locks) and
//     the token row still names the grant's owner and token; it also
//     restarts the idle timeout. A broken connection, or a lock or row that
//     is gone, ends the grant (driver.ErrNotHeld). Only the deadline of a
//     renew's context bounds it, not its cancellation: pgx closes a
//     connection whose reply it stopped waiting for, which would end the
//     session.
//   - Release: one statement marks the row free and records the owner as
//     ended (as table mode's Release, in SessionEndedTable), unlocks,
//     restores the session's idle_session_timeout and announces the
//     release with NOTIFY, committing as table mode's Release does; the
//     connection then goes back to the pool. If anything is in doubt (an
//     error, a lock that was not held), the connection is closed instead:
//     the server frees whatever it held; after an error (a lost reply) the
//     row is marked free through another connection of the pool, which
//     makes it a release, and a Release called again finishes that if it
//     could not be done at once.
//   - Abandon: as table mode's, on the token row, through any connection of
//     the pool; a session still holding the owner's lock is ended (a pin of
//     this Backend is closed; another process's session of the same user is
//     ended with pg_terminate_backend).
//   - Losses are pushed: while the pinned connection is idle, a goroutine
//     waits for its socket to become readable (without reading from it). An
//     idle connection that receives anything, or reaches EOF, has most often
//     had its session terminated (pg_terminate_backend, a server restart);
//     the goroutine checks the lock at once and, if it is gone, reports the
//     loss through Request.Notify, ending the lease immediately rather than
//     at its deadline; then, the holder having been told, it marks the row
//     free so that the next holder need not wait out its expiry. (Sockets are watched on Linux, macOS and FreeBSD, for
//     TCP and Unix connections, with or without TLS; elsewhere, or through a
//     custom dialer, the loss is found by the next renew.)
//
// Session mode needs PostgreSQL 14 or later (idle_session_timeout) and a
// direct connection to the server. Behind a pooler in transaction mode, the
// lock would stay on a server connection that other clients then use, and
// the unlock would land elsewhere. So Acquire's statement compares the
// server process that runs it (pg_backend_pid()) with the one the
// connection announced when it was opened (BackendKeyData,
// pgconn.PgConn.PID), and takes the lock only if they are the same:
// poolers answer the latter themselves (PgBouncer makes up a process ID
// and cancel key for each client), so the two differ, nothing is taken,
// and Acquire returns ErrPooler. Options.AllowPooler accepts a pooler in
// session mode (PgBouncer pool_mode=session); every renew still checks that
// the server process is the one that took the lock. In table mode, a pooler
// is fine for leases, but LISTEN cannot work through one in transaction
// mode: waiters then wake by polling only.
//
// Every process that uses a lease name must use the same mode and schema: a
// table-mode holder and a session-mode holder of one name do not exclude
// each other.
//
// # Fencing tokens and what survives data loss
//
// In both modes a token is greatest(the name's stored token + 1, the
// server's clock in microseconds since the Unix epoch), computed in the
// statement that grants the lease, the stored token read after the
// statement has locked the name's row (so it is the newest committed one):
// it strictly grows while the row exists, and keeps growing when the row is
// lost (TRUNCATE, DELETE, a restore from an older backup, a failover to a
// replica that had not received the last grants): the first grant
// afterwards gets the server's current time in microseconds, greater than
// every earlier token as long as the clock of the server that grants it
// reads later than the clocks of the servers that granted the earlier ones
// did at the time. That is the assumption: a server's clock is never stepped
// back past tokens already granted, and the clocks of servers that can
// replace each other (a failover) differ by less than the time a failover
// takes. Because the floor applies to every grant, not only after a loss,
// tokens stay ahead of the clock, and a restored backup cannot bring back a
// smaller one. The clock is read once per statement with clock_timestamp(),
// after the statement has waited for its locks, so a grant that waited for
// a TRUNCATE to finish still reads a time after it. Tokens fit in 63 bits
// until the year 294247.
//
// A token taken from a sequence with nextval() in the INSERT's VALUES and
// copied by DO UPDATE would go backwards under contention (the value is
// drawn before the wait for the row lock); reading the stored token after
// the lock does not.
//
// # Waiters in line (FIFO)
//
// Both modes keep blocked acquires in line at the store (driver.Limits.Queues,
// lease.Options.FIFO): each mode has a table of waiters (WaiterTable,
// SessionWaiterTable) with one row per owner waiting for a name, ordered by
// seq (drawn from the table's identity column when the owner joins), with
// an expiry computed by the server's clock: clock_timestamp() + the
// waiter's TTL at its last ask. An Acquire with driver.Request.Queue set is
// one statement (one round trip), which reads the line from its snapshot:
//
//   - It tries the grant only when no live waiter is ahead of the owner
//     (all live waiters are ahead of an owner without a live place), or,
//     in table mode, the owner holds the name (a retried request). Table
//     mode then proceeds as Acquire; session mode tries the advisory lock
//     and proceeds as its Acquire, so the line decides who may try the lock.
//     A grant deletes the owner's place.
//   - Otherwise, and when the grant was refused, it puts the owner at the
//     end of the line or keeps its place (asking again does not move it),
//     the place living the TTL from then, and commits without waiting for
//     the WAL flush (synchronous_commit off for that transaction: a place
//     lost in a crash costs its waiter its place, never a token). The
//     refusal carries, while someone holds the name, the holder's time
//     left (NotAcquiredError.RetryAfter); while the name is free but kept
//     for waiters ahead, how many (NotAcquiredError.Ahead) and the time
//     left of the first one's place.
//   - An owner ended by Release or Abandon within driver.EndedOwnerTTL is
//     refused and never put in line. Abandon ends the owner's place in its
//     one statement and announces a release, so that the next waiter tries
//     at once. For a queued request it does not just delete the place: it
//     marks it ended (column ended_until, for driver.EndedOwnerTTL), so
//     that the waiter's own acquire, if it reached the server before the
//     Abandon but commits after it (it waited for the lease row's lock
//     with an older snapshot), finds the mark and puts no place back.
//   - A waiter that stops asking (its process died) keeps its place until
//     its expiry, then the next waiter's acquire passes it; lapsed places
//     (and ended marks past their time) are deleted by the next queued
//     acquire of the name (a name nobody asks for again keeps them: a few
//     bytes each). A holder that crashed
//     is waited out as without a line (table mode: its row's expiry;
//     session mode: the row's expiry, the server ending its idle session
//     after one TTL), then the first waiter is granted.
//
// The line is read from the statement's snapshot, so two waiters joining
// within a few milliseconds of each other may be ordered by the sequence
// rather than by their commits; no one is granted ahead of a live place
// committed before its acquire's statement began. Acquire without Queue
// (TryAcquire, a Manager without FIFO) sends the statement it always did,
// ignores the line and takes a free name ahead of the waiters, who keep
// their places. Use one mode per name.
//
// # Operating leases
//
// List and Status (driver.Lister) read the live grants and live waiters of
// the names under a prefix, or of one name, in one statement (session
// mode: a statement for the names, then Holder's statement and a count of
// waiters per name). Revoke (driver.Revoker) is one statement on any
// connection of the pool: it frees the row if it still holds the named
// owner and token, records the owner as ended and announces a release; in
// session mode it also ends the session holding the advisory lock
// (pg_terminate_backend, same user only), which the holder's socket
// watcher reports at once. Both modes keep one record per ended owner, not
// how it ended, so a revoked holder's Release before its next renewal
// returns nil.
//
// # Waking waiters
//
// Releases are announced with NOTIFY on Channel (payload: the lease name),
// delivered when the releasing statement commits. Each Backend keeps one
// listening connection (Watch), taken from the pool on first use, and
// reconnects with backoff when it breaks; meanwhile, and always as a
// fallback, blocked Acquire calls poll (lease.Options.PollInterval, or the
// holder's RetryAfter in table mode). Backends of different schemas in one
// database share the channel: a release of the same name in another schema
// wakes a waiter for nothing, and it tries again (so does an Abandon that
// ended nothing). A release wakes every waiter of the name in each
// process; with a line, the first one is granted and the others are
// refused at once, keeping their places. A lease that expires, a session
// that ends, or a waiter's place that lapses sends no notification:
// waiters find out by polling (with FIFO, at most every TTL/2).
package pglease
