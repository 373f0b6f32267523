-- The web dashboard's reads (akadze_core/dashboard). Only SELECTs: the actions go through
-- the core's own statements (job_requeue, job_request_cancel, job_purge). Every statement
-- here is bounded by an index of the claim path's schema or by an explicit LIMIT, so a
-- page costs the same on a table of a thousand jobs or of millions, and nothing here
-- locks a row a worker could want.

-- name: clock
SELECT now() AS now;

-- name: table_estimate
-- The planner's row estimate: the overview's "about N jobs", never a count(*) of the table.
SELECT greatest(reltuples, 0)::bigint AS jobs FROM pg_class WHERE oid = 'akadze.jobs'::regclass;

-- name: active_counts
-- Per queue: queued (due), scheduled (queued, not due yet) and running. Two partial
-- indexes (jobs_claim_idx, jobs_running_idx), each read up to %(cap)s entries: a backlog
-- larger than that is shown as "cap+".
SELECT queue,
       count(*) FILTER (WHERE state = 'queued' AND scheduled_at <= now()) AS queued,
       count(*) FILTER (WHERE state = 'queued' AND scheduled_at > now()) AS scheduled,
       count(*) FILTER (WHERE state = 'running') AS running
FROM ((SELECT queue, scheduled_at, 'queued' AS state FROM akadze.jobs
       WHERE state = 'queued' LIMIT %(cap)s)
      UNION ALL
      (SELECT queue, scheduled_at, 'running' FROM akadze.jobs
       WHERE state = 'running' LIMIT %(cap)s)) AS active
GROUP BY queue;

-- name: failed_counts
-- Failed jobs per queue (jobs_failed_queue_idx, migration 11: an index-only scan), up to
-- %(cap)s of them.
SELECT queue, count(*) AS failed
FROM (SELECT queue FROM akadze.jobs WHERE state = 'failed' LIMIT %(cap)s) AS failed
GROUP BY queue;

-- name: hour_stats
-- The jobs finished in the last hour (jobs_finished_idx: state, finished_at), the newest
-- %(cap)s of each final state, by grouping set: per queue and state (the overview's
-- table), per queue (its latency columns), per minute and state (throughput chart) and per
-- minute (latency chart). Latency
-- is enqueue-to-start: from when the job was due (its scheduled_at, the enqueue time for
-- a job without a countdown) to its last start.
WITH recent AS (
    (SELECT queue, state, finished_at, started_at, scheduled_at FROM akadze.jobs
     WHERE state = 'succeeded' AND finished_at > now() - interval '1 hour'
     ORDER BY finished_at DESC LIMIT %(cap)s)
    UNION ALL
    (SELECT queue, state, finished_at, started_at, scheduled_at FROM akadze.jobs
     WHERE state = 'failed' AND finished_at > now() - interval '1 hour'
     ORDER BY finished_at DESC LIMIT %(cap)s)
    UNION ALL
    (SELECT queue, state, finished_at, started_at, scheduled_at FROM akadze.jobs
     WHERE state = 'cancelled' AND finished_at > now() - interval '1 hour'
     ORDER BY finished_at DESC LIMIT %(cap)s)
), timed AS (
    SELECT queue, state,
           floor(extract(epoch FROM now() - finished_at) / 60)::int AS minutes_ago,
           CASE WHEN started_at IS NOT NULL
                THEN greatest(extract(epoch FROM started_at - scheduled_at), 0) END AS latency
    FROM recent
)
SELECT queue, state, minutes_ago, count(*) AS jobs, avg(latency) AS latency_avg,
       percentile_cont(0.95) WITHIN GROUP (ORDER BY latency) AS latency_p95,
       GROUPING(queue) = 1 AS per_minute, GROUPING(state) = 1 AS all_states
FROM timed
GROUP BY GROUPING SETS ((queue, state), (queue), (minutes_ago, state), (minutes_ago));

