-- The dashboard's failed jobs per queue (its overview counts, the jobs list filtered by
-- state failed and a queue, the queue names of its forms). Partial: it holds only failed
-- jobs, so it costs nothing on the claim path (no queued or running row is in it) and one
-- entry per job that fails for good; jobs_finished_idx (state, finished_at) cannot say
-- which queue a failed job is in without reading the row.
CREATE INDEX jobs_failed_queue_idx ON akadze.jobs (queue, id) WHERE state = 'failed';

-- Each worker's slots per queue (in the order of its queues), for the dashboard's workers
-- page; NULL for workers that do not say (older ones).
ALTER TABLE akadze.workers ADD COLUMN slots integer[];
