-- The ledger of once-per-period jobs on SQLite (lease.Manager.RunOnce,
-- package dbguard's Ledger): one row per run of a job, keyed by the job
-- (the lease name RunOnce runs under, or an explicit job name) and the run
-- key (a period such as "2026-12-01"). Keying by the job keeps jobs apart:
-- two jobs that share this table and a run key each run once, and each
-- run's row has a lock_version of its own, so that tokens of two lease
-- names are never compared. done_at is NULL until the run is recorded
-- done; lock_version is written by the guard and by nothing else, and
-- holds integers only.

-- +goose Up
CREATE TABLE IF NOT EXISTS fencekit_job_runs (
    job          TEXT    NOT NULL,
    run_key      TEXT    NOT NULL,
    done_at      TEXT,
    lock_version INTEGER NOT NULL DEFAULT 0 CHECK (typeof(lock_version) = 'integer' AND lock_version >= 0),
    PRIMARY KEY (job, run_key)
);

-- +goose Down
DROP TABLE fencekit_job_runs;
