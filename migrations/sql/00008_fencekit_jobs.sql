-- A job table of one's own, fenced (package sqlguard's JobTable): one row
-- per job. A worker claims a runnable job (available and due, or running
-- with an expired claim) with SELECT ... FOR UPDATE SKIP LOCKED, and the
-- claim mints the attempt's fencing token into lock_version: the larger of
-- the row's token + 1 and the server clock in microseconds. Heartbeats,
-- completion and failure each write only while the row's lock_version is
-- not above the attempt's token, so an attempt whose claim expired and was
-- taken over can neither extend, complete nor fail the job.
--
-- state is 'available', 'running', 'completed' or 'failed'; attempt counts
-- claims; claimed_until is when a running attempt's claim expires (NULL
-- otherwise); lock_version is written by the guard and by nothing else.
-- queue, kind and payload are the application's: the guard reads queue
-- when a claim names one, and never reads kind or payload.

-- +goose Up
CREATE TABLE fencekit_jobs (
    id            bigserial   PRIMARY KEY,
    queue         text        NOT NULL DEFAULT 'default',
    kind          text        NOT NULL,
    payload       jsonb       NOT NULL DEFAULT '{}',
    state         text        NOT NULL DEFAULT 'available'
                  CHECK (state IN ('available', 'running', 'completed', 'failed')),
    attempt       integer     NOT NULL DEFAULT 0 CHECK (attempt >= 0),
    run_at        timestamptz NOT NULL DEFAULT now(),
    claimed_until timestamptz,
    last_error    text,
    finished_at   timestamptz,
    created_at    timestamptz NOT NULL DEFAULT now(),
    lock_version  bigint      NOT NULL DEFAULT 0 CHECK (lock_version >= 0)
);

-- The claim's scan: runnable jobs of a queue, oldest due first.
CREATE INDEX fencekit_jobs_claim ON fencekit_jobs (queue, run_at, id)
    WHERE state IN ('available', 'running');

-- +goose Down
DROP TABLE fencekit_jobs;
