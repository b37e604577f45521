// Package pgleasesql holds the SQL of package lease/pglease, so that the
// benchmarks can send the very same statements directly (their raw floor).
package pgleasesql

import "github.com/fencekit/fencekit/internal/pgident"

// Names of the tables and functions pglease uses, created by package
// migrations.
const (
	LeaseTable        = "fencekit_leases"
	SessionLeaseTable = "fencekit_session_leases"
	// The lines of waiters (driver.Request.Queue) of each mode.
	WaiterTable        = "fencekit_lease_waiters"
	SessionWaiterTable = "fencekit_session_lease_waiters"
	// The owners each mode ended (Release, Abandon): one row per lease
	// name and owner, refused until driver.EndedOwnerTTL has passed.
	EndedTable        = "fencekit_lease_ended_owners"
	SessionEndedTable = "fencekit_session_lease_ended_owners"
	// EndedFunction and SessionEndedFunction(name, owner, at) say whether
	// owner of name is in each mode's table of ended owners with an until
	// after at, read from a snapshot of their own: called once the lease
	// row is locked, they see every end that committed before.
	EndedFunction        = "fencekit_lease_owner_ended"
	SessionEndedFunction = "fencekit_session_lease_owner_ended"
	// PruneFunction and SessionPruneFunction(name, owner) delete the
	// ended owners of name other than owner whose until has passed.
	PruneFunction        = "fencekit_lease_prune_ended"
	SessionPruneFunction = "fencekit_session_lease_prune_ended"
	// RefusalFunction and SessionRefusalFunction(name, owner) are an
	// acquire's refusal hint: -1 when owner of name was ended, else the
	// time left of the name's row in µs (0 when it has passed or there is
	// no row), by the server's clock at the call.
	RefusalFunction        = "fencekit_lease_refusal"
	SessionRefusalFunction = "fencekit_session_lease_refusal"
)

// Statements are the SQL package pglease sends, with the table names quoted
// (and qualified when Options.Schema is set). Values are always bound
// parameters.
type Statements struct {
	Acquire, Renew, RenewBatch, Release, Abandon, Holder                                  string
	SessionAcquire, SessionRenew, SessionRelease, SessionAbandon, SessionHolder, Sessions string
	// The acquires of an owner that waits in line (driver.Request.Queue).
	AcquireQueued, SessionAcquireQueued string
	// Check, and the tables' quoted names that it takes: each mode's
	// lease table and its table of ended owners.
	Check, Leases, Ended, SessionEnded string
}

// The statements are written for what they cost the server: every node
// of a plan (a CTE, a scan, a subquery) is set up and torn down at each
// execution, whether it runs or not, so the common path of a cycle
// (Acquire of a free name, then Release) has as few as its guarantees
// allow, and what only a refusal needs is a function call, which costs
// nothing until it is evaluated.

// clock reads the server's clock once, as now (timestamptz) and us
// (microseconds since the Unix epoch), in a CTE named c.
const clock = `c AS (SELECT x.t AS now, (extract(epoch FROM x.t) * 1000000)::bigint AS us FROM (SELECT clock_timestamp() AS t) x)`

// left is the time from now until expiry in whole µs, 0 if it has passed
// (an expiry of -infinity, a free row, included).
func left(expiry, now string) string {
	return `CASE WHEN ` + expiry + ` > ` + now + ` THEN (extract(epoch FROM ` + expiry + ` - ` + now + `) * 1000000)::bigint ELSE 0 END`
}

// isEnded is whether owner $2 of name $1 is in the table ended with an
// until still ahead of now, read from the statement's snapshot: a hint
// (a grant asks the ended function, which reads after the row's lock).
// The row is found by its key alone.
func isEnded(table, now string) string {
	return `coalesce((SELECT e.until > ` + now + ` FROM ` + table + ` e WHERE e.name = $1 AND e.owner = $2), false)`
}

