// Package pgleasesql holds the SQL of package lease/pglease, so that the
// benchmarks can send the very same statements directly (their raw floor).
package pgleasesql

import "github.com/fencekit/fencekit/internal/pgident"

// Names of the tables pglease uses, created by package migrations.
const (
	LeaseTable        = "fencekit_leases"
	SessionLeaseTable = "fencekit_session_leases"
	// The lines of waiters (driver.Request.Queue) of each mode.
	WaiterTable        = "fencekit_lease_waiters"
	SessionWaiterTable = "fencekit_session_lease_waiters"
)

// Statements are the SQL package pglease sends, with the table names quoted
// (and qualified when Options.Schema is set). Values are always bound
// parameters.
type Statements struct {
	Acquire, Renew, RenewBatch, Release, Abandon, Holder                                  string
	SessionAcquire, SessionRenew, SessionRelease, SessionAbandon, SessionHolder, Sessions string
	// The acquires of an owner that waits in line (driver.Request.Queue).
	AcquireQueued, SessionAcquireQueued string
	// Check, and the tables' quoted names that it takes.
	Check, Leases string
}

// clock reads the server's clock once, as now (timestamptz) and us
// (microseconds since the Unix epoch), in a CTE named c.
const clock = `c AS (SELECT x.t AS now, (extract(epoch FROM x.t) * 1000000)::bigint AS us FROM (SELECT clock_timestamp() AS t) x)`

// pruned is the row alias's ended owners without those past their until
// (us: the statement's clock in µs). Ended owners are kept on the lease
// row itself so that a statement reads them after it has locked the row.
func pruned(alias, us string) string {
	return `coalesce((SELECT jsonb_object_agg(e.key, e.value) FROM jsonb_each(` + alias + `.ended) e WHERE (e.value)::bigint > ` + us + `), '{}'::jsonb)`
}

// left is the time from now until expiry in whole µs, 0 if it has passed
// (an expiry of -infinity, a free row, included).
func left(expiry, now string) string {
	return `CASE WHEN ` + expiry + ` > ` + now + ` THEN (extract(epoch FROM ` + expiry + ` - ` + now + `) * 1000000)::bigint ELSE 0 END`
}

