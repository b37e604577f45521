-- Ended owners move from a column of each lease row to a table of their own
-- per mode (package lease/pglease).
--
-- Since 00004 each lease row kept the owners that a release or an abandon
-- ended, as a JSON object that every acquire and release rebuilt: a name
-- that changed hands hundreds of times a second carried thousands of
-- entries, and each statement cost time in proportion. Now each ended
-- owner is a row of fencekit_lease_ended_owners (table mode) or
-- fencekit_session_lease_ended_owners (session mode), keyed by the lease
-- name and the owner: ended_at is when the owner was ended, until when an
-- acquire by it stops being refused (the server's clock at the end +
-- driver.EndedOwnerTTL), ends how many releases and abandons recorded it
-- since ended_at (more than one: a retried request, answered as the first
-- one was). Each statement reads or writes one of them by its key; an
-- abandon, and one release in 16, delete the name's rows whose until has
-- passed (fencekit_lease_prune_ended, fencekit_session_lease_prune_ended),
-- so that a name keeps about as many rows as owners it ended within
-- EndedOwnerTTL, whatever its churn.
--
-- An acquire must read the ended owners after it has locked the lease row
-- (READ COMMITTED re-reads the locked row, but a subquery on another table
-- reads the statement's snapshot, which predates a release committed while
-- the acquire waited for the row). So it calls fencekit_lease_owner_ended
-- (fencekit_session_lease_owner_ended) from the lease row's ON CONFLICT
-- condition, which is evaluated after the lock: a VOLATILE function takes
-- a new snapshot for its query, which sees every release that committed
-- before the lock was granted. fencekit_lease_refusal
-- (fencekit_session_lease_refusal) gives a refused acquire its hint: -1
-- for an ended owner, else the row's time left in microseconds. Each
-- function is created with its tables' schema written into its body, so it
-- never depends on the caller's search_path.
--
-- Entries of the old columns still ahead of their until are copied over,
-- and the columns are dropped (Down puts them back, with the live rows).

-- +goose Up
CREATE TABLE fencekit_lease_ended_owners (
    name     text        NOT NULL,
    owner    text        NOT NULL,
    ended_at timestamptz NOT NULL,
    until    timestamptz NOT NULL,
    ends     integer     NOT NULL DEFAULT 1,
    PRIMARY KEY (name, owner)
);
CREATE INDEX fencekit_lease_ended_owners_until ON fencekit_lease_ended_owners (name, until);

CREATE TABLE fencekit_session_lease_ended_owners (
    name     text        NOT NULL,
    owner    text        NOT NULL,
    ended_at timestamptz NOT NULL,
    until    timestamptz NOT NULL,
    ends     integer     NOT NULL DEFAULT 1,
    PRIMARY KEY (name, owner)
);
CREATE INDEX fencekit_session_lease_ended_owners_until ON fencekit_session_lease_ended_owners (name, until);

INSERT INTO fencekit_lease_ended_owners (name, owner, ended_at, until)
SELECT l.name, e.key, clock_timestamp(), to_timestamp((e.value)::bigint / 1000000.0)
FROM fencekit_leases l, jsonb_each(l.ended) e
WHERE to_timestamp((e.value)::bigint / 1000000.0) > clock_timestamp();

INSERT INTO fencekit_session_lease_ended_owners (name, owner, ended_at, until)
SELECT l.name, e.key, clock_timestamp(), to_timestamp((e.value)::bigint / 1000000.0)
FROM fencekit_session_leases l, jsonb_each(l.ended) e
WHERE to_timestamp((e.value)::bigint / 1000000.0) > clock_timestamp();

ALTER TABLE fencekit_leases DROP COLUMN ended;
ALTER TABLE fencekit_session_leases DROP COLUMN ended;

-- +goose StatementBegin
DO $migration$
DECLARE
    mode record;
