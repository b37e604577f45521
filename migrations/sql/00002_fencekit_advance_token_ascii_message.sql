-- fencekit_advance_token's rejection names the resource in ASCII only.
--
-- The server sends an error's message in the session's client_encoding. A
-- resource name that encoding cannot represent (an 'Á' under SJIS) made
-- the server replace the rejection, SQLSTATE FK409, with an encoding error
-- (22P05), so the client could no longer tell a stale token. The name is
-- now written with its UTF-8 bytes above 0x7F as octal escapes (bytea's
-- escape format), which every client encoding can carry. DETAIL (the
-- stored token, digits) is unchanged. Otherwise the function is the one of
-- migration 00001, created the same way.

-- +goose Up
-- +goose StatementBegin
DO $migration$
BEGIN
    EXECUTE format($fn$
        CREATE OR REPLACE FUNCTION %1$I.fencekit_advance_token(p_resource text, p_token bigint)
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
                                 encode(convert_to(p_resource, 'UTF8'), 'escape'), p_token, current_token),
                DETAIL = current_token::text;
        END
        $body$
    $fn$, current_schema());
END
$migration$;
-- +goose StatementEnd

-- +goose Down
-- Nothing to undo: the function keeps the ASCII message, which changes no
-- behaviour of version 00001 but the rejection's encoding, and 00001's Down
-- drops the function whatever its message.
