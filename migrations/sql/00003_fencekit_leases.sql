-- fencekit's own tables for leases in PostgreSQL (package lease/pglease).
-- Created in the connection's current schema (the first schema of its
-- search_path that exists).

-- +goose Up
-- Table mode: one row per lease name, kept after release so that the
-- name's token only grows. A free lease has owner '' and an expiry in the
-- past. Tokens are minted as greatest(token + 1, server clock in µs).
CREATE TABLE fencekit_leases (
    name       text        PRIMARY KEY,
    owner      text        NOT NULL,
    token      bigint      NOT NULL CHECK (token > 0),
    expires_at timestamptz NOT NULL
);

-- Session mode: the lease is a session-level advisory lock; this table
-- holds each name's last token (minted in the statement that takes the
-- lock) and, for operators, who took it and from which server process.
CREATE TABLE fencekit_session_leases (
    name        text        PRIMARY KEY,
    owner       text        NOT NULL,
    token       bigint      NOT NULL CHECK (token > 0),
    backend_pid integer     NOT NULL,
    granted_at  timestamptz NOT NULL
);

-- +goose Down
DROP TABLE fencekit_session_leases;
DROP TABLE fencekit_leases;
