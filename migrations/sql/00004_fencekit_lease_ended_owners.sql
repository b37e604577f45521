-- Leases remember the owners they ended, and session mode's
-- leases get an expiry at the store (package lease/pglease).
--
-- ended: on each lease row, the owners that a release or an abandon ended
-- recently, as a JSON object {owner: until}, until in microseconds since
-- the Unix epoch by the server's clock. An acquire by an owner listed with
-- an until still ahead is refused: an acquire request that reaches the
-- server after its sender stopped waiting for it (even after a retry's
-- grant was used and released) must not grant the name to an owner nobody
-- holds. The list is on the row itself, not in a table of its own, so that
-- an acquire reads it after it has locked the row (READ COMMITTED re-reads
-- a row updated meanwhile; a subquery on another table would read the
-- statement's older snapshot). Entries past their until are dropped
-- whenever the row is written.
--
-- expires_at (session mode): the advisory lock is freed the moment the
-- server ends a session, while its holder, who may hear nothing of it,
-- counts its lease valid until its local deadline. Each grant and each
-- renewal sets expires_at to the server's clock + TTL, and a new holder
-- is granted the name only once it has passed (or the holder released
-- it), as in table mode. Existing rows get -infinity: nothing to wait out.
--
-- Adding a column with a constant default rewrites no rows (PostgreSQL 11
-- and later).

-- +goose Up
ALTER TABLE fencekit_leases ADD COLUMN ended jsonb NOT NULL DEFAULT '{}';
ALTER TABLE fencekit_session_leases ADD COLUMN expires_at timestamptz NOT NULL DEFAULT '-infinity';
ALTER TABLE fencekit_session_leases ADD COLUMN ended jsonb NOT NULL DEFAULT '{}';

-- +goose Down
ALTER TABLE fencekit_session_leases DROP COLUMN ended;
ALTER TABLE fencekit_session_leases DROP COLUMN expires_at;
ALTER TABLE fencekit_leases DROP COLUMN ended;
