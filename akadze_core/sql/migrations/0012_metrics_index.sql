-- Prometheus metrics (akadze_core.metrics) count the jobs of each queue in the states that
-- accumulate without a bound of their own: waiting (workflow steps), failed and cancelled.
-- Index-only from here: (state, queue) of those rows alone. Without it a count of 10,000
-- failed jobs reads 10,000 heap pages spread over the table, each scrape. Only rows entering
-- these states (rare next to claims and successes) pay for its upkeep.
CREATE INDEX jobs_state_queue_idx ON akadze.jobs (state, queue)
    WHERE state IN ('waiting', 'failed', 'cancelled');
