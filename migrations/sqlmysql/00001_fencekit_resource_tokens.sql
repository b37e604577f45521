-- fencekit's own table for resource-level fencing on MySQL and MariaDB
-- (package dbguard). Created in the connection's current database.
--
-- resource is VARBINARY, so names compare byte for byte (a text column's
-- collation would make "Order/1" and "order/1" one resource); token is
-- BIGINT UNSIGNED, so every fencing token (up to 2^64-1) is stored
-- exactly; advances grows with every accepted advance, so that an accepted
-- advance always changes the row and reports 2 rows affected whether or
-- not the client asked for found rows.

-- +goose Up
CREATE TABLE IF NOT EXISTS fencekit_resource_tokens (
    resource   VARBINARY(1024) NOT NULL PRIMARY KEY,
    token      BIGINT UNSIGNED NOT NULL,
    advances   BIGINT UNSIGNED NOT NULL DEFAULT 0,
    updated_at TIMESTAMP(6) NOT NULL DEFAULT CURRENT_TIMESTAMP(6) ON UPDATE CURRENT_TIMESTAMP(6),
    CONSTRAINT fencekit_token_positive CHECK (token > 0)
) ENGINE = InnoDB;

-- +goose Down
DROP TABLE fencekit_resource_tokens;
