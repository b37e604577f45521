-- The ledger of once-per-period jobs (lease.Manager.RunOnce, package
-- sqlguard's Ledger): one row per run of a job, keyed by the job (the
-- lease name RunOnce runs under, or an explicit job name) and the run key
-- (a period such as "2026-12-01"). Keying by the job keeps jobs apart: two
-- jobs that share this table and a run key each run once, and each run's
-- row has a lock_version of its own, so that tokens of two lease names are
-- never compared. done_at is NULL until the run is recorded done;
-- lock_version is written by the guard and by nothing else.

-- +goose Up
CREATE TABLE fencekit_job_runs (
    job          text        NOT NULL,
    run_key      text        NOT NULL,
    done_at      timestamptz,
    lock_version bigint      NOT NULL DEFAULT 0 CHECK (lock_version >= 0),
    PRIMARY KEY (job, run_key)
);

-- +goose Down
DROP TABLE fencekit_job_runs;
