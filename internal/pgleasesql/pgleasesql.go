// Package pgleasesql holds the SQL of package lease/pglease, so that the
// benchmarks can send the very same statements directly (their raw floor).
package pgleasesql

import "github.com/jackc/pgx/v5"

// Names of the tables pglease uses, created by package migrations.
const (
	LeaseTable        = "fencekit_leases"
	SessionLeaseTable = "fencekit_session_leases"
)

// Statements are the SQL package pglease sends, with the table names quoted
// (and qualified when Options.Schema is set). Values are always bound
// parameters.
type Statements struct {
	Acquire, Renew, RenewBatch, Release, Holder                           string
	SessionAcquire, SessionCheck, SessionRelease, SessionHolder, Sessions string
}

// New returns the statements for the tables in schema ("" for the
// search_path).
func New(schema string) Statements {
	ident := func(name string) string {
		if schema == "" {
			return pgx.Identifier{name}.Sanitize()
		}
		return pgx.Identifier{schema, name}.Sanitize()
	}
	leases, sessions := ident(LeaseTable), ident(SessionLeaseTable)
	return Statements{
		// $1 name, $2 owner, $3 TTL in µs. The server's clock is read once
		// (clock_timestamp(), in the SELECT that feeds the INSERT, so after
		// the statement has its table locks: a TRUNCATE that was waited for
		// is over). That instant is "now" for every comparison, the expiry
		// is now + TTL, and the token is greatest(stored token + 1, now in
		// µs since the epoch). The stored token is read in DO UPDATE,
		// after the row lock, so it is the newest committed one (READ
		// COMMITTED re-reads a row updated meanwhile); a refused statement
		// writes nothing. When refused, the second branch reads the
		// holder's expiry (from the statement's snapshot: a hint).
		Acquire: `WITH c AS (SELECT clock_timestamp() AS now),
g AS (
	INSERT INTO ` + leases + ` AS l (name, owner, token, expires_at)
	SELECT $1, $2, (extract(epoch FROM c.now) * 1000000)::bigint, c.now + $3::bigint * interval '1 microsecond' FROM c
	ON CONFLICT (name) DO UPDATE SET
		owner = EXCLUDED.owner,
		token = CASE WHEN l.owner = EXCLUDED.owner AND l.expires_at > EXCLUDED.expires_at - $3::bigint * interval '1 microsecond'
			THEN l.token
			ELSE greatest(l.token + 1, EXCLUDED.token) END,
		expires_at = EXCLUDED.expires_at
	WHERE l.owner = EXCLUDED.owner OR l.expires_at <= EXCLUDED.expires_at - $3::bigint * interval '1 microsecond'
	RETURNING l.token
)
SELECT true, g.token, 0::bigint FROM g
UNION ALL
SELECT false, 0::bigint, greatest(0, (extract(epoch FROM l.expires_at - c.now) * 1000000)::bigint)
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

		// $1 name, $2 owner, $3 token, $4 channel. The row stays (it
		// carries the name's token); a free row has owner '' and an expiry
		// in the past. NOTIFY only when something was released.
		Release: `WITH r AS (
	UPDATE ` + leases + ` SET owner = '', expires_at = '-infinity'
	WHERE name = $1 AND owner = $2 AND token = $3 AND expires_at > clock_timestamp()
	RETURNING name
)
SELECT count(*) FROM (SELECT pg_notify($4, r.name) FROM r) n`,

		// $1 name, $2 owner, $3 lock key, $4 TTL in ms (text), $5 whether
		// a pooler is allowed, $6 the server process the connection
		// announced at connect. Unless the statement runs in that process
		// (or a pooler is allowed), it takes nothing: behind a pooler a
		// session lock would stay on a server connection others use.
		// Otherwise it takes the lock without waiting; only if it got it,
		// it sets the session's idle_session_timeout to the TTL (the
		// server ends a session idle for that long, which frees its lock:
		// the lease's expiry) and mints the token as table mode does.
		// Returns whether it got the lock, the token, the server process
		// and the timeout it replaced.
		SessionAcquire: `WITH k AS (
	SELECT CASE WHEN $5::bool OR pg_backend_pid() = $6::int THEN pg_try_advisory_lock($3::bigint) ELSE false END AS ok
),
s AS (
	SELECT current_setting('idle_session_timeout') AS was, set_config('idle_session_timeout', $4::text, false) AS now
	FROM k WHERE k.ok
),
t AS (
	INSERT INTO ` + sessions + ` AS t (name, owner, token, backend_pid, granted_at)
	SELECT $1, $2, (extract(epoch FROM c.now) * 1000000)::bigint, pg_backend_pid(), c.now
	FROM k, (SELECT clock_timestamp() AS now) c WHERE k.ok
	ON CONFLICT (name) DO UPDATE SET
		owner = EXCLUDED.owner,
		token = greatest(t.token + 1, EXCLUDED.token),
		backend_pid = EXCLUDED.backend_pid,
		granted_at = EXCLUDED.granted_at
	RETURNING t.token
)
SELECT k.ok, coalesce((SELECT token FROM t), 0), pg_backend_pid(), coalesce((SELECT was FROM s), '') FROM k`,

		// $1 name, $2 owner, $3 token, $4 server pid, $5 and $6 the lock
		// key's high and low 32 bits (as pg_locks shows a bigint key).
		SessionCheck: `SELECT pg_backend_pid() = $4::int
	AND EXISTS (
		SELECT 1 FROM pg_locks
		WHERE locktype = 'advisory' AND pid = pg_backend_pid() AND granted
			AND database = (SELECT oid FROM pg_database WHERE datname = current_database())
			AND classid = $5::bigint::oid AND objid = $6::bigint::oid AND objsubid = 1)
	AND EXISTS (SELECT 1 FROM ` + sessions + ` WHERE name = $1 AND owner = $2 AND token = $3)`,

		// $1 name, $2 owner, $3 token, $4 server pid, $5 lock key, $6 the
		// idle_session_timeout to restore, $7 channel.
		SessionRelease: `SELECT u.named, u.unlocked, set_config('idle_session_timeout', $6::text, false),
	CASE WHEN u.named AND u.unlocked THEN pg_notify($7, $1)::text END
FROM (
	SELECT pg_backend_pid() = $4::int AND EXISTS (SELECT 1 FROM ` + sessions + ` WHERE name = $1 AND owner = $2 AND token = $3) AS named,
		pg_advisory_unlock($5::bigint) AS unlocked
) u`,

		// $1 name: the live grant's owner, token and remaining µs.
		Holder: `SELECT owner, token, greatest(0, (extract(epoch FROM expires_at - clock_timestamp()) * 1000000)::bigint)
FROM ` + leases + ` WHERE name = $1 AND owner <> '' AND expires_at > clock_timestamp()`,

		// $1 name, $2 and $3 the lock key's high and low 32 bits: the last
		// grant's owner and token, if the session it was granted to still
		// holds the lock.
		SessionHolder: `SELECT t.owner, t.token FROM ` + sessions + ` t
WHERE t.name = $1 AND EXISTS (
	SELECT 1 FROM pg_locks
	WHERE locktype = 'advisory' AND pid = t.backend_pid AND granted
		AND database = (SELECT oid FROM pg_database WHERE datname = current_database())
		AND classid = $2::bigint::oid AND objid = $3::bigint::oid AND objsubid = 1)`,

		Sessions: sessions,
	}
}
