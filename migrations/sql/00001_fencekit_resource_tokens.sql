-- fencekit's own tables for resource-level fencing (package sqlguard).
-- Created in the connection's current schema (the first schema of its
-- search_path that exists).

-- +goose Up
CREATE TABLE fencekit_resource_tokens (
    resource   text        PRIMARY KEY,
    token      bigint      NOT NULL CHECK (token > 0),
    updated_at timestamptz NOT NULL DEFAULT now()
);

-- fencekit_advance_token advances the token of one resource, or fails.
--
-- It stores p_token when it is >= the stored token (or when the resource has
-- none yet) and returns it. Otherwise it raises SQLSTATE FK409 with the
-- stored token in DETAIL. Either way the resource's row stays locked by the
-- calling transaction until it ends, so the stored token read after a
-- rejection is exact: nobody can change it in between. The function is
-- created with the table's schema written into its body, so it never depends
-- on the caller's search_path.
-- +goose StatementBegin
DO $migration$
BEGIN
    EXECUTE format($fn$
        CREATE FUNCTION %1$I.fencekit_advance_token(p_resource text, p_token bigint)
        RETURNS bigint
        LANGUAGE plpgsql
        VOLATILE
        AS $body$
        DECLARE
            current_token bigint;
        BEGIN
            INSERT INTO %1$I.fencekit_resource_tokens AS r (resource, token)
            VALUES (p_resource, p_token)
            ON CONFLICT (resource) DO UPDATE
                SET token = EXCLUDED.token, updated_at = now()
                WHERE r.token <= EXCLUDED.token;
            IF FOUND THEN
                RETURN p_token;
            END IF;
            -- ON CONFLICT DO UPDATE locked the row even though its WHERE
            -- failed; under READ COMMITTED this statement takes a new
            -- snapshot and reads the newest committed token.
            SELECT r.token INTO current_token
            FROM %1$I.fencekit_resource_tokens AS r
            WHERE r.resource = p_resource;
            RAISE EXCEPTION USING
                ERRCODE = 'FK409',
                MESSAGE = format('fencekit: stale token for %%s: presented %%s, current %%s',
                                 p_resource, p_token, current_token),
                DETAIL = current_token::text;
        END
        $body$
    $fn$, current_schema());
END
$migration$;
-- +goose StatementEnd

-- +goose Down
DROP FUNCTION fencekit_advance_token(text, bigint);
DROP TABLE fencekit_resource_tokens;
