// Package sqlguard enforces fencing tokens in PostgreSQL, through pgx v5,
// so that a lock holder that has lost its lease (and does not know it yet)
// cannot change your data.
//
// # Safety model
//
// A lease gives liveness, never safety: a holder paused by a GC, a
// suspended VM or a slow network can wake up after its lease expired and
// another holder got it, and go on writing. Every grant of a lease carries
// a fencing token that grows with every grant (package fence); sqlguard
// makes PostgreSQL itself reject a write whose token is older than the
// newest token already accepted for the same row or resource. The check
// and the write are one atomic step in the database, so no pause of the
// client between them can break it. A write with the same token as the
// newest one (the same holder writing again) is accepted. sqlguard does not
// import any lease package: tokens can come from fencekit leases, an etcd
// revision, or any other source that only grows.
//
// There are two ways to fence, and they combine:
//
//   - Row-level: a Table writes single rows of your table, which carries a
//     lock_version BIGINT NOT NULL column (package migrations adds it).
//     Update, Insert, Upsert and Delete each write only if the row's
//     lock_version is <= the token, and set lock_version to the token, in
//     one statement (one round trip when the write succeeds).
//   - Resource-level: a Guard fences any SQL that runs in a transaction.
//     Guard.BeginFunc (like pgx.BeginFunc) advances the resource's token
//     in the toolkit's table fencekit_resource_tokens, holds that row's lock
//     until the transaction ends, runs your function and commits; a stale
//     token is rejected before your function runs. Guard.Advance does the
//     same check inside a transaction you manage.
//
// # Every write must go through the guard
//
// The database enforces the token only on writes that present it. A plain
// UPDATE of a fenced table that bypasses Table (or a transaction that
// bypasses Guard) is not fenced: a stale holder that issues one overwrites
// newer data, and if it does not set lock_version the row's version no
// longer tells which token wrote it. That is a bug in the code that issues
// it, not something sqlguard can detect. Write fenced tables only through
// Table, or only inside Guard.BeginFunc (or after Guard.Advance in the same
// transaction) for the resource that covers them, and never write
// lock_version yourself. Reads need no fencing. A row-level Delete removes
// the row's lock_version with it; see Table.Delete.
//
// # Outcomes and errors
//
// The errors are package fence's, the same for every guard. Each call
// returns nil (written), a *fence.StaleError (matching
// fence.ErrStaleToken) carrying the presented token and the newest
// accepted one, or an error: a *fence.NotFoundError (fence.ErrNotFound),
// fence.ErrExists, fence.ErrAmbiguousKey, a *fence.RetryableError (see
// IsRetryable), an error matching fence.ErrOutcomeUnknown (below), a
// *fence.SetupError naming the fix for a database not set up for the
// guard (fence.ErrNotMigrated, fence.ErrNoTable, fence.ErrNoLockVersion,
// fence.ErrLockVersionType, fence.ErrLedgerTable, or a privilege
// refused), or a database error wrapped with %w so that errors.As finds
// the *pgconn.PgError. Every *fence.SetupError matches lease.ErrSetup (it
// is fence.ErrSetup), so that a loop retrying a lease's work stops at
// once. A rejected write changed nothing. A rejection always
// matches fence.ErrStaleToken; in the one case where the guard cannot
// read the current token (a Guard's rejection whose DETAIL is not a
// number, which fencekit's own function never sends), the
// *fence.StaleError carries Current = fence.None, meaning unknown. Bad
// input is refused before any I/O: a token that is 0 or above the int64
// range (PostgreSQL's bigint is signed) matches fence.ErrInvalidToken
// (Checker, which answers tokens that came over the wire, reports a valid
// token above that range with fencecheck.ErrTokenRange instead); a
// nil database, an empty, over-long (> 63 bytes) or NUL-containing
// identifier, a column given twice, a key column among the written
// columns, lock_version among the caller's columns, or a NULL key value
// (nil, a nil pointer, or a pgtype or database/sql null: NULL matches no
// row and conflicts with none, so two writers could each create "the"
// row) match fence.ErrInvalidArgument. Identifiers are always quoted with
// pgx.Identifier.Sanitize, and values are always bind parameters, never
// SQL text, so names containing quotes or semicolons cannot inject SQL,
// whatever the session's client_encoding (a resource name is sent as its
// UTF-8 bytes and decoded by the server).
//
// # Start-up checks, metrics, ledger
//
// Guard.Check, Table.Check and Ledger.Check, run when the program starts,
// read the catalog and report every setup problem with its fix (tables,
// columns and their types, unique keys, migrations applied, privileges, a
// standby), before the first write. WithObserver (for a Guard) and
// Table.WithObserver report each write as a fence.WriteEvent, the input of
// packages leaseprom and leaseotel. Ledger is a lease.Ledger for
// lease.Manager.RunOnce; its MarkDoneTx records a run done in the job's
// own transaction. Jobs fences a job table of one's own (fencekit_jobs,
// or a table of the same shape): each claim of a job is an attempt with a
// token of its own, and its heartbeat, completion and failure are refused
// once a later attempt has claimed the job.
//
// # Outcomes that cannot be known
//
// A statement that reached the server can still be applied after its
// client stopped waiting: a write blocked on a row lock commits when the
// lock is released, even though the context that bounded it ended and pgx
// closed the connection (pgx's cancel request, sent then, is best effort:
// it can be lost, or arrive after the write). Such a write is reported as
// an error matching fence.ErrOutcomeUnknown joined with its cause (for
// example context.DeadlineExceeded or a broken connection's error); never
// as success, never as a rejection. Read the row or resource again to
// learn what happened. Exactly:
//
//   - A Table write returns it when its statement was sent and no answer
//     came back: the context ended or the connection broke in flight. In
//     a transaction (db a pgx.Tx) the write can take effect only if that
//     transaction commits, which it cannot once its connection is gone.
//   - Guard.BeginFunc returns it when COMMIT was sent and no answer came
//     back. An interruption earlier (in BEGIN, the advance or fn) commits
//     nothing, because PostgreSQL rolls back the open transaction of a
//     closed connection, and is a plain error.
//   - Guard.Advance never returns it: it runs in your transaction, whose
//     commit is yours.
//
// A failure before anything was sent (a context that had already ended,
// no connection from the pool, an argument pgx cannot encode) is a plain
// error: nothing can have been applied. For a DBTX other than a pool, a
// connection or a pgx.Tx, sqlguard cannot see the connection, and reports
// every failure that pgx does not mark as raised before sending
// (pgconn.SafeToRetry) as unknown.
//
// # The lock_version column
//
// Row-level fencing needs lock_version to be bigint. With real or double
// precision, two distinct tokens above 2^24 or 2^53 round to one value and
// a stale write would pass; smallint and integer overflow; numeric and
// text would hold values the guard cannot read back. So a write to a table
// whose lock_version has any other type writes nothing and returns
// fence.ErrLockVersionType. The rule is defined once (internal/lockversion) for
// this package and for package migrations, which refuses such a column
// when it adds lock_version. How it is checked is part of the next
// section.
//
// # One statement on the success path, the exact one on the rejection path
//
// Each connection checks a table once, at its first write to it (one
// query, one round trip, reading only the catalog): that lock_version is
// bigint, and that a unique index (valid, not deferrable, not partial, on
// plain columns) has exactly the Table's key columns, so that a key can
// reach one row at most. The answer is kept with the connection
// (pgconn.CustomData: it lives as long as the connection, and a pool's
// connections each check once). Where both hold, a write is first sent as
// the plain statement with "lock_version <= token" added to its condition
// (UPDATE ... WHERE key AND lock_version <= $t, DELETE likewise, INSERT ...
// ON CONFLICT DO NOTHING or DO UPDATE ... WHERE lock_version <=
// EXCLUDED.lock_version), which costs what the unfenced statement costs; it
// also re-checks lock_version's type in its condition, at no cost at run
// time (the type is resolved when the statement is planned), so a column
// altered after the check is not trusted. When that statement writes the
// row, that is the whole write. When it writes nothing, which says nothing
// about why, the exact statement below follows (a second round trip, on
// the rejection path only): it writes if it may by now, or says exactly
// why not. Where the check fails (no such unique index, for example on a
// view), and through a DBTX whose connection sqlguard cannot see (neither
// a pool, a connection nor a pgx.Tx), every write is the exact statement
// alone, which checks lock_version's type by itself.
//
// What a connection learned at its first write is not read again: a unique
// index dropped later is not seen by that connection, and a write that
// then reaches several rows is written and reported (fence.ErrAmbiguousKey,
// saying so). A search_path changed with SET after the first write is not
// seen either; set it in the connection's configuration instead.
//
// # How the stale token's current version is learned without a race
//
// The exact statement of a row-level write locks the row first and then
// writes conditionally, in one statement:
//
//	WITH fencekit_cur AS (SELECT lock_version ... WHERE key = $1 FOR NO KEY UPDATE),
//	     fencekit_w AS (UPDATE ... SET ..., lock_version = $t
//	                    WHERE key = $1 AND (SELECT max(lock_version) FROM fencekit_cur) <= $t
//	                    RETURNING 1)
//	SELECT count(fencekit_cur), max(lock_version), count(fencekit_w)
//
// Under READ COMMITTED, SELECT ... FOR NO KEY UPDATE (the lock an UPDATE
// takes) waits for a concurrent writer of the row and then returns the
// row's newest committed version, now locked by this statement; the UPDATE
// compares against that same value (PostgreSQL re-checks its WHERE on the
// newest version). So the version reported in a *fence.StaleError is the
// one that rejected the write, never an older snapshot's. A plain "UPDATE
// ... WHERE lock_version <= $t" cannot tell a stale row from a missing
// one, and a SELECT after it would race: that is why the success path's
// plain statement, when it writes nothing, is followed by this one, which
// decides on its own. The exact statement also checks lock_version's type
// (reading it from the statement's own parse of the table, at a few
// microseconds of server time) and writes nothing when it is not bigint.
//
// The resource-level advance is one call to the toolkit's function
// fencekit_advance_token (package migrations): an INSERT ... ON CONFLICT DO
// UPDATE SET token = EXCLUDED.token WHERE token <= EXCLUDED.token, which
// locks the row even when its WHERE fails; on failure the function reads the
// stored token in a new statement (a new snapshot under READ COMMITTED; the
// row is locked, so it cannot have moved) and raises it as SQLSTATE FK409.
//
// # Isolation levels
//
// The guard is designed for READ COMMITTED, PostgreSQL's default: writers
// of the same row or resource queue on its row lock, and each is checked
// against the newest committed token. Under REPEATABLE READ or
// SERIALIZABLE, PostgreSQL refuses to write a row that another transaction
// changed after this transaction's snapshot; the guard reports that
// serialization failure (SQLSTATE 40001) as an error matching fence.ErrRetryable,
// never as stale, because it says nothing about the tokens. Retrying the
// whole transaction gives the definite answer (often a stale error). Under
// SERIALIZABLE a commit can also fail with 40001; BeginFunc reports it the
// same way. Deadlocks (40P01) are retryable too. sqlguard never retries by
// itself: only the caller knows whether its whole transaction can be
// replayed.
//
// # Round trips
//
// A row-level write that succeeds: one statement, one round trip, the
// same as the unfenced statement (plus one round trip at a connection's
// first write to the table, for its check). A rejected one, or one on a
// connection without the fast path: two statements, two round trips. Guard.BeginFunc on a *pgxpool.Pool, *pgxpool.Conn or
// *pgx.Conn: the begin query (pgx's, from Options.TxOptions, or your
// BeginQuery exactly as given) and the advance are sent as one pgx batch
// (pgx.Batch.BeginTx): two statements, with bind parameters, in one round
// trip once pgx has prepared them on the connection, so the transaction
// costs the same round trips as an unfenced one (one statement more on
// the server). Guard.Advance: one statement. A stale token in BeginFunc
// costs one more round trip, for the ROLLBACK.
package sqlguard
