-- akadze schema, version 1: jobs, workers and the indexes that match the claim query.

CREATE TABLE akadze.jobs (
    id               bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    task             text        NOT NULL,
    queue            text        NOT NULL,
    args             jsonb       NOT NULL DEFAULT '{}',
    state            text        NOT NULL DEFAULT 'queued'
        CHECK (state IN ('queued', 'running', 'succeeded', 'failed', 'cancelled')),
    priority         integer     NOT NULL DEFAULT 0,
    scheduled_at     timestamptz NOT NULL DEFAULT now(),
    -- Attempts spent so far; a claim spends one, Snooze and a graceful stop give it back.
    attempt          integer     NOT NULL DEFAULT 0,
    max_attempts     integer     NOT NULL DEFAULT 3 CHECK (max_attempts >= 1),
    -- Incremented by every claim: the fencing token of a run.
    run_count        integer     NOT NULL DEFAULT 0,
    errors           jsonb       NOT NULL DEFAULT '[]',
    result           jsonb,
    -- Free-form data owned by integrations (the Celery facade keeps headers and custom states).
    meta             jsonb       NOT NULL DEFAULT '{}',
    expires_at       timestamptz,
    cancel_requested boolean     NOT NULL DEFAULT false,
    unique_key       text,
    worker_id        bigint,
    created_at       timestamptz NOT NULL DEFAULT now(),
    started_at       timestamptz,
    finished_at      timestamptz
) WITH (fillfactor = 80,
        autovacuum_vacuum_scale_factor = 0.02,
        autovacuum_analyze_scale_factor = 0.02);

-- The claim query reads exactly this order within a queue.
CREATE INDEX jobs_claim_idx ON akadze.jobs (queue, priority, scheduled_at, id)
    WHERE state = 'queued';
-- Fair claims walk the distinct task names of a queue.
CREATE INDEX jobs_fair_claim_idx ON akadze.jobs (queue, task, priority, scheduled_at, id)
    WHERE state = 'queued';
-- Rescue finds the running jobs of dead workers.
CREATE INDEX jobs_running_idx ON akadze.jobs (worker_id) WHERE state = 'running';
-- Pruning deletes the oldest finished jobs first.
CREATE INDEX jobs_finished_idx ON akadze.jobs (state, finished_at)
    WHERE state IN ('succeeded', 'failed', 'cancelled');
-- At most one active job per unique key.
CREATE UNIQUE INDEX jobs_unique_key_idx ON akadze.jobs (unique_key)
    WHERE unique_key IS NOT NULL AND state IN ('queued', 'running');

CREATE TABLE akadze.workers (
    id            bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    name          text        NOT NULL,
    hostname      text        NOT NULL,
    pid           integer     NOT NULL,
    queues        text[]      NOT NULL,
    -- Each worker carries its own TTL, so workers with different settings judge each other fairly.
    heartbeat_ttl interval    NOT NULL,
    started_at    timestamptz NOT NULL DEFAULT now(),
    heartbeat_at  timestamptz NOT NULL DEFAULT now()
);