// ended returns the INSERT that records owner $2 of name $1 as ended
// in the table ended until the server's clock + until µs (an SQL
// expression), once per row of the CTE src (which has written the name's
// lease row, and so holds its lock, and returns one row when the row
// exists): it inserts the owner's row, or extends the until of the row it
// has (counting the end in ends while that row had not lapsed, else
// starting again from ended_at). Nothing is recorded for a name without a
// lease row (data loss). Every statement that records ended owners holds
// the name's lease row first, so those of one name run one at a time. The
// caller adds RETURNING; ends > 1 says that the owner had been ended
// before the statement.
func ended(table, src, until string) string {
	return `INSERT INTO ` + table + ` AS e (name, owner, ended_at, until, ends)
SELECT $1, $2, clock_timestamp(), clock_timestamp() + ` + until + ` * interval '1 microsecond', 1 FROM ` + src + `
ON CONFLICT (name, owner) DO UPDATE SET
	ended_at = CASE WHEN e.until > EXCLUDED.ended_at THEN e.ended_at ELSE EXCLUDED.ended_at END,
	until = greatest(e.until, EXCLUDED.until),
	ends = CASE WHEN e.until > EXCLUDED.ended_at THEN e.ends + 1 ELSE 1 END`
}

// prune is, in the SELECT list of a statement that has recorded an ended
// owner (e), a call of the prune function fn that deletes the name's
// lapsed ended owners, one time in pruneEvery at random: each call
// deletes all that lapsed since the last one, so a name keeps about as
// many rows as owners it ended within driver.EndedOwnerTTL, plus
// pruneEvery, whatever its churn, and a release rarely pays for a call.
func prune(fn string) string {
	return `CASE WHEN random() * ` + pruneEvery + ` < 1 THEN ` + fn + `($1, $2) END IS NULL`
}

// pruneEvery: see prune.
const pruneEvery = "16"

// line returns the CTEs, after c, that read the line of name $1 for owner
// $2 in waiters from the statement's snapshot: me, the owner's live
// place; a (one row), how many live waiters are ahead of it (all of them
// when it has no live place) and the time left of the first one's place,
// in µs.
func line(waiters string) string {
	return `me AS (SELECT w.seq FROM ` + waiters + ` w, c WHERE w.name = $1 AND w.owner = $2 AND w.expires_at > c.now),
a AS (
	SELECT count(*) AS ahead, coalesce((array_agg(` + left("w.expires_at", "c.now") + ` ORDER BY w.seq))[1], 0::bigint) AS first_us
	FROM ` + waiters + ` w, c
	WHERE w.name = $1 AND w.owner <> $2 AND w.expires_at > c.now
		AND w.seq < coalesce((SELECT seq FROM me), 9223372036854775807)
)`
}

// place returns the CTEs, after c, that keep owner $2's place in the line
// of name $1 in waiters: d deletes it when granted (the CTE named grant
// returned a row), and every other place that lapsed (and is not marked
// ended); p, when not granted and join holds, puts the owner at the end
// of the line (a new seq, drawn by the INSERT) or, if it has a live
// place, keeps that place, either way living ttl µs (an SQL expression)
// from the clock c, unless the newest row marks the owner ended (see
// endPlace). Both read grant before they produce a row to write (d
// through the join with gd), so they lock waiters' rows only after grant
// has locked the lease row, the order in which Abandon locks them: no
// deadlock between them.
func place(waiters, grant, join, ttl string) string {
	return `gd AS (SELECT EXISTS (SELECT 1 FROM ` + grant + `) AS granted),
d AS (
	DELETE FROM ` + waiters + ` w USING c, gd
	WHERE w.name = $1 AND ((w.owner = $2 AND gd.granted) OR (w.owner <> $2 AND w.expires_at <= c.now AND w.ended_until <= c.now))
),
p AS (
	INSERT INTO ` + waiters + ` AS w (name, owner, expires_at)
	SELECT $1, $2, c.now + ` + ttl + ` * interval '1 microsecond' FROM c
	WHERE NOT EXISTS (SELECT 1 FROM ` + grant + `) AND ` + join + `
	ON CONFLICT (name, owner) DO UPDATE SET
		seq = CASE WHEN w.expires_at <= EXCLUDED.expires_at - ` + ttl + ` * interval '1 microsecond' THEN EXCLUDED.seq ELSE w.seq END,
		expires_at = greatest(w.expires_at, EXCLUDED.expires_at)
	WHERE w.ended_until <= EXCLUDED.expires_at - ` + ttl + ` * interval '1 microsecond'
)`
}