// isEnded is whether owner is one of the row alias's ended owners whose
// until is still ahead of us.
func isEnded(alias, owner, us string) string {
	return `coalesce((` + alias + `.ended ->> ` + owner + `)::bigint > ` + us + `, false)`
}

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
	// ended, and returns the token.
	tableGrant := `	ON CONFLICT (name) DO UPDATE SET
		owner = EXCLUDED.owner,
		token = CASE WHEN l.owner = EXCLUDED.owner AND l.expires_at > EXCLUDED.expires_at - $3::bigint * interval '1 microsecond'
			THEN l.token
			ELSE greatest(l.token + 1, EXCLUDED.token) END,
		expires_at = EXCLUDED.expires_at,
		ended = ` + pruned("l", "EXCLUDED.token") + `
	WHERE (l.owner = EXCLUDED.owner OR l.expires_at <= EXCLUDED.expires_at - $3::bigint * interval '1 microsecond')
		AND NOT ` + isEnded("l", "EXCLUDED.owner", "EXCLUDED.token") + `
	RETURNING l.token
)`
	// The grant of a session-mode acquire, queued or not, once k says
	// whether the advisory lock was taken: t records the grant, s sets
	// the pinned session's idle timeout, u gives the lock back when the
	// row refused the grant.
	sessionGrant := `t AS (
	INSERT INTO ` + sessions + ` AS t (name, owner, token, backend_pid, granted_at, expires_at)
	SELECT $1, $2, c.us, pg_backend_pid(), c.now, c.now + $7::bigint * interval '1 microsecond'
	FROM k, c WHERE k.ok
	ON CONFLICT (name) DO UPDATE SET
		owner = EXCLUDED.owner,
		token = greatest(t.token + 1, EXCLUDED.token),
		backend_pid = EXCLUDED.backend_pid,
		granted_at = EXCLUDED.granted_at,
		expires_at = EXCLUDED.expires_at,
		ended = ` + pruned("t", "EXCLUDED.token") + `
	WHERE t.expires_at <= EXCLUDED.granted_at AND NOT ` + isEnded("t", "EXCLUDED.owner", "EXCLUDED.token") + `
	RETURNING t.token
),
s AS (
	SELECT current_setting('idle_session_timeout') AS was, set_config('idle_session_timeout', $4::text, false) AS now
	FROM t
),
u AS (
	SELECT pg_advisory_unlock($3::bigint) AS unlocked FROM k WHERE k.ok AND NOT EXISTS (SELECT 1 FROM t)
)`
	return Statements{
		// $1 name, $2 owner, $3 TTL in µs. The server's clock is read once
		// (clock_timestamp(), in the SELECT that feeds the INSERT, so after
		// the statement has its table locks: a TRUNCATE that was waited for
		// is over). That instant is "now" for every comparison, the expiry
		// is now + TTL, and the token is greatest(stored token + 1, now in
		// µs since the epoch). The stored token and the ended owners are
		// read in DO UPDATE, after the row lock, so they are the newest
		// committed ones (READ COMMITTED re-reads a row updated
		// meanwhile); a refused statement writes nothing. An owner ended
		// by Release or Abandon is refused. When refused, the second
		// branch reads the holder's expiry and whether the owner was
		// ended (from the statement's snapshot: hints).
		Acquire: `WITH ` + clock + `,
g AS (
	INSERT INTO ` + leases + ` AS l (name, owner, token, expires_at)
	SELECT $1, $2, c.us, c.now + $3::bigint * interval '1 microsecond' FROM c
` + tableGrant + `
SELECT true, g.token, 0::bigint, false FROM g
UNION ALL
SELECT false, 0::bigint, ` + left("l.expires_at", "c.now") + `, ` + isEnded("l", "$2", "c.us") + `
FROM ` + leases + ` l, c
WHERE l.name = $1 AND NOT EXISTS (SELECT 1 FROM g)`,

		// $1 name, $2 owner, $3 token, $4 TTL in µs.
		Renew: `UPDATE ` + leases + ` SET expires_at = clock_timestamp() + $4::bigint * interval '1 microsecond'
WHERE name = $1 AND owner = $2 AND token = $3 AND expires_at > clock_timestamp()`,

		// $1 names, $2 owners, $3 tokens, $4 TTLs in µs: one UPDATE for all.
		RenewBatch: `UPDATE ` + leases + ` AS l SET expires_at = clock_timestamp() + b.ttl * interval '1 microsecond'
FROM unnest($1::text[], $2::text[], $3::bigint[], $4::bigint[]) AS b(name, owner, token, ttl)
WHERE l.name = b.name AND l.owner = b.owner AND l.token = b.token AND l.expires_at > clock_timestamp()
RETURNING l.name, l.owner, l.token`,

		// $1 name, $2 owner, $3 token, $4 channel, $5 how long to remember
		// the owner as ended, in µs. The row is locked first (o, FOR
		// UPDATE: the newest committed version), then updated: if it
		// holds the grant, it is marked free (it stays: it carries the
		// name's token; a free row has owner '' and an expiry in the
		// past); whatever it holds, the owner is recorded as ended.
		// Returns whether this statement released the grant and whether
		// the owner had been ended before (a retried release); no row
		// when the name has no row (data loss). NOTIFY only when
		// something was released.
		Release: `WITH ` + clock + `,
o AS (SELECT owner, token, expires_at, ended FROM ` + leases + ` WHERE name = $1 FOR UPDATE),
r AS (
	UPDATE ` + leases + ` AS l SET
		owner = CASE WHEN l.owner = $2 AND l.token = $3 AND l.expires_at > c.now THEN '' ELSE l.owner END,
		expires_at = CASE WHEN l.owner = $2 AND l.token = $3 AND l.expires_at > c.now THEN '-infinity' ELSE l.expires_at END,
		ended = ` + pruned("l", "c.us") + ` || jsonb_build_object($2::text, c.us + $5::bigint)
	FROM o, c
	WHERE l.name = $1
	RETURNING l.name, o.owner = $2 AND o.token = $3 AND o.expires_at > c.now AS released, ` + isEnded("o", "$2", "c.us") + ` AS already
)
SELECT r.released, r.already, CASE WHEN r.released THEN pg_notify($4, r.name) END IS NULL FROM r`,

		// $1 name, $2 owner, $3 how long to remember the owner as ended,
		// in µs, $4 channel. Ends the owner's grant if it holds one (any
		// token) and records it as ended; a name without a row gets a free
		// one (its token the clock in µs, which the next grant exceeds),
		// so that the record exists for a request still on its way.
		// Announces a release in any case (a waiter woken for nothing
		// tries again). $5 whether the request was queued: the owner's
		// place in line is ended (q, qe: see endPlace).
		Abandon: `WITH ` + clock + `,
a AS (
	INSERT INTO ` + leases + ` AS l (name, owner, token, expires_at, ended)
	SELECT $1, '', c.us, '-infinity', jsonb_build_object($2::text, c.us + $3::bigint) FROM c
	ON CONFLICT (name) DO UPDATE SET
		owner = CASE WHEN l.owner = $2 THEN '' ELSE l.owner END,
		expires_at = CASE WHEN l.owner = $2 THEN '-infinity' ELSE l.expires_at END,
		ended = ` + pruned("l", "EXCLUDED.token") + ` || EXCLUDED.ended
	RETURNING l.name
),
` + endPlace(waiters, "$5") + `
SELECT count(*) FROM (SELECT pg_notify($4, a.name) FROM a) n`,

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
	SELECT l.owner, ` + left("l.expires_at", "c.now") + ` AS left_us, ` + isEnded("l", "$2", "c.us") + ` AS ended
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
		// token as table mode does; when not, it unlocks what it took
		// (u). Returns whether it granted, the token, the server process,
		// the timeout it replaced, the row's time left in µs (a hint), and
		// whether the owner was ended (a hint).
		SessionAcquire: `WITH k AS (
	SELECT CASE WHEN $5::bool OR pg_backend_pid() = $6::int THEN pg_try_advisory_lock($3::bigint) ELSE false END AS ok
),
` + clock + `,
` + sessionGrant + `,
h AS (
	SELECT ` + left("r.expires_at", "c.now") + ` AS left_us, ` + isEnded("r", "$2", "c.us") + ` AS ended
	FROM ` + sessions + ` r, c WHERE r.name = $1
)
SELECT EXISTS (SELECT 1 FROM t), coalesce((SELECT token FROM t), 0), pg_backend_pid(), coalesce((SELECT was FROM s), ''),
	coalesce((SELECT unlocked FROM u), k.ok = EXISTS (SELECT 1 FROM t)),
	coalesce((SELECT left_us FROM h), 0), coalesce((SELECT ended FROM h), false)
FROM k`,

		// SessionAcquire's parameters: SessionAcquire for an owner that
		// waits in line (driver.Request.Queue). It tries the lock (k) only
		// when no live waiter is ahead of the owner (a, from the
		// statement's snapshot) and the owner was not ended, then
		// proceeds as SessionAcquire; a grant deletes the owner's place, a
		// refusal of an owner not ended puts it in line or keeps its
		// place for the TTL (d, p), and commits without waiting for the
		// WAL flush. Places that lapsed are deleted. Returns
		// SessionAcquire's columns, then how many live waiters are ahead
		// and the time left of the first one's place in µs.
		SessionAcquireQueued: `WITH ` + clock + `,
h AS (
	SELECT ` + left("r.expires_at", "c.now") + ` AS left_us, ` + isEnded("r", "$2", "c.us") + ` AS ended
	FROM ` + sessions + ` r, c WHERE r.name = $1
),
` + line(swaiters) + `,
v AS (SELECT $5::bool OR pg_backend_pid() = $6::int AS direct),
k AS (
	SELECT CASE WHEN v.direct AND a.ahead = 0 AND NOT coalesce((SELECT ended FROM h), false)
		THEN pg_try_advisory_lock($3::bigint) ELSE false END AS ok
	FROM v, a
),
` + sessionGrant + `,
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
		// names the grant, records the owner as ended (o, r: as table
		// mode's Release), unlocks, restores the timeout, announces.
		SessionRelease: `WITH ` + clock + `,
o AS (SELECT owner, token FROM ` + sessions + ` WHERE name = $1 FOR UPDATE),
r AS (
	UPDATE ` + sessions + ` AS l SET
		owner = CASE WHEN l.owner = $2 AND l.token = $3 THEN '' ELSE l.owner END,
		expires_at = CASE WHEN l.owner = $2 AND l.token = $3 THEN '-infinity' ELSE l.expires_at END,
		ended = ` + pruned("l", "c.us") + ` || jsonb_build_object($2::text, c.us + $8::bigint)
	FROM o, c
	WHERE l.name = $1
	RETURNING o.owner = $2 AND o.token = $3 AS named
),
u AS (
	SELECT coalesce((SELECT named FROM r), false) AND pg_backend_pid() = $4::int AS named, pg_advisory_unlock($5::bigint) AS unlocked
)
SELECT u.named, u.unlocked, set_config('idle_session_timeout', $6::text, false),
	CASE WHEN u.named AND u.unlocked THEN pg_notify($7, $1)::text END
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
	INSERT INTO ` + sessions + ` AS t (name, owner, token, backend_pid, granted_at, expires_at, ended)
	SELECT $1, '', c.us, 0, c.now, '-infinity', jsonb_build_object($2::text, c.us + $3::bigint) FROM c
	WHERE (SELECT count(*) FROM o) >= 0
	ON CONFLICT (name) DO UPDATE SET
		owner = CASE WHEN t.owner = $2 THEN '' ELSE t.owner END,
		expires_at = CASE WHEN t.owner = $2 THEN '-infinity' ELSE t.expires_at END,
		ended = ` + pruned("t", "EXCLUDED.token") + ` || EXCLUDED.ended
	RETURNING t.name
),
` + endPlace(swaiters, "$7") + `,
n AS (SELECT pg_notify($4, a.name) FROM a)
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

		// $1 the table's quoted name (Leases or Sessions): fails with
		// 42P01 when the table is missing, else says whether the user may
		// read and write it. Reads nothing, changes nothing.
		Check:  `SELECT has_table_privilege($1, 'SELECT, INSERT, UPDATE, DELETE')`,
		Leases: leases,
	}
}
