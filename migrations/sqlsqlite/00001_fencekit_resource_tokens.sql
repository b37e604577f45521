-- fencekit's own table for resource-level fencing on SQLite (package
-- dbguard). Tokens are SQLite integers (signed 64-bit): the guard refuses
-- tokens above 2^63-1 before writing. The CHECK keeps anything but a
-- positive integer out (SQLite would store a text or real value as it
-- came otherwise).

-- +goose Up
CREATE TABLE IF NOT EXISTS fencekit_resource_tokens (
    resource   TEXT    NOT NULL PRIMARY KEY,
    token      INTEGER NOT NULL CHECK (typeof(token) = 'integer' AND token > 0),
    updated_at TEXT    NOT NULL DEFAULT (strftime('%Y-%m-%dT%H:%M:%fZ', 'now'))
);

-- +goose Down
DROP TABLE fencekit_resource_tokens;
