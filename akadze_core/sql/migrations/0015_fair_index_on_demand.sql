-- The fair-claim index (0001) is built by fair workers only (akadze_core/fair_index.py).
-- Every job inserted queued paid for its entry there, about a fifth of a bulk insert's
-- time (an enqueue_many of 10,000: 66 -> 45 ms without it), while only workers started
-- with fair=True read it, and few are. A fair worker builds it (CONCURRENTLY) at start when
-- it is missing; until then, or on a role that may not build it, fair claims still claim
-- correctly, reading the queue's jobs without it.
DROP INDEX IF EXISTS akadze.jobs_fair_claim_idx;
