-- Global rate limits and per-key concurrency (docs/how-to/limits.md).
--
-- akadze.limits: one row per rate limit, of a queue or of a task: at most `rate` starts in
-- any window of `period`. The claim locks the row (FOR UPDATE) while it counts and records
-- starts, so claims under one limit take turns and claims of anything else never wait.
CREATE TABLE IF NOT EXISTS akadze.limits (
    kind text NOT NULL CHECK (kind IN ('queue', 'task')),
    name text NOT NULL,
    rate integer NOT NULL CHECK (rate >= 1),
    period interval NOT NULL CHECK (period > interval '0'),
    PRIMARY KEY (kind, name)
);
COMMENT ON TABLE akadze.limits IS
    'Rate limits: at most rate starts in any window of period, per queue or per task';

-- The ledger of starts under each limit: one row per claim (n starts at one instant), taken
-- with the database clock under the limit's row lock, so the instants are in lock order.
-- Rows older than the period are deleted by the next claim under the same limit.
CREATE TABLE IF NOT EXISTS akadze.limit_starts (
    kind text NOT NULL,
    name text NOT NULL,
    started_at timestamptz NOT NULL,
    n integer NOT NULL,
    FOREIGN KEY (kind, name) REFERENCES akadze.limits ON DELETE CASCADE
);
CREATE INDEX IF NOT EXISTS limit_starts_idx ON akadze.limit_starts (kind, name, started_at);

-- Per-key concurrency rides in the job's meta ("concurrency_key", "max_concurrency"): every
-- insert path already carries meta, and a column would have to be threaded through each.
-- The keyed jobs waiting in a queue (the plain claim leaves them to the limited one) ...
CREATE INDEX IF NOT EXISTS jobs_keyed_claim_idx ON akadze.jobs (queue, priority, scheduled_at, id)
    WHERE state = 'queued' AND meta ? 'concurrency_key';
-- ... and the running jobs of each key, counted by the claim: from the jobs themselves, so
-- a rescue or a graceful stop's hand-back frees the slot with nothing else to update.
CREATE INDEX IF NOT EXISTS jobs_keyed_running_idx ON akadze.jobs ((meta ->> 'concurrency_key'))
    WHERE state = 'running' AND meta ? 'concurrency_key';
