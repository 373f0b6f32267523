-- Paused queues, for the whole fleet: a row here means no worker claims from that queue
-- (akadze.claim_jobs and claim_jobs_fair probe this table's primary key), whichever worker,
-- started before or after the pause. Jobs already running finish; enqueues still insert.
-- In the database rather than in each worker, so a pause survives restarts and holds for
-- workers that start later.
CREATE TABLE IF NOT EXISTS akadze.queue_pauses (
    queue text PRIMARY KEY,
    paused_at timestamptz NOT NULL DEFAULT now(),
    -- Who paused it, as the caller said (a user, "cli", "dashboard"): for people, not logic.
    paused_by text
);
COMMENT ON TABLE akadze.queue_pauses IS
    'Queues no worker claims from until resumed (akadze queues pause/resume)';