// endPlace returns the CTE q, after c and the CTE a (the lease row's
// upsert of an Abandon, which locks it first), that ends owner $2's place
// in name $1's line in waiters: for a queued request (queue, a bool
// parameter, true) it marks the place ended until the clock c + $3 µs,
// inserting the mark if there is no place yet, so that the owner's own
// acquire, if it reaches the
// store before the Abandon but commits after it (its snapshot older than
// the Abandon), finds the mark when its INSERT ... ON CONFLICT reads the
// newest row, and puts no place back; otherwise it deletes the place.
func endPlace(waiters, queue string) string {
	return `q AS (DELETE FROM ` + waiters + ` w WHERE w.name = $1 AND w.owner = $2 AND NOT ` + queue + `::bool AND EXISTS (SELECT 1 FROM a)),
qe AS (
	INSERT INTO ` + waiters + ` AS w (name, owner, expires_at, ended_until)
	SELECT $1, $2, '-infinity', c.now + $3::bigint * interval '1 microsecond' FROM c WHERE ` + queue + `::bool AND EXISTS (SELECT 1 FROM a)
	ON CONFLICT (name, owner) DO UPDATE SET expires_at = '-infinity', ended_until = EXCLUDED.ended_until
)`
}

// asyncCommit, evaluated in a statement, makes its transaction commit
// without waiting for the WAL flush (synchronous_commit off for that
// transaction only). A Release commits so: the release is visible at
// once, and a grant that follows it commits with the flush, which makes
// the release durable first (the WAL is written in order); only a crash
// (or a failover to a standby) before any later flush can lose it, and a
// lost release leaves the grant held at the store until its expiry, as a
// holder that crashed would: never a second holder, never a smaller
// token. The flush a synchronous release would wait for costs a disk
// write, and, with the release's NOTIFY, it is waited for under the
// server's one lock for notifying commits: releases of any names then
// commit one at a time.
const asyncCommit = `set_config('synchronous_commit', 'off', true)`

// asyncRefusal, in a statement's SELECT list, makes its transaction
// commit without waiting for the WAL flush when the CTE named grant
// returned no row: a refusal writes only a waiter's place, whose loss in a
// crash costs that waiter its place, never a token.
func asyncRefusal(grant string) string {
	return `CASE WHEN NOT EXISTS (SELECT 1 FROM ` + grant + `) THEN set_config('synchronous_commit', 'off', true) END`
}

