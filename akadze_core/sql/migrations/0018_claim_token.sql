-- The run's fencing token: a random number the claim writes on the row, which every outcome
-- write, meta update and hand-over must name along with run_count. run_count alone repeats
-- after a failover with asynchronous replication: a claim committed on the old primary and
-- lost with it is claimed again on the new primary under the same run_count, so the lost
-- run's late outcome would pass a run_count-only fence. Two claims of one job drawing the
-- same token is a 2^-53 chance. Nullable without a default: adding it rewrites nothing, and
-- rows claimed before this (or by an older worker, which does not write it) hold NULL.
ALTER TABLE akadze.jobs ADD COLUMN IF NOT EXISTS claim_token bigint;
COMMENT ON COLUMN akadze.jobs.claim_token IS
    'Random per claim: with run_count, the fencing token of the run that holds the job';