-- name: job_page
-- One page of the jobs list, newest first, inside the id window [%(low)s, %(high)s]
-- (keyset pagination: the next page's window ends below the last id shown). The window
-- bounds the primary-key walk when the filters match few rows; the caller moves it.
SELECT id, task, queue, state, priority, attempt, max_attempts, created_at, scheduled_at,
       started_at, finished_at, worker_id, cancel_requested, meta->>'task_id' AS task_id
FROM akadze.jobs
WHERE id BETWEEN %(low)s AND %(high)s
  AND (%(state)s::text IS NULL OR state = %(state)s::text)
  AND (%(queue)s::text IS NULL OR queue = %(queue)s::text)
  AND (%(task)s::text IS NULL OR task = %(task)s::text)
  AND (%(since)s::timestamptz IS NULL OR created_at >= %(since)s::timestamptz)
  AND (%(until)s::timestamptz IS NULL OR created_at < %(until)s::timestamptz)
ORDER BY id DESC
LIMIT %(limit)s;

-- name: id_bounds
-- The smallest and largest id (two primary-key probes).
SELECT (SELECT min(id) FROM akadze.jobs) AS low, (SELECT max(id) FROM akadze.jobs) AS high;

-- name: id_at_time
-- The first job at or after id %(id)s: a probe of the binary search that turns a time filter
-- into an id window (ids are drawn in insert order, and created_at is the insert's time).
SELECT id, created_at FROM akadze.jobs WHERE id >= %(id)s ORDER BY id LIMIT 1;

-- name: bulk_targets
-- The ids a bulk action applies to: the list's filters, in a state the action accepts,
-- newest first, at most %(limit)s per click. One state per statement: a partial index
-- (jobs_claim_idx, jobs_running_idx, jobs_finished_idx) matches only an equality on state.
SELECT id
FROM akadze.jobs
WHERE state = %(state)s::text
  AND (%(queue)s::text IS NULL OR queue = %(queue)s::text)
  AND (%(task)s::text IS NULL OR task = %(task)s::text)
  AND (%(since)s::timestamptz IS NULL OR created_at >= %(since)s::timestamptz)
  AND (%(until)s::timestamptz IS NULL OR created_at < %(until)s::timestamptz)
ORDER BY id DESC
LIMIT %(limit)s;

-- name: relatives
-- The jobs a workflow links to these ids (their upstreams and dependents), one hop:
-- the caller walks the graph hop by hop up to a bound.
SELECT id, task, queue, state, upstreams, dependents, finished_at
FROM akadze.jobs WHERE id = ANY(%(ids)s::bigint[]);

-- name: running_jobs
-- The running jobs (jobs_running_idx), for the workers page, up to %(limit)s.
SELECT id, task, queue, worker_id, started_at, attempt, max_attempts
FROM akadze.jobs WHERE state = 'running'
ORDER BY started_at
LIMIT %(limit)s;

-- name: workers
-- Every registered worker, live or not (judged on the database clock by its own TTL).
SELECT id, name, hostname, pid, queues, slots, heartbeat_ttl, started_at, heartbeat_at,
       heartbeat_at > now() - heartbeat_ttl AS live,
       extract(epoch FROM now() - heartbeat_at) AS heartbeat_age
FROM akadze.workers
ORDER BY id;

-- name: schedules
-- Every schedule row: code schedules' state rows and runtime schedules' definitions.
SELECT name, source, spec, task, queue, paused, last_tick, last_run, updated_at
FROM akadze.schedules
ORDER BY name;

-- name: queue_names
-- The queues with active or failed jobs, or a worker: the choices of the filter forms
-- (never a scan of the whole table for its distinct queues).
SELECT DISTINCT queue FROM (
    (SELECT queue FROM akadze.jobs WHERE state = 'queued' LIMIT 10000)
    UNION ALL (SELECT queue FROM akadze.jobs WHERE state = 'running' LIMIT 10000)
    UNION ALL SELECT unnest(queues) FROM akadze.workers) AS names
UNION
-- The queues of failed jobs, one index probe per queue (jobs_failed_queue_idx: a skip scan
-- by recursion, since Postgres 15 has none of its own).
(WITH RECURSIVE failed(queue) AS (
    (SELECT queue FROM akadze.jobs WHERE state = 'failed' ORDER BY queue LIMIT 1)
    UNION ALL
    SELECT (SELECT j.queue FROM akadze.jobs AS j WHERE j.state = 'failed' AND j.queue > f.queue
            ORDER BY j.queue LIMIT 1)
    FROM failed AS f WHERE f.queue IS NOT NULL)
 SELECT queue FROM failed WHERE queue IS NOT NULL)
ORDER BY queue;
