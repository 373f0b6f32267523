-- Workflows: a job may wait for others (chains, fan-in) and name jobs to insert when it
-- fails (errbacks). Everything that follows from an outcome is written by akadze.settle in
-- the transaction that writes the outcome, so it is never lost and never done twice.

ALTER TABLE akadze.jobs DROP CONSTRAINT jobs_state_check;
-- waiting: inserted, never claimed until every upstream succeeded.
ALTER TABLE akadze.jobs ADD CONSTRAINT jobs_state_check
    CHECK (state IN ('waiting', 'queued', 'running', 'succeeded', 'failed', 'cancelled'));

ALTER TABLE akadze.jobs
    -- The jobs this one waits on, in order (the order of upstream_results); for an
    -- errback job, the job whose failure inserted it.
    ADD COLUMN upstreams bigint[],
    -- Upstreams not yet succeeded; the job is released at 0.
    ADD COLUMN waiting_for integer,
    -- The waiting jobs to settle when this one finishes.
    ADD COLUMN dependents bigint[],
    -- How the job takes its upstreams: {"pass": "one"|"list", "result_arg": name,
    -- "on_upstream_failure": "fail", "delay": seconds after release}; all keys optional.
    ADD COLUMN flow jsonb,
    -- Jobs to insert when this one ends failed: a JSON array of
    -- {task, queue, args, priority, max_attempts, meta, flow, delay, expires_at}.
    ADD COLUMN on_failure jsonb,
    -- Written at release when flow.pass is set: the single upstream's result ("one") or
    -- the list of results in upstreams order ("list"); an errback's failed job's error.
    ADD COLUMN upstream_results jsonb;

-- akadze.refuse and akadze.settle, first created here, live in sql/functions.sql, which
-- `akadze migrate` re-applies after the versioned migrations whenever it changes.
