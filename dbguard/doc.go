// Package dbguard enforces fencing tokens in MySQL, MariaDB and SQLite,
// through database/sql, so that a lock holder that has lost its lease (and
// does not know it yet) cannot change your data. It is package sqlguard's
// counterpart for these databases, with the same guarantees, errors and
// options style.
//
// The package imports no database driver: open the database with the
// driver you use (github.com/go-sql-driver/mysql for MySQL and MariaDB,
// modernc.org/sqlite for SQLite: the tested ones) and pass the dialect by
// value, dbguard.MySQL or dbguard.SQLite. A program that uses SQLite does
// not inherit the MySQL driver, and the other way round.
//
// # Safety model
//
// A lease gives liveness, never safety: a holder paused by a GC, a
// suspended VM or a slow network can wake up after its lease expired and
// another holder got it, and go on writing. Every grant carries a fencing
// token that grows with every grant (package fence); dbguard makes the
// database reject a write whose token is older than the newest token
// already accepted for the same row or resource (Kleppmann, "How to do
// distributed locking", 2016). The check and the write are one atomic step
// in the database. A write with the same token as the newest one (the same
// holder writing again) is accepted. dbguard does not import any lease
// package: tokens can come from fencekit leases or any source that only
// grows.
//
// Two ways to fence, which combine:
//
//   - Row-level: a Table writes single rows of your table, which carries a
//     lock_version column (BIGINT UNSIGNED on MySQL, INTEGER on SQLite;
//     package migrations adds it). Update, Insert, Upsert and Delete each
//     write only if the row's lock_version is <= the token, and set
//     lock_version to the token.
//   - Resource-level: a Guard fences any SQL that runs in a transaction.
//     Guard.BeginFunc advances the resource's token in the toolkit's table
//     fencekit_resource_tokens, holds that row (MySQL: its record lock;
//     SQLite: the database's write lock) until the transaction ends, runs
//     your function and commits; a stale token is rejected before your
//     function runs. Guard.Advance does the same in a transaction you
//     manage.
//
// # Every write must go through the guard
//
// The database enforces the token only on writes that present it. A plain
// UPDATE of a fenced table that bypasses Table (or a transaction that
// bypasses Guard) is not fenced, and if it does not set lock_version the
// row no longer records which token wrote it. That is a bug in the code
// that issues it. Never write lock_version yourself.
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
// fence.ErrLockVersionType, fence.ErrLedgerTable, a privilege refused, a
// read-only server or file), or a database error wrapped with %w so that
// errors.As finds the driver's error. Every *fence.SetupError matches
// lease.ErrSetup (it is fence.ErrSetup), so that a loop retrying a
// lease's work stops at once. A rejected write changed
// nothing. An Insert or Upsert whose row collides with another on a unique
// index other than the key's (an email column, say) gets the database's
// error, naming the index (MySQL) or the constraint's columns (SQLite):
// never fence.ErrRetryable, which is kept for a row with the key created by
// another transaction at the same time. Bad input is refused before any I/O: a token that is 0, or
// above 2^63-1 on SQLite (its integers are signed 64-bit), matches
// fence.ErrInvalidToken; an unknown dialect, a nil database, an empty,
// over-long or NUL-containing identifier, a column given twice, a key
// column among the written columns, lock_version among your columns, or a
// NULL key value match fence.ErrInvalidArgument. Identifiers are always quoted (MySQL:
// backquotes, SQLite: double quotes, the quote character doubled), and
// values are always bind parameters.
//
// # Start-up checks, metrics, ledger
//
// Guard.Check, Table.Check and Ledger.Check, run when the program starts,
// report every setup problem with its fix (the toolkit's table and its
// migration, a table's lock_version and unique key, privileges, a
// read-only server or file), before the first write. WithObserver (for a
// Guard) and Table.WithObserver report each write as a fence.WriteEvent,
// the input of packages leaseprom and leaseotel. Ledger is a lease.Ledger
// for lease.Manager.RunOnce, in fencekit_job_runs (`fencekit migrate up
// --dialect mysql|sqlite`); its MarkDoneTx records a run done in the job's
// own transaction.
//
// # Outcomes that cannot be known
//
// A write whose context ends, or whose connection breaks, after the
// statement was sent may have been applied. dbguard then returns an error
// matching fence.ErrOutcomeUnknown joined with the cause, never success
// and never a plain failure. Exactly: a Table write when its statement (or
// the COMMIT of its rejection path's transaction) was sent and no answer
// came; BeginFunc when COMMIT was sent and no answer came (an interruption
// earlier commits nothing: the server rolls back the transaction of a
// closed connection). A failure before anything was sent is plain: no
// connection from the pool, a context that had ended, an error that
// database/sql's contract marks as raised before sending
// (driver.ErrBadConn), the database's own error answer, or a connection
// the driver still reports valid (driver.Validator) after an error that
// is not the context's. A context that ends while the statement runs is
// always an unknown outcome: SQLite runs in the process, and
// modernc.org/sqlite can finish and commit a statement and still return
// the context's error, on a connection it keeps valid.
//
// An unknown outcome can be lost later even after others saw it. MySQL
// and MariaDB without the binary log make a commit visible before its
// redo is on disk: if the server crashes then, a read (or a guarded
// write rejected as stale against that commit) may have seen a row that
// recovery no longer has. Its own writer never got an answer, so the
// guard reported nothing false, but the fence's history went back. A
// server run with the binary log synced at every commit (log_bin,
// sync_binlog=1, innodb_flush_log_at_trx_commit=1, the durable setup of a
// primary) makes a commit visible only once the binary log holds it, and
// recovers it. docs/reliability.md tells how the history check found it.
//
// # One statement on the success path, the exact answer on the rejection path
//
// At a Table's first write, the guard reads the catalog (information_schema
// on MySQL, pragma_table_info and pragma_index_list on SQLite): that the
// table exists, that lock_version can hold every token, and whether a
// unique index (or the primary key) has exactly the key columns, which
// Insert and Upsert need. That is a setup check, and nothing safe rests on
// it: a Table may write to several databases, and a table may be altered
// after its first write.
//
// Each write is first sent as one statement: the plain statement with the
// key and "lock_version <= ?" in its condition, and with the checks its
// tokens need of the row it reaches, made by the statement itself:
//
//   - fewer than two rows have the key: a key the database matches against
//     several rows changes none of them (MySQL and MariaDB compare a
//     number with a VARCHAR key as numbers, even in strict mode, so 1
//     matches '1' and '01'; SQLite compares with the key column's
//     collation, which may be coarser than the unique index's);
//   - lock_version is an exact number (MySQL) or the stored value an
//     integer (SQLite), so that tokens compare exactly;
//   - MySQL: the session is strict (sql_mode has STRICT_TRANS_TABLES or
//     STRICT_ALL_TABLES), and an UPDATE stores 2^64-1 before the token, so
//     that a column that cannot hold every token (INT, a signed BIGINT)
//     fails the statement: fence.ErrLockVersionType, nothing written (in a
//     session that is not strict, every write takes the rejection path);
//   - MySQL, through a *sql.DB or *sql.Conn: autocommit is on, so that the
//     statement has committed when it returns.
//
// An Insert's INSERT has no row to check: on MySQL it checks the session
// (strict, and autocommit outside a transaction) and nothing else. When
// the statement reports one row written, that is the whole write: one
// statement, as many round trips as the unfenced statement. When it writes
// nothing, which says nothing about why, the rejection path runs a short
// transaction that locks the row, reads its lock_version, reads the
// catalog again (of the table it reached, now), and writes or says exactly
// why not (stale, missing, exists, ambiguous, the column's type).
//
// MySQL's "rows affected" counts changed rows unless the client sets
// clientFoundRows: a write of identical values with the same token
// reports 0, as a stale one does. dbguard never reads 0 as stale: the
// rejection path decides from the locked row, and after a write that
// reports 0 it reads the locked row again, so the identical rewrite is
// accepted with or without clientFoundRows.
//
// The rejection path's transaction: on MySQL at READ COMMITTED with
// SELECT ... FOR UPDATE (a locking read sees the newest committed row, not
// the snapshot, and under READ COMMITTED InnoDB takes no gap lock for a
// missing key, so two writers of one new key do not deadlock); on SQLite
// the conditional write comes first, so that the transaction takes the
// database's write lock before it reads (a deferred transaction that reads
// and then writes gets SQLITE_BUSY at once when another connection wrote
// in between). Passed a *sql.Tx, the guard runs the same statements in it.
//
// MySQL has no UPDATE ... RETURNING (MariaDB has RETURNING on INSERT and
// DELETE only), so the exact answer cannot come from the write itself as
// in sqlguard; the locking read in one transaction gives it instead.
//
// # Autocommit off
//
// With autocommit off (a DSN's autocommit=0, or the server's autocommit
// setting), every statement opens a transaction that stays open on the
// pooled connection until something commits it. A Table write through a
// *sql.DB or *sql.Conn then takes the rejection path's transaction, whose
// COMMIT makes the write durable before nil is returned. MySQL refuses to
// set that transaction's isolation level while the session has one open:
// the guard commits the session's open transaction first, as START
// TRANSACTION itself would. Write through a *sql.Tx to keep your own
// statements out of it. A transaction begun with SQL (START TRANSACTION)
// on a *sql.Conn is not seen by the success path: the write joins it and
// is committed when that transaction is; where the write needs the
// rejection path, it is refused with an error that says so. Begin it with
// BeginTx and pass the *sql.Tx.
//
// # The lock_version column
//
// On MySQL it must be BIGINT UNSIGNED: a DOUBLE rounds two tokens above
// 2^53 to one value (a stale token would compare equal to a newer one),
// INT overflows, a signed BIGINT cannot hold tokens above 2^63-1 and
// DECIMAL or text compare in ways the guard does not read back. On SQLite
// its declared type must have INTEGER affinity (it contains "INT",
// https://sqlite.org/datatype3.html). Any other type: fence.ErrLockVersionType,
// nothing written, from the first write's check, from a statement's own
// checks, or from the rejection path's catalog read. Two gaps are left
// where the type is not one of these and no check sees it in time: a
// statement's own checks accept a DECIMAL(p,0) wide enough for 2^64-1 on
// MySQL and an integer stored in a NUMERIC or BLOB column on SQLite (each
// compares and stores every token exactly), and an Insert that writes a
// new row, which has no row to check, writes it (every later write of
// that row is refused).
//
// # Isolation levels and locks
//
// MySQL and MariaDB default to REPEATABLE READ. Guard.BeginFunc uses
// Options.TxOptions (default: the server's level). Its advance is the
// transaction's first statement, an INSERT ... ON DUPLICATE KEY UPDATE on
// the resource's primary key: an exclusive record lock, held until the
// transaction ends, and no consistent read, so the snapshot of your
// function's first read is taken after the fence is held. The first
// advance of a new resource by several transactions at once may deadlock
// under REPEATABLE READ (InnoDB's next-key locks on the duplicate key):
// MySQL rolls one back with error 1213, which dbguard reports as
// fence.ErrRetryable. Lock wait timeouts (1205, after innodb_lock_wait_timeout)
// are retryable too. dbguard never retries on its own.
//
// SQLite has one writer at a time. BeginFunc's advance is its first
// statement and a write, so the transaction takes the write lock at once
// (as BEGIN IMMEDIATE would) and keeps it until it ends. A second writer
// waits up to the connection's busy timeout, then gets SQLITE_BUSY
// (fence.ErrRetryable): open the database with one (modernc.org/sqlite:
// _pragma=busy_timeout(5000)); without it, concurrent writers fail at
// once. WAL mode (_pragma=journal_mode(WAL)) lets readers run beside the
// writer.
//
// # Round trips
//
// A Table write that succeeds: one statement (with go-sql-driver/mysql and
// no interpolateParams, a statement with arguments is prepared, executed
// and closed: two round trips, as for the unfenced statement), plus the
// catalog read at a Table's first write. Its own checks cost the server
// time, not round trips: on MariaDB 10.11 the row count (a derived table)
// about 0.09 ms and the others about 0.04 ms on loopback. A rejected
// write: the rejection path's transaction (begin, the locking read, one
// catalog read, the write if it may, a second read of the locked row after
// a write that reports 0 rows, commit). Guard.BeginFunc
// on MySQL: begin, one advance statement (a second, the read of the
// locked row, for a new resource and for a rejection), your statements,
// commit; on SQLite the same with the read only on rejection. Given a
// *sql.DB, BeginFunc prepares the advance statement once (on the last
// *sql.DB it was given; database/sql prepares it again on each pool
// connection at its first use there), so that an advance is one round
// trip, not a prepare and an execute.
package dbguard
