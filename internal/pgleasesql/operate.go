package pgleasesql

import "github.com/fencekit/fencekit/internal/pgident"

// Operations are the statements of an operator's capabilities
// (driver.Lister, driver.Revoker) in both modes, with the table names
// quoted (and qualified when a schema is set).
type Operations struct {
	List, Status, Revoke                        string
	SessionNames, SessionWaiters, SessionRevoke string
}

// NewOperations returns the operator's statements for the tables in schema
// ("" for the search_path).
func NewOperations(schema string) Operations {
	ident := func(name string) string {
		if schema == "" {
			return pgident.Quote(name)
		}
		return pgident.Quote(schema, name)
	}
	leases, sessions := ident(LeaseTable), ident(SessionLeaseTable)
	waiters, swaiters := ident(WaiterTable), ident(SessionWaiterTable)
	endedT, sendedT := ident(EndedTable), ident(SessionEndedTable)
	// The live grants and the live waiters of the names for which cond
	// (on column name) holds: one row per name that has either, with the
	// owner ('' when free), the token, the time left in µs and how many
	// live waiters it has.
	table := func(cond string) string {
		return `WITH c AS (SELECT clock_timestamp() AS now),
h AS (
	SELECT l.name, l.owner, l.token, ` + left("l.expires_at", "c.now") + ` AS left_us
	FROM ` + leases + ` l, c WHERE ` + cond + ` AND l.owner <> '' AND l.expires_at > c.now
),
w AS (
	SELECT w.name, count(*) AS n FROM ` + waiters + ` w, c
	WHERE ` + cond + ` AND w.expires_at > c.now GROUP BY w.name
)
SELECT coalesce(h.name, w.name), coalesce(h.owner, ''), coalesce(h.token, 0::bigint), coalesce(h.left_us, 0::bigint), coalesce(w.n, 0::bigint)
FROM h FULL JOIN w ON h.name = w.name`
	}
	return Operations{
		// $1 the name prefix.
		List: table("starts_with(name, $1)"),
		// $1 the name.
		Status: table("name = $1"),

		// $1 name, $2 owner, $3 token, $4 how long to remember the owner
		// as ended, in µs, $5 channel. Frees the row if it still holds
		// the grant (owner, token, not expired: the newest committed
		// version, re-read after the row lock: r), records the owner as
		// ended (see ended), keeps the token, and announces a release.
		// Returns a row only when it revoked.
		Revoke: `WITH r AS (
	UPDATE ` + leases + ` AS l SET owner = '', expires_at = '-infinity'
	WHERE l.name = $1 AND l.owner = $2 AND l.token = $3 AND l.expires_at > clock_timestamp()
	RETURNING l.name
)
` + ended(endedT, "r", "$4::bigint") + `
RETURNING pg_notify($5, $1) IS NULL`,

		// $1 the name prefix: the names whose row names an owner, or
		// that have live waiters (session mode's Status then tells
		// which are held: that needs each name's lock key).
		SessionNames: `SELECT name FROM ` + sessions + ` WHERE starts_with(name, $1) AND owner <> ''
UNION SELECT name FROM ` + swaiters + ` WHERE starts_with(name, $1) AND expires_at > clock_timestamp()`,
		// $1 the name: how many live waiters it has.
		SessionWaiters: `SELECT count(*) FROM ` + swaiters + ` WHERE name = $1 AND expires_at > clock_timestamp()`,

		// $1 name, $2 owner, $3 token, $4 how long to remember the owner
		// as ended, in µs, $5 channel, $6 and $7 the lock key's high and
		// low 32 bits. If the row names the grant and it is held (its
		// expiry has not passed, or its session still holds the lock, as
		// SessionHolder says), marks it free and records the owner as
		// ended (o, read after its lock, then a and e), announces a release,
		// and ends the session that holds the lock if it runs as the same
		// user (pg_terminate_backend, waiting up to 5 s for it to exit) so
		// that the lock is free when this returns. Returns whether it
		// revoked and whether it ended the holder's session.
		SessionRevoke: `WITH c AS (SELECT x.t AS now, (extract(epoch FROM x.t) * 1000000)::bigint AS us FROM (SELECT clock_timestamp() AS t) x),
o AS (SELECT owner, token, backend_pid, expires_at FROM ` + sessions + ` WHERE name = $1 FOR UPDATE),
a AS (
	UPDATE ` + sessions + ` AS t SET owner = '', expires_at = '-infinity'
	FROM o, c
	WHERE t.name = $1 AND o.owner = $2 AND o.token = $3
		AND (o.expires_at > c.now OR ` + lockHeldBy("o.backend_pid", "$6", "$7") + `)
	RETURNING t.name, o.backend_pid
),
e AS (
` + ended(sendedT, "a", "$4::bigint") + `
	RETURNING 1
),
n AS (SELECT pg_notify($5, a.name) FROM a)
SELECT EXISTS (SELECT 1 FROM a) AND (SELECT count(*) FROM n) >= 0, coalesce((
	SELECT pg_terminate_backend(a.backend_pid, 5000) FROM a
	WHERE a.backend_pid <> pg_backend_pid()
		AND EXISTS (SELECT 1 FROM pg_stat_activity WHERE pid = a.backend_pid AND usename = current_user)
		AND ` + lockHeldBy("a.backend_pid", "$6", "$7") + `), false)`,
	}
}

// lockHeldBy is whether server process pid holds this database's advisory
// lock whose bigint key has high and low 32 bits hi and lo.
func lockHeldBy(pid, hi, lo string) string {
	return `EXISTS (SELECT 1 FROM pg_locks
		WHERE locktype = 'advisory' AND pid = ` + pid + ` AND granted
			AND database = (SELECT oid FROM pg_database WHERE datname = current_database())
			AND classid = ` + hi + `::bigint::oid AND objid = ` + lo + `::bigint::oid AND objsubid = 1)`
}