// New returns the statements for the tables in schema ("" for the
// search_path).
func New(schema string) Statements {
	ident := func(name string) string {
		if schema == "" {
			return pgident.Quote(name)
		}
		return pgident.Quote(schema, name)
	}
	leases, sessions := ident(LeaseTable), ident(SessionLeaseTable)
	waiters, swaiters := ident(WaiterTable), ident(SessionWaiterTable)
	endedT, sendedT := ident(EndedTable), ident(SessionEndedTable)
	endedF, sendedF := ident(EndedFunction), ident(SessionEndedFunction)
	pruneF, spruneF := ident(PruneFunction), ident(SessionPruneFunction)
	refusalF, srefusalF := ident(RefusalFunction), ident(SessionRefusalFunction)
	// The pg_locks row of this database's advisory lock whose bigint key
	// has high and low 32 bits hi and lo, held by server process pid.
	lockHeld := func(pid, hi, lo string) string {
		return `EXISTS (SELECT 1 FROM pg_locks
		WHERE locktype = 'advisory' AND pid = ` + pid + ` AND granted
			AND database = (SELECT oid FROM pg_database WHERE datname = current_database())
			AND classid = ` + hi + `::bigint::oid AND objid = ` + lo + `::bigint::oid AND objsubid = 1)`
	}
	// The grant of a table-mode acquire, queued or not: the upsert's
	// conflict branch, which takes the row only when it is the owner's
	// own or has expired ($3 is the TTL in µs) and the owner was not
	// ended, and returns the token. The condition is evaluated on the
	// newest committed row once it is locked, and asks the ended function
	// about the owner only when the row could be granted.
	tableGrant := `	ON CONFLICT (name) DO UPDATE SET
		owner = EXCLUDED.owner,
		token = CASE WHEN l.owner = EXCLUDED.owner AND l.expires_at > EXCLUDED.expires_at - $3::bigint * interval '1 microsecond'
			THEN l.token
			ELSE greatest(l.token + 1, EXCLUDED.token) END,
		expires_at = EXCLUDED.expires_at
	WHERE (l.owner = EXCLUDED.owner OR l.expires_at <= EXCLUDED.expires_at - $3::bigint * interval '1 microsecond')
		AND NOT ` + endedF + `(EXCLUDED.name, EXCLUDED.owner, EXCLUDED.expires_at - $3::bigint * interval '1 microsecond')
	RETURNING l.token
)`
	// The grant of a session-mode acquire, queued or not, once the CTE k
	// says whether the advisory lock was taken: the token row's upsert,
	// taken only when the row's expiry has passed (or it was released)
	// and the owner was not ended ($7 is the TTL in µs).
	sessionGrant := `	ON CONFLICT (name) DO UPDATE SET
		owner = EXCLUDED.owner,
		token = greatest(t.token + 1, EXCLUDED.token),
		backend_pid = EXCLUDED.backend_pid,
		granted_at = EXCLUDED.granted_at,
		expires_at = EXCLUDED.expires_at
	WHERE t.expires_at <= EXCLUDED.granted_at AND NOT ` + sendedF + `(EXCLUDED.name, EXCLUDED.owner, EXCLUDED.granted_at)
	RETURNING t.token
)`
	// The lease row's update of a Release, r: the row is freed if it
	// holds the grant (cond), and written whatever it holds, so that the
	// statement holds its lock before it records the owner as ended.
	// released: the row is free with the grant's token, freed now or by
	// an earlier Release or Abandon of this grant. notify, an SQL
	// expression, is evaluated once, after the update, and so is
	// asyncCommit.
	release := func(table, cond, notify string) string {
		return `r AS (
	UPDATE ` + table + ` AS l SET
		owner = CASE WHEN ` + cond + ` THEN '' ELSE l.owner END,
		expires_at = CASE WHEN ` + cond + ` THEN '-infinity' ELSE l.expires_at END
	WHERE l.name = $1
	RETURNING l.owner = '' AND l.token = $3 AS released, ` + notify + ` AS notified, ` + asyncCommit + ` AS async
)`
	}
	return Statements{
		// $1 name, $2 owner, $3 TTL in µs. The server's clock is read once
		// (clock_timestamp(), in the SELECT that feeds the INSERT, so after
		// the statement has its table locks: a TRUNCATE that was waited for
		// is over). That instant is "now" for every comparison, the expiry
		// is now + TTL, and the token is greatest(stored token + 1, now in
		// µs since the epoch). The stored token is read in DO UPDATE,
		// after the row lock, so it is the newest committed one (READ
		// COMMITTED re-reads a row updated meanwhile), and so are the
		// ended owners, which the ended function reads then; a refused
		// statement writes nothing. An owner ended by Release or Abandon
		// is refused. While the statement's snapshot shows another owner's
		// live grant, it refuses without trying the row: ON CONFLICT locks
		// the row it conflicts with even when it grants nothing, so the
		// waiters of a busy name would queue for its lock, and the
		// holder's release behind them. Returns whether it granted, the
		// token, and, when refused, the refusal function's hint (-1: the
		// owner was ended; else the holder's time left in µs).
		Acquire: `WITH g AS (
	INSERT INTO ` + leases + ` AS l (name, owner, token, expires_at)
	SELECT $1, $2, (extract(epoch FROM c.t) * 1000000)::bigint, c.t + $3::bigint * interval '1 microsecond'
	FROM (SELECT clock_timestamp() AS t) c
	WHERE NOT EXISTS (SELECT 1 FROM ` + leases + ` h WHERE h.name = $1 AND h.owner <> $2 AND h.expires_at > c.t)
` + tableGrant + `
SELECT g.token IS NOT NULL, coalesce(g.token, 0::bigint), CASE WHEN g.token IS NULL THEN ` + refusalF + `($1, $2) ELSE 0::bigint END
FROM (VALUES (1)) v LEFT JOIN g ON true`,

		// $1 name, $2 owner, $3 token, $4 TTL in µs.
		Renew: `UPDATE ` + leases + ` SET expires_at = clock_timestamp() + $4::bigint * interval '1 microsecond'
WHERE name = $1 AND owner = $2 AND token = $3 AND expires_at > clock_timestamp()`,

		// $1 names, $2 owners, $3 tokens, $4 TTLs in µs: one UPDATE for all.
		RenewBatch: `UPDATE ` + leases + ` AS l SET expires_at = clock_timestamp() + b.ttl * interval '1 microsecond'
FROM unnest($1::text[], $2::text[], $3::bigint[], $4::bigint[]) AS b(name, owner, token, ttl)
WHERE l.name = b.name AND l.owner = b.owner AND l.token = b.token AND l.expires_at > clock_timestamp()
RETURNING l.name, l.owner, l.token`,

		// $1 name, $2 owner, $3 token, $4 channel, $5 how long to remember
		// the owner as ended, in µs. If the row holds the grant and has
		// not expired (by the statement's start, now()), it is marked free
		// (it stays: it carries the name's token; a free row has owner ''
		// and an expiry in the past) and the release is announced;
		// whatever it holds, it is written (r), and the owner is recorded
		// as ended. Returns whether the row is free with the grant's token
		// (released now, or by an earlier request of the same grant) and
		// whether the owner had been ended before (a retried release); no
		// row when the name has no row (data loss). Prunes now and then.
		// Commits without waiting for the WAL flush (see asyncCommit).
		Release: `WITH ` + release(leases, "l.owner = $2 AND l.token = $3 AND l.expires_at > now()",
			"CASE WHEN l.owner = '' AND l.token = $3 THEN pg_notify($4, $1) END IS NULL") + `
` + ended(endedT, "r", "$5::bigint") + `
RETURNING (SELECT released FROM r), e.ends > 1, ` + prune(pruneF),

		// $1 name, $2 owner, $3 how long to remember the owner as ended,
		// in µs, $4 channel. Ends the owner's grant if it holds one (any
		// token) and records it as ended; a name without a row gets a free
		// one (its token the clock in µs, which the next grant exceeds),
		// so that a request still on its way finds a row to lock, and
		// with it the record (e). Prunes the name's lapsed ended owners.
		// Announces a release in any case (a waiter woken for nothing
		// tries again). $5 whether the request was queued: the owner's
		// place in line is ended (q, qe: see endPlace).
		Abandon: `WITH ` + clock + `,
a AS (
	INSERT INTO ` + leases + ` AS l (name, owner, token, expires_at)
	SELECT $1, '', c.us, '-infinity' FROM c
	ON CONFLICT (name) DO UPDATE SET
		owner = CASE WHEN l.owner = $2 THEN '' ELSE l.owner END,
		expires_at = CASE WHEN l.owner = $2 THEN '-infinity' ELSE l.expires_at END
	RETURNING l.name
),
e AS (
` + ended(endedT, "a", "$3::bigint") + `
	RETURNING 1
),
` + endPlace(waiters, "$5") + `
SELECT count(*) FROM (SELECT pg_notify($4, a.name), ` + pruneF + `($1, $2) FROM a, e) n`,

		// $1 name, $2 owner, $3 TTL in µs: Acquire for an owner that
		// waits in line (driver.Request.Queue). It tries the grant (g, as
		// Acquire) only when no live waiter is ahead of the owner (a,
		// from the statement's snapshot) or the owner holds the name (a
		// retried request); a grant deletes the owner's place, a refusal
		// of an owner not ended puts it in line or keeps its place for
		// the TTL (d, p), and commits without waiting for the WAL flush.
		// Places that lapsed are deleted. Returns whether it granted, the
		// token, the holder's time left in µs (0 when free or unknown), how
		// many live waiters are ahead, the time left of the first one's
		// place in µs, and whether the owner was ended.
		AcquireQueued: `WITH ` + clock + `,
h AS (
	SELECT l.owner, ` + left("l.expires_at", "c.now") + ` AS left_us, ` + isEnded(endedT, "c.now") + ` AS ended
	FROM ` + leases + ` l, c WHERE l.name = $1
),
` + line(waiters) + `,
g AS (
	INSERT INTO ` + leases + ` AS l (name, owner, token, expires_at)
	SELECT $1, $2, c.us, c.now + $3::bigint * interval '1 microsecond' FROM c, a
	WHERE a.ahead = 0 OR EXISTS (SELECT 1 FROM h WHERE h.owner = $2 AND h.left_us > 0)
` + tableGrant + `,
` + place(waiters, "g", "NOT coalesce((SELECT ended FROM h), false)", "$3::bigint") + `
SELECT EXISTS (SELECT 1 FROM g), coalesce((SELECT token FROM g), 0::bigint),
	coalesce((SELECT h.left_us FROM h WHERE h.owner <> $2 AND h.owner <> ''), 0::bigint),
	a.ahead, a.first_us, coalesce((SELECT ended FROM h), false), ` + asyncRefusal("g") + ` IS NULL
FROM a`,

		// $1 name, $2 owner, $3 lock key, $4 TTL in ms (text), $5 whether
		// a pooler is allowed, $6 the server process the connection
		// announced at connect, $7 TTL in µs. Unless the statement runs
		// in that process (or a pooler is allowed), it takes nothing:
		// behind a pooler a session lock would stay on a server connection
		// others use. Otherwise it takes the lock without waiting (k) and,
		// only if it got it, writes the token row (t) if that row's expiry
		// has passed (or it was released) and the owner was not ended:
		// the lock alone is not enough, because the server frees it the
		// moment it ends a session, while that session's holder may count
		// its lease valid until its own deadline. The row is read after
		// its lock (DO UPDATE), so it is the newest committed one. When
		// granted, it sets the session's idle_session_timeout to the TTL
		// (the server ends a session idle for that long) and mints the
		// token as table mode does; when not, it unlocks what it took.
		// Returns whether it granted, the token, the server process, the
		// timeout it replaced (read before it is set: the SELECT list is
		// evaluated in order), whether the session holds nothing it should
		// not (the lock given back when refused), and, when refused, the
		// refusal function's hint (-1: the owner was ended; else the row's
		// time left in µs).
		SessionAcquire: `WITH k AS (
	SELECT CASE WHEN $5::bool OR pg_backend_pid() = $6::int THEN pg_try_advisory_lock($3::bigint) ELSE false END AS ok
),
t AS (
	INSERT INTO ` + sessions + ` AS t (name, owner, token, backend_pid, granted_at, expires_at)
	SELECT $1, $2, (extract(epoch FROM c.t) * 1000000)::bigint, pg_backend_pid(), c.t, c.t + $7::bigint * interval '1 microsecond'
	FROM k, (SELECT clock_timestamp() AS t) c WHERE k.ok
` + sessionGrant + `
SELECT t.token IS NOT NULL, coalesce(t.token, 0), pg_backend_pid(),
	CASE WHEN t.token IS NOT NULL THEN current_setting('idle_session_timeout') ELSE '' END,
	CASE WHEN t.token IS NOT NULL THEN set_config('idle_session_timeout', $4::text, false) IS NOT NULL
		WHEN k.ok THEN pg_advisory_unlock($3::bigint)
		ELSE true END,
	CASE WHEN t.token IS NULL THEN ` + srefusalF + `($1, $2) ELSE 0::bigint END
FROM k LEFT JOIN t ON true`,

		// SessionAcquire's parameters: SessionAcquire for an owner that
		// waits in line (driver.Request.Queue). It tries the lock (k) only
		// when no live waiter is ahead of the owner (a, from the
		// statement's snapshot) and the owner was not ended, then
		// proceeds as SessionAcquire (t; s sets the idle timeout, u gives
		// the lock back when the row refused the grant); a grant deletes
		// the owner's place, a refusal of an owner not ended puts it in
		// line or keeps its place for the TTL (d, p), and commits without
		// waiting for the WAL flush. Places that lapsed are deleted.
		// Returns SessionAcquire's columns, then how many live waiters are
		// ahead and the time left of the first one's place in µs.
		SessionAcquireQueued: `WITH ` + clock + `,
h AS (
	SELECT ` + left("r.expires_at", "c.now") + ` AS left_us, ` + isEnded(sendedT, "c.now") + ` AS ended
	FROM ` + sessions + ` r, c WHERE r.name = $1
),
` + line(swaiters) + `,
v AS (SELECT $5::bool OR pg_backend_pid() = $6::int AS direct),
k AS (
	SELECT CASE WHEN v.direct AND a.ahead = 0 AND NOT coalesce((SELECT ended FROM h), false)
		THEN pg_try_advisory_lock($3::bigint) ELSE false END AS ok
	FROM v, a
),
t AS (
	INSERT INTO ` + sessions + ` AS t (name, owner, token, backend_pid, granted_at, expires_at)
	SELECT $1, $2, c.us, pg_backend_pid(), c.now, c.now + $7::bigint * interval '1 microsecond'
	FROM k, c WHERE k.ok
` + sessionGrant + `,
s AS (
	SELECT current_setting('idle_session_timeout') AS was, set_config('idle_session_timeout', $4::text, false) AS now
	FROM t
),
u AS (
	SELECT pg_advisory_unlock($3::bigint) AS unlocked FROM k WHERE k.ok AND NOT EXISTS (SELECT 1 FROM t)
),
` + place(swaiters, "t", "(SELECT direct FROM v) AND NOT coalesce((SELECT ended FROM h), false)", "$7::bigint") + `
SELECT EXISTS (SELECT 1 FROM t), coalesce((SELECT token FROM t), 0), pg_backend_pid(), coalesce((SELECT was FROM s), ''),
	coalesce((SELECT unlocked FROM u), k.ok = EXISTS (SELECT 1 FROM t)),
	coalesce((SELECT left_us FROM h), 0), coalesce((SELECT ended FROM h), false),
	a.ahead, a.first_us, ` + asyncRefusal("t") + ` IS NULL
FROM k, a`,

		// $1 name, $2 owner, $3 token, $4 server pid, $5 and $6 the lock
		// key's high and low 32 bits (as pg_locks shows a bigint key), $7
		// TTL in µs. Extends the row's expiry if this server process still
		// holds the lock and the row still names the grant; returns a row
		// only then.
		SessionRenew: `UPDATE ` + sessions + ` SET expires_at = clock_timestamp() + $7::bigint * interval '1 microsecond'
WHERE name = $1 AND owner = $2 AND token = $3 AND pg_backend_pid() = $4::int
	AND ` + lockHeld("pg_backend_pid()", "$5", "$6") + `
RETURNING true`,

		// $1 name, $2 owner, $3 token, $4 server pid, $5 lock key, $6 the
		// idle_session_timeout to restore, $7 channel, $8 how long to
		// remember the owner as ended, in µs. Marks the row free if it
		// names the grant and records the owner as ended (r, e: as table
		// mode's Release), then unlocks (u), restores the timeout,
		// announces, prunes now and then, and commits without waiting for
		// the WAL flush (see asyncCommit). Returns whether the row names
		// the grant (free with its token) and the statement runs in the
		// process that took the lock, and whether the lock was held.
		SessionRelease: `WITH ` + release(sessions, "l.owner = $2 AND l.token = $3", "true") + `,
e AS (
` + ended(sendedT, "r", "$8::bigint") + `
	RETURNING 1
),
u AS (
	SELECT coalesce((SELECT r.released FROM r, e), false) AND pg_backend_pid() = $4::int AS named, pg_advisory_unlock($5::bigint) AS unlocked
)
SELECT u.named, u.unlocked, set_config('idle_session_timeout', $6::text, false),
	CASE WHEN u.named AND u.unlocked THEN pg_notify($7, $1)::text END,
	NOT u.named OR ` + prune(spruneF) + `
FROM u`,

		// $1 name, $2 owner, $3 how long to remember the owner as ended,
		// in µs, $4 channel, $5 and $6 the lock key's high and low 32
		// bits. Like table mode's Abandon, on the token row; and when the
		// row named the owner (o, read after its lock, and before a
		// writes: a's WHERE reads it first, since a CTE reading a row
		// this statement already changed would skip it) and that grant's
		// server process still holds the lock and runs as the same user,
		// it ends that session (pg_terminate_backend, waiting up to 5 s
		// for it to exit) so that the lock is free when this returns.
		// Returns whether it ended a session. $7 whether the request was
		// queued: the owner's place in line is ended (q, qe: see
		// endPlace).
		SessionAbandon: `WITH ` + clock + `,
o AS (SELECT owner, backend_pid FROM ` + sessions + ` WHERE name = $1 FOR UPDATE),
a AS (
	INSERT INTO ` + sessions + ` AS t (name, owner, token, backend_pid, granted_at, expires_at)
	SELECT $1, '', c.us, 0, c.now, '-infinity' FROM c
	WHERE (SELECT count(*) FROM o) >= 0
	ON CONFLICT (name) DO UPDATE SET
		owner = CASE WHEN t.owner = $2 THEN '' ELSE t.owner END,
		expires_at = CASE WHEN t.owner = $2 THEN '-infinity' ELSE t.expires_at END
	RETURNING t.name
),
e AS (
` + ended(sendedT, "a", "$3::bigint") + `
	RETURNING 1
),
` + endPlace(swaiters, "$7") + `,
n AS (SELECT pg_notify($4, a.name), ` + spruneF + `($1, $2) FROM a, e)
SELECT (SELECT count(*) FROM n) >= 0 AND coalesce((
	SELECT pg_terminate_backend(o.backend_pid, 5000) FROM o
	WHERE o.owner = $2 AND o.backend_pid <> pg_backend_pid()
		AND EXISTS (SELECT 1 FROM pg_stat_activity WHERE pid = o.backend_pid AND usename = current_user)
		AND ` + lockHeld("o.backend_pid", "$5", "$6") + `), false)`,

		// $1 name: the live grant's owner, token and remaining µs.
		Holder: `SELECT owner, token, greatest(0, (extract(epoch FROM expires_at - clock_timestamp()) * 1000000)::bigint)
FROM ` + leases + ` WHERE name = $1 AND owner <> '' AND expires_at > clock_timestamp()`,

		// $1 name, $2 and $3 the lock key's high and low 32 bits: the last
		// grant's owner, token and remaining µs, while its expiry has not
		// passed or the session it was granted to still holds the lock.
		SessionHolder: `SELECT t.owner, t.token, ` + left("t.expires_at", "clock_timestamp()") + `
FROM ` + sessions + ` t
WHERE t.name = $1 AND t.owner <> '' AND (t.expires_at > clock_timestamp() OR ` + lockHeld("t.backend_pid", "$2", "$3") + `)`,

		Sessions: sessions,

		// $1 and $2 the tables' quoted names (Leases and Ended, or
		// Sessions and SessionEnded): fails with 42P01 when one is
		// missing, else says whether the user may read and write both.
		// Reads nothing, changes nothing.
		Check:        `SELECT has_table_privilege($1, 'SELECT, INSERT, UPDATE, DELETE') AND has_table_privilege($2, 'SELECT, INSERT, UPDATE, DELETE')`,
		Leases:       leases,
		Ended:        endedT,
		SessionEnded: sendedT,
	}
}
