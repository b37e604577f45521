-- The ledger of once-per-period jobs on MySQL and MariaDB
-- (lease.Manager.RunOnce, package dbguard's Ledger): one row per run of a
-- job, keyed by the job (the lease name RunOnce runs under, or an explicit
-- job name) and the run key (a period such as "2026-12-01"). Keying by the
-- job keeps jobs apart: two jobs that share this table and a run key each
-- run once, and each run's row has a lock_version of its own, so that
-- tokens of two lease names are never compared. job and run_key are
-- VARBINARY, so names compare byte for byte (a text column's collation
-- would make "Nightly" and "nightly" one job); job holds a whole lease
-- name (at most 512 bytes). done_at is NULL until the run is recorded
-- done; lock_version is written by the guard and by nothing else.

-- +goose Up
CREATE TABLE IF NOT EXISTS fencekit_job_runs (
    job          VARBINARY(512)  NOT NULL,
    run_key      VARBINARY(512)  NOT NULL,
    done_at      DATETIME(6)     NULL,
    lock_version BIGINT UNSIGNED NOT NULL DEFAULT 0,
    PRIMARY KEY (job, run_key)
) ENGINE = InnoDB;

-- +goose Down
DROP TABLE fencekit_job_runs;