BEGIN
    FOR mode IN SELECT * FROM (VALUES
        ('fencekit_lease_owner_ended', 'fencekit_lease_prune_ended', 'fencekit_lease_refusal',
         'fencekit_lease_ended_owners', 'fencekit_leases'),
        ('fencekit_session_lease_owner_ended', 'fencekit_session_lease_prune_ended', 'fencekit_session_lease_refusal',
         'fencekit_session_lease_ended_owners', 'fencekit_session_leases')
    ) AS m(ended_fn, prune_fn, refusal_fn, tbl, leases)
    LOOP
        EXECUTE format($fn$
            CREATE FUNCTION %1$I.%2$I(p_name text, p_owner text, p_at timestamptz)
            RETURNS boolean
            LANGUAGE plpgsql
            VOLATILE
            AS $body$
            BEGIN
                RETURN coalesce((SELECT e.until > p_at FROM %1$I.%3$I e
                    WHERE e.name = p_name AND e.owner = p_owner), false);
            END
            $body$
        $fn$, current_schema(), mode.ended_fn, mode.tbl);
        EXECUTE format($fn$
            CREATE FUNCTION %1$I.%2$I(p_name text, p_owner text)
            RETURNS integer
            LANGUAGE plpgsql
            VOLATILE
            AS $body$
            DECLARE
                v_now timestamptz := clock_timestamp();
                v_deleted integer;
            BEGIN
                DELETE FROM %1$I.%3$I e
                WHERE e.name = p_name AND e.until <= v_now AND e.owner <> p_owner;
                GET DIAGNOSTICS v_deleted = ROW_COUNT;
                RETURN v_deleted;
            END
            $body$
        $fn$, current_schema(), mode.prune_fn, mode.tbl);
        EXECUTE format($fn$
            CREATE FUNCTION %1$I.%2$I(p_name text, p_owner text)
            RETURNS bigint
            LANGUAGE plpgsql
            VOLATILE
            AS $body$
            DECLARE
                v_now timestamptz := clock_timestamp();
                v_expires timestamptz;
            BEGIN
                IF %1$I.%3$I(p_name, p_owner, v_now) THEN
                    RETURN -1;
                END IF;
                SELECT l.expires_at INTO v_expires FROM %1$I.%4$I l WHERE l.name = p_name;
                RETURN CASE WHEN v_expires > v_now
                    THEN (extract(epoch FROM v_expires - v_now) * 1000000)::bigint ELSE 0 END;
            END
            $body$
        $fn$, current_schema(), mode.refusal_fn, mode.ended_fn, mode.leases);
    END LOOP;
END
$migration$;
-- +goose StatementEnd

-- +goose Down
DROP FUNCTION fencekit_session_lease_refusal(text, text);
DROP FUNCTION fencekit_lease_refusal(text, text);
DROP FUNCTION fencekit_session_lease_prune_ended(text, text);
DROP FUNCTION fencekit_lease_prune_ended(text, text);
DROP FUNCTION fencekit_session_lease_owner_ended(text, text, timestamptz);
DROP FUNCTION fencekit_lease_owner_ended(text, text, timestamptz);
ALTER TABLE fencekit_session_leases ADD COLUMN ended jsonb NOT NULL DEFAULT '{}';
ALTER TABLE fencekit_leases ADD COLUMN ended jsonb NOT NULL DEFAULT '{}';
UPDATE fencekit_leases l SET ended = e.ended
FROM (SELECT name, jsonb_object_agg(owner, (extract(epoch FROM until) * 1000000)::bigint) AS ended
      FROM fencekit_lease_ended_owners WHERE until > clock_timestamp() GROUP BY name) e
WHERE l.name = e.name;
UPDATE fencekit_session_leases l SET ended = e.ended
FROM (SELECT name, jsonb_object_agg(owner, (extract(epoch FROM until) * 1000000)::bigint) AS ended
      FROM fencekit_session_lease_ended_owners WHERE until > clock_timestamp() GROUP BY name) e
WHERE l.name = e.name;
DROP TABLE fencekit_session_lease_ended_owners;
DROP TABLE fencekit_lease_ended_owners;
