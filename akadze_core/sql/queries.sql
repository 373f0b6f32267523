-- Every statement akadze runs, one named block each (`-- name: <noun>_<verb>`).
-- Parameters are bound by name (%(name)s); values are never formatted into SQL.

-- name: job_insert
-- Insert one job; returns its id. The NOTIFY is deduplicated by Postgres per transaction,
-- channel and payload, so a transaction that enqueues many jobs wakes the workers of each
-- queue once, at commit. (With a unique_key, job_insert_unique is used instead.)
INSERT INTO akadze.jobs (task, queue, args, priority, scheduled_at, max_attempts, expires_at,
                         meta)
VALUES (%(task)s, %(queue)s, %(args)s::jsonb, %(priority)s,
        coalesce(%(scheduled_at)s::timestamptz, now() + %(delay)s::float8 * interval '1 second'),
        %(max_attempts)s, %(expires_at)s::timestamptz, %(meta)s::jsonb)
RETURNING id, CASE WHEN scheduled_at <= now()
                   THEN pg_notify('akadze_jobs', akadze.job_notice(queue, priority, scheduled_at))
              END AS notified;

-- name: job_insert_quiet
-- job_insert without its NOTIFY, for a job due at its own now() (no eta, no countdown) whose
-- notice this process sent moments ago (akadze_core.store.notices). Its scheduled_at is
-- that now(), written as such, and no notice is computed per row (hardly any is sent): the
-- coalesce of job_insert and that notice cost about a tenth of this statement's server time.
-- owes_notice: whether a notice is due should it commit too late (job_notice_send).
INSERT INTO akadze.jobs (task, queue, args, priority, scheduled_at, max_attempts, expires_at,
                         meta)
VALUES (%(task)s, %(queue)s, %(args)s::jsonb, %(priority)s, now(), %(max_attempts)s,
        %(expires_at)s::timestamptz, %(meta)s::jsonb)
RETURNING id, true AS owes_notice;

-- name: job_notice_send
-- The notice of a job inserted by job_insert_quiet, sent after its commit: the payload
-- job_insert would have sent, made from the row (a claim leaves queue, priority and
-- scheduled_at as they were). A job already gone was claimed: nothing to wake.
SELECT pg_notify('akadze_jobs', akadze.job_notice(queue, priority, scheduled_at)) IS NULL
       AS notified
FROM akadze.jobs
WHERE id = %(id)s;

-- name: job_insert_unique
-- Insert one job; with a unique_key, return the active job holding that key instead.
-- The NOTIFY is deduplicated by Postgres per transaction, channel and payload, so a
-- transaction that enqueues many jobs wakes the workers of each queue once, at commit.
WITH inserted AS (
    INSERT INTO akadze.jobs (task, queue, args, priority, scheduled_at, max_attempts,
                             expires_at, unique_key, meta)
    VALUES (%(task)s, %(queue)s, %(args)s::jsonb, %(priority)s,
            coalesce(%(scheduled_at)s::timestamptz, now() + %(delay)s::float8 * interval '1 second'),
            %(max_attempts)s, %(expires_at)s::timestamptz, %(unique_key)s, %(meta)s::jsonb)
    ON CONFLICT (unique_key) WHERE unique_key IS NOT NULL AND state IN ('queued', 'running')
    DO NOTHING
    RETURNING id, queue, priority, scheduled_at, scheduled_at <= now() AS due
)
SELECT id, CASE WHEN due THEN pg_notify('akadze_jobs',
                                        akadze.job_notice(queue, priority, scheduled_at))
           END AS notified, true AS inserted
FROM inserted
UNION ALL
SELECT id, NULL, false
FROM akadze.jobs
WHERE %(unique_key)s::text IS NOT NULL AND unique_key = %(unique_key)s
  AND state IN ('queued', 'running') AND NOT EXISTS (SELECT 1 FROM inserted)
LIMIT 1;

-- name: job_insert_many
-- Bulk insert of one task's jobs sharing every option but their args (one round trip);
-- returns the ids in input order. Scalars for the shared columns keep this as fast as COPY.
-- The args come as JSON arrays of up to 100 jobs each (encoding.encode_many; a text[] bound in
-- binary, so nothing is quoted or escaped per element): one dumps() per array on the client
-- and one jsonb parse per array here, not one of each per job. This statement with its
-- parameters runs at about twice the rate of the former text[] of one args text per job.
WITH inserted AS (
    INSERT INTO akadze.jobs (task, queue, args, priority, scheduled_at, max_attempts,
                             expires_at, meta)
    SELECT %(task)s, %(queue)s, a.args, %(priority)s,
           coalesce(%(scheduled_at)s::timestamptz, now() + %(delay)s::float8 * interval '1 second'),
           %(max_attempts)s, %(expires_at)s::timestamptz, %(meta)s::jsonb
    -- The set-returning function in the select list (a ProjectSet over the array's scan)
    -- yields the jobs in input order, and the insert draws their ids in that order: no
    -- join to reorder them, so no sort of the rows (a lateral join was a tenth of the
    -- statement in its sort and a useless Memoize of every chunk).
    FROM (SELECT jsonb_array_elements(c.array_text::jsonb) AS args
          FROM unnest(%(args)b::text[]) AS c(array_text)) AS a
    RETURNING id, scheduled_at, scheduled_at <= now() AS due
)
SELECT coalesce(array_agg(id ORDER BY id), '{}') AS ids,
       (SELECT pg_notify('akadze_jobs',
                         akadze.job_notice(%(queue)s, %(priority)s::integer, min(scheduled_at)))
        FROM inserted WHERE due HAVING count(*) > 0) AS notified
FROM inserted;

-- name: job_insert_rows
-- A workflow in which no job waits on another nor has errbacks (a group), in input order,
-- ids drawn by the insert in that order (as job_insert_many). Sent as job_insert_many's
-- are: the options shared by a run of jobs once (templates: a JSON array: task, queue,
-- priority, max_attempts, at, delay, expires_at, meta), the jobs as JSON arrays of up to
-- 100 each (nodes, each of one template: chunk_template), a job being its args
-- object, or [args, meta] when its meta is not its template's; or a chunk is an object
-- {"args": [...], "meta": [...]}, its jobs' args and metas side by side (TaskCall.rows'
-- meta_texts: the metas spliced by the client, the args encoded in one call). One jsonb
-- parse per chunk and no text[] element per job and column: the former one-array-per-
-- column form ran at half the rate of enqueue_many, most of it in psycopg's array dumping
-- and per-job casts. A chunk {"args": [...], "index": i} (TaskCall.rows' first_position:
-- a group's members) gives its jobs the positions i, i + 1, ... and its template's meta:
-- nothing per job but its args and a number (a meta built per job was an eighth of the
-- statement).
WITH inserted AS (
    INSERT INTO akadze.jobs (task, queue, args, priority, scheduled_at, max_attempts,
                             expires_at, meta, position)
    SELECT x.task, x.queue, CASE WHEN jsonb_typeof(x.e) = 'array' THEN x.e -> 0 ELSE x.e END,
           x.priority, x.at, x.max_attempts, x.expires_at,
           coalesce(nullif(x.m, 'null'),
                    CASE WHEN jsonb_typeof(x.e) = 'array' THEN nullif(x.e -> 1, 'null') END,
                    x.meta), x.n
    -- Each chunk parsed once, its template read by position (a lateral call per chunk,
    -- not a join that may reorder the chunks) and what the template says worked out there,
    -- once per chunk (its jobs' scheduled_at), not per job; then its jobs, in order, from
    -- set-returning functions in the select list (a ProjectSet): the insert draws the ids
    -- in input order with no sort of the rows. An array of jobs, or the args and metas of
    -- a {"args", "meta"} chunk side by side, or the args and positions of a numbered chunk
    -- (functions in one select list run in step; one given NULL gives no rows: m or n
    -- NULL).
    FROM (SELECT c.task, c.queue, c.priority, c.max_attempts, c.at, c.expires_at, c.meta,
                 jsonb_array_elements(c.jobs) AS e,
                 jsonb_array_elements(c.j -> 'meta') AS m,
                 generate_series(c.first, c.first + jsonb_array_length(c.jobs) - 1) AS n
          FROM (SELECT p.j, CASE WHEN jsonb_typeof(p.j) = 'object' THEN p.j -> 'args'
                                 ELSE p.j END AS jobs,
                       (p.j ->> 'index')::int AS first, t.task, t.queue, t.priority,
                       t.max_attempts,
                       coalesce(t.at, now() + coalesce(t.delay, 0) * interval '1 second') AS at,
                       t.expires_at, t.meta
                FROM (SELECT u.array_text::jsonb AS j, u.k
                      FROM unnest(%(nodes)b::text[], %(chunk_template)b::int[])
                          AS u(array_text, k)
                      OFFSET 0) AS p  -- parsed once
                CROSS JOIN LATERAL jsonb_to_record(%(templates)s::jsonb -> (p.k - 1)) AS t(
                    task text, queue text, priority integer, max_attempts integer,
                    at timestamptz, delay float8, expires_at timestamptz, meta jsonb)
                OFFSET 0) AS c) AS x
    -- Only the ids: the wake-ups are worked out from the templates below, and the ids come
    -- out of the insert in its order, which is the input order (no sort of them).
    RETURNING id
)
SELECT coalesce(array_agg(id), '{}') AS ids,
       -- Per queue, the first due job's wake-up, from the templates that have jobs here
       -- (every job of a template has its scheduled_at), not from the 10,000 rows of a
       -- group returned and aggregated.
       (SELECT count(pg_notify('akadze_jobs', akadze.job_notice(d.queue, d.p, d.at)))
        FROM (SELECT t.queue, min(t.priority) AS p, min(t.at) AS at
              FROM (SELECT t.queue, t.priority,
                           coalesce(t.at, now() + coalesce(t.delay, 0) * interval '1 second')
                               AS at, t.k
                    FROM ROWS FROM (jsonb_to_recordset(%(templates)s::jsonb) AS (
                        queue text, priority integer, at timestamptz, delay float8))
                        WITH ORDINALITY AS t(queue, priority, at, delay, k)) AS t
              WHERE t.k = ANY(%(chunk_template)b::int[]) AND t.at <= now()
              GROUP BY t.queue) AS d) AS notified
FROM inserted;

-- name: job_insert_graph
-- Insert a workflow's jobs in one statement (Workflow.enqueue); returns their ids in input
-- order. Sent like job_insert_rows (templates, JSON arrays of jobs), a job that waits or is
-- waited on being [args, meta, flow, on_failure, upstreams, dependents, pending,
-- waits_outside, position] (JSON null, or the array cut short, for what it has not), or
-- a chunk {"args": [...], "downs": "{...}"} (or a numbered or {"args", "meta"} chunk with
-- "downs") of jobs that wait on nothing and share their dependents. The client
-- worked out the graph: per node, the upstreams as an array literal (-k names node k of
-- this insert, a positive number a job inserted before), the nodes waiting on it
-- (1-based), and how many of its upstreams are in this insert. The ids are drawn first
-- and mapped through one array, with no join between the nodes: joins of CTEs are
-- estimated so badly that the plan looked costly enough for JIT (2 s for 10,000 jobs).
-- Jobs inserted before and waited on (%(external)s) are locked and their dependents
-- extended; one that succeeded counts as done, one that failed, was cancelled or does not
-- exist refuses the whole statement (nothing is inserted). A job with nothing left to
-- wait on is queued at once, with the results of the jobs it waited on.
WITH template AS MATERIALIZED (
    SELECT * FROM ROWS FROM (jsonb_to_recordset(%(templates)s::jsonb) AS (
        task text, queue text, priority integer, max_attempts integer, at timestamptz,
        delay float8, expires_at timestamptz, meta jsonb))
        WITH ORDINALITY AS t(task, queue, priority, max_attempts, at, delay, expires_at,
                             meta, k)
),
node AS MATERIALIZED (
    SELECT c.k, c.chunk, a.ord, a.e, a.m, q.first + a.ord - 1 AS n, q.downs,
           nextval((SELECT pg_get_serial_sequence('akadze.jobs', 'id'))) AS id
    FROM unnest(%(nodes)b::text[], %(chunk_template)b::int[])
        WITH ORDINALITY AS c(array_text, k, chunk)
    CROSS JOIN LATERAL (SELECT c.array_text::jsonb AS j OFFSET 0) AS p  -- as job_insert_rows
    -- A numbered chunk's first position (job_insert_rows), and the dependents every job
    -- of a chunk has (its "downs": a chord's members, sent as their arrays are, not as an
    -- array per job), once per chunk.
    CROSS JOIN LATERAL (SELECT (p.j ->> 'index')::int AS first,
                               (p.j ->> 'downs')::int[] AS downs
                        OFFSET 0) AS q
    CROSS JOIN LATERAL ROWS FROM (
        jsonb_array_elements(CASE WHEN jsonb_typeof(p.j) = 'object' THEN p.j -> 'args'
                                  ELSE p.j END),
        jsonb_array_elements(p.j -> 'meta')) WITH ORDINALITY AS a(e, m, ord)
),
ids AS MATERIALIZED (
    SELECT array_agg(id ORDER BY chunk, ord) AS ids FROM node
),
existing AS MATERIALIZED (
    SELECT j.id, j.state, j.result FROM akadze.jobs AS j
    WHERE j.id = ANY(%(external)s::bigint[])
    ORDER BY j.id
    FOR UPDATE
),
refused AS (
    SELECT akadze.refuse(format('job %%s, which a workflow job would wait on, %%s', e.id,
                                coalesce(x.state, 'does not exist')))
    FROM unnest(%(external)s::bigint[]) AS e(id) LEFT JOIN existing AS x ON x.id = e.id
    WHERE x.id IS NULL OR x.state IN ('failed', 'cancelled')
),
-- A job's fields: JSON null and an absent element alike are SQL NULL (on an args object,
-- a job of nothing but its args, every element is absent).
fields AS (
    SELECT n.id, n.k,
           CASE WHEN jsonb_typeof(n.e) = 'array' THEN n.e -> 0 ELSE n.e END AS args,
           coalesce(nullif(n.m, 'null'), nullif(n.e -> 1, 'null')) AS meta,
           coalesce(n.n, (n.e ->> 8)::int) AS position,
           nullif(n.e -> 2, 'null') AS flow,
           nullif(n.e -> 3, 'null') AS on_failure, (n.e ->> 4)::bigint[] AS ups,
           coalesce((n.e ->> 5)::int[], n.downs) AS downs,
           coalesce((n.e ->> 6)::int, 0) AS pending,
           coalesce((n.e ->> 7)::boolean, false) AS waits_outside
    FROM node AS n
),
shaped AS (
    SELECT n.*,
           CASE WHEN n.ups IS NOT NULL THEN ARRAY(
               SELECT CASE WHEN u.ref < 0 THEN m.ids[-u.ref] ELSE u.ref END
               FROM unnest(n.ups) WITH ORDINALITY AS u(ref, k) ORDER BY u.k)
           END AS upstream_ids,
           -- One dependent (a chord's member, a chain's step) without a subquery per job.
           CASE WHEN n.downs IS NULL THEN NULL
                WHEN cardinality(n.downs) = 1 THEN ARRAY[m.ids[n.downs[1]]]
                ELSE ARRAY(SELECT m.ids[d.k] FROM unnest(n.downs) AS d(k))
           END AS dependent_ids,
           n.pending + CASE WHEN n.waits_outside THEN (
               SELECT count(*) FROM existing AS x
               WHERE x.id = ANY(n.ups) AND x.state <> 'succeeded') ELSE 0 END
               AS waiting
    FROM fields AS n CROSS JOIN ids AS m
),
inserted AS (
    INSERT INTO akadze.jobs (id, task, queue, args, priority, scheduled_at, max_attempts,
                             expires_at, meta, state, upstreams, waiting_for, dependents,
                             flow, on_failure, upstream_results, position)
    OVERRIDING SYSTEM VALUE
    SELECT n.id, t.task, t.queue, n.args, t.priority,
           coalesce(t.at, now() + coalesce(t.delay, 0) * interval '1 second'),
           t.max_attempts, t.expires_at,
           coalesce(n.meta, t.meta),
           CASE WHEN n.waiting > 0 THEN 'waiting' ELSE 'queued' END,
           n.upstream_ids, CASE WHEN n.ups IS NOT NULL THEN n.waiting END, n.dependent_ids,
           n.flow, n.on_failure,
           -- Everything waited on had succeeded already: the results now.
           CASE WHEN n.ups IS NOT NULL AND n.waiting = 0 THEN
               CASE n.flow->>'pass'
                   WHEN 'one' THEN (SELECT x.result FROM existing AS x
                                    WHERE x.id = n.upstream_ids[1])
                   WHEN 'list' THEN (SELECT jsonb_agg(x.result ORDER BY u.k)
                                     FROM unnest(n.upstream_ids) WITH ORDINALITY AS u(id, k)
                                     JOIN existing AS x ON x.id = u.id)
               END
           END,
           n.position
    FROM shaped AS n JOIN template AS t ON t.k = n.k
    RETURNING id, state, queue, priority, scheduled_at, scheduled_at <= now() AS due
),
linked AS (
    UPDATE akadze.jobs AS j
    SET dependents = coalesce(j.dependents, '{}') || l.downstreams
    FROM (SELECT e.ref, array_agg(m.ids[e.node] ORDER BY e.node) AS downstreams
          FROM unnest(%(external_ref)s::bigint[], %(external_node)s::int[]) AS e(ref, node)
          CROSS JOIN ids AS m
          JOIN existing AS x ON x.id = e.ref
          WHERE x.state IN ('waiting', 'queued', 'running')
          GROUP BY e.ref) AS l
    WHERE j.id = l.ref
    RETURNING j.id
)
SELECT (SELECT ids FROM ids) AS ids,
       (SELECT count(pg_notify('akadze_jobs', akadze.job_notice(queue, p, at)))
        FROM (SELECT queue, min(priority) AS p, min(scheduled_at) AS at FROM inserted
              WHERE state = 'queued' AND due GROUP BY queue) AS d)
           AS notified,
       (SELECT count(*) FROM refused) AS refused,
       (SELECT count(*) FROM linked) AS linked;

-- name: job_claim
-- Claim up to %(limit)s due jobs of one queue, in (priority, scheduled_at, id) order: the
-- statement is akadze.claim_jobs in functions.sql, which bounds its lock waits by
-- %(lock_timeout)s (NULL: no bound) in the same statement.
SELECT * FROM akadze.claim_jobs(
    %(lock_timeout)s::text, %(queue)s::text, %(limit)s::integer, %(worker_id)s::bigint,
    %(floor_priority)s::integer[], %(floor_at)s::timestamptz[], %(floor_id)s::bigint[]);

-- name: job_claim_fair
-- Like job_claim, but rotates across the task names of the queue (each task's oldest job
-- first, then each task's second, ...): akadze.claim_jobs_fair in functions.sql, which
-- bounds its lock waits by %(lock_timeout)s (NULL: no bound) in the same statement.
SELECT * FROM akadze.claim_jobs_fair(
    %(lock_timeout)s::text, %(queue)s::text, %(limit)s::integer, %(worker_id)s::bigint,
    %(after_task)s::text);

-- name: job_complete_many
-- Write a batch of run outcomes in one statement, each fenced by its run_count and
-- claim_token: akadze.complete_jobs in functions.sql, which bounds its lock waits by
-- %(lock_timeout)s (NULL: no bound) in the same statement. The arrays come as array
-- literals made by akadze_core.store.arrays: psycopg's dump of a list is a pass in Python
-- per element, the biggest part of a busy worker's CPU per outcome.
SELECT * FROM akadze.complete_jobs(
    %(lock_timeout)s::text, %(id)s::bigint[], %(run_count)s::int[], %(claim_token)s::bigint[],
    %(kind)s::text[], %(result)s::text[], %(delay)s::float8[], %(error)s::text[],
    %(max_attempts)s::int[]);

-- name: job_complete_in_tx
-- complete_tx: the job succeeds in the caller's transaction, whatever cancel or expiry
-- happened meanwhile. Fenced like every outcome write.
WITH done AS (
    UPDATE akadze.jobs
    SET state = 'succeeded', result = %(result)s::jsonb, worker_id = NULL, finished_at = now()
    WHERE id = %(id)s AND run_count = %(run_count)s AND claim_token = %(claim_token)s
      AND state = 'running'
    RETURNING id, (dependents IS NOT NULL OR on_failure IS NOT NULL) AS settles
),
settled AS (
    SELECT akadze.settle(array_agg(id)) AS touched FROM done WHERE settles HAVING count(*) > 0
)
SELECT id, pg_notify('akadze_done', id::text) IS NULL AS notified FROM done
WHERE (SELECT count(*) FROM settled) >= 0;

-- name: job_return_many
-- Graceful stop: unfinished runs go back to queued, due now, without spending the attempt.
UPDATE akadze.jobs AS j
SET state = 'queued', attempt = j.attempt - 1, worker_id = NULL, scheduled_at = now()
FROM unnest(%(id)s::bigint[], %(run_count)s::int[], %(claim_token)s::bigint[])
     AS o(id, run_count, claim_token)
WHERE j.id = o.id AND j.run_count = o.run_count AND j.claim_token = o.claim_token
  AND j.state = 'running'
RETURNING j.id, pg_notify('akadze_jobs', j.queue) IS NULL AS notified;

-- name: job_return_orphans
-- After a connection error: a claim may have committed and its answer been lost, leaving
-- jobs running under this live worker that it does not know about (and that no rescue would
-- touch while it heartbeats). They go back to queued without spending the attempt.
UPDATE akadze.jobs AS j
SET state = 'queued', attempt = j.attempt - 1, worker_id = NULL, scheduled_at = now()
WHERE j.worker_id = %(worker_id)s AND j.state = 'running'
  AND NOT (j.id = ANY(%(known)s::bigint[]))
RETURNING j.id, j.run_count, pg_notify('akadze_jobs', j.queue) IS NULL AS notified;

-- name: job_rescue
-- Return the running jobs of dead workers (heartbeat older than their own TTL) and of
-- workers that no longer exist. The dead worker rows are deleted in the same statement, so
-- two rescuers racing each other rescue every job once: the second one's DELETE finds
-- nothing and its SKIP LOCKED passes over rows the first one holds. The attempt stays
-- spent and the default backoff curve applies; out of attempts means failed.
WITH dead AS (
    DELETE FROM akadze.workers
    WHERE heartbeat_at < now() - heartbeat_ttl
    RETURNING id
),
lost AS (
    SELECT j.id
    FROM akadze.jobs AS j
    WHERE j.state = 'running'
      AND (j.worker_id IN (SELECT id FROM dead)
           -- A worker that registered after this statement's snapshot is invisible here;
           -- the lock re-reads a job it claimed meanwhile, so only runs started before this
           -- statement can be orphans.
           OR (NOT EXISTS (SELECT 1 FROM akadze.workers AS w WHERE w.id = j.worker_id)
               AND j.started_at < now()))
    FOR UPDATE OF j SKIP LOCKED
),
rescued AS (
UPDATE akadze.jobs AS j
SET state = CASE WHEN j.cancel_requested OR j.expires_at <= now() THEN 'cancelled'
                 WHEN j.attempt >= j.max_attempts THEN 'failed'
                 ELSE 'queued' END,
    errors = j.errors || jsonb_build_array(jsonb_build_object(
        'attempt', j.attempt, 'at', now(), 'type', 'WorkerLost',
        'message', 'the worker running this job stopped heartbeating', 'traceback', NULL,
        'worker_id', j.worker_id)),
    -- The exponent is bounded first: power(2, 1024) overflows double precision.
    scheduled_at = now() + least(power(2, least(greatest(j.attempt - 1, 0), 63)), %(cap)s::float8)
                           * (0.5 + random() * 0.5) * interval '1 second',
    worker_id = NULL,
    finished_at = CASE WHEN j.cancel_requested OR j.expires_at <= now()
                         OR j.attempt >= j.max_attempts THEN now() END
FROM lost
WHERE j.id = lost.id
RETURNING j.id, j.state, j.queue, j.task, j.attempt, j.max_attempts,
          extract(epoch FROM j.scheduled_at - now())::float8 AS retry_in,
          (j.dependents IS NOT NULL OR j.on_failure IS NOT NULL) AS settles
),
settled AS (
    SELECT akadze.settle(array_agg(id)) AS touched FROM rescued
    WHERE state <> 'queued' AND settles HAVING count(*) > 0
)
SELECT id, state, queue, task, attempt, max_attempts, retry_in,
       CASE WHEN state <> 'queued' THEN pg_notify('akadze_done', id::text) END AS notified
FROM rescued
WHERE (SELECT count(*) FROM settled) >= 0;

-- name: job_request_cancel
-- Mark a queued or running job. A queued job is cancelled right away; a running one finishes
-- its body and the outcome rules decide (see job_complete_many). A running job may not have
-- started yet (claimed ahead, waiting for a body slot or a process): akadze_cancel tells its
-- worker at commit, which then drops it unstarted.
-- A waiting job (a workflow's later step) is cancelled at once too, and what waits on it
-- with it (akadze.settle).
-- signal (terminate): a running job's cancel_signal, which its worker's process pool sends
-- to the process running the body; the notification says "<id>:<signal>" (a plain cancel
-- says "<id>"). A later plain cancel keeps an earlier terminate request.
WITH marked AS (
    UPDATE akadze.jobs
    SET cancel_requested = true,
        cancel_signal = CASE WHEN state = 'running'
                             THEN coalesce(%(signal)s::smallint, cancel_signal)
                             ELSE cancel_signal END,
        state = CASE WHEN state IN ('queued', 'waiting') THEN 'cancelled' ELSE state END,
        finished_at = CASE WHEN state IN ('queued', 'waiting') THEN now() ELSE finished_at END
    WHERE id = %(id)s AND state IN ('waiting', 'queued', 'running')
    RETURNING id, state, cancel_signal, dependents IS NOT NULL AS settles
),
settled AS (
    SELECT akadze.settle(array_agg(id)) AS touched FROM marked
    WHERE state = 'cancelled' AND settles HAVING count(*) > 0
)
SELECT id, state,
       CASE WHEN state = 'cancelled' THEN pg_notify('akadze_done', id::text)
            WHEN cancel_signal IS NOT NULL
                THEN pg_notify('akadze_cancel', id::text || ':' || cancel_signal::text)
            ELSE pg_notify('akadze_cancel', id::text) END AS notified
FROM marked
WHERE (SELECT count(*) FROM settled) >= 0;

-- name: job_list_revoked
-- Of the runs a worker holds claimed ahead (not started), those cancelled or expired on this
-- clock: the worker's check for cancel notifications it may have missed (a lost LISTEN
-- connection). One statement for all of them, only while some wait.
SELECT j.id
FROM akadze.jobs AS j
JOIN unnest(%(id)s::bigint[], %(run_count)s::int[], %(claim_token)s::bigint[])
     AS o(id, run_count, claim_token)
  ON j.id = o.id AND j.run_count = o.run_count AND j.claim_token = o.claim_token
WHERE j.state = 'running' AND (j.cancel_requested OR j.expires_at <= now());

-- name: job_list_terminating
-- Of the runs a worker's process pool is running, those asked to be terminated (their
-- cancel_signal): the check for terminate notifications it may have missed.
SELECT j.id, j.cancel_signal
FROM akadze.jobs AS j
JOIN unnest(%(id)s::bigint[], %(run_count)s::int[], %(claim_token)s::bigint[])
     AS o(id, run_count, claim_token)
  ON j.id = o.id AND j.run_count = o.run_count AND j.claim_token = o.claim_token
WHERE j.state = 'running' AND j.cancel_signal IS NOT NULL;

-- name: job_requeue
-- failed -> queued, keeping attempt, errors and args; one more attempt if none are left.
UPDATE akadze.jobs
SET state = 'queued', scheduled_at = now(), finished_at = NULL, cancel_requested = false,
    cancel_signal = NULL,
    max_attempts = greatest(max_attempts, attempt + 1)
WHERE id = %(id)s AND state = 'failed'
  -- A newer active job holding the same unique key wins: requeueing would duplicate it.
  AND NOT EXISTS (SELECT 1 FROM akadze.jobs AS holder
                  WHERE holder.unique_key = akadze.jobs.unique_key
                    AND holder.state IN ('queued', 'running'))
RETURNING id, pg_notify('akadze_jobs', queue) IS NULL AS notified;

-- name: job_prune
-- Delete a batch of finished jobs older than their retention, oldest first.
WITH doomed AS (
    SELECT id FROM akadze.jobs
    WHERE ((state IN ('succeeded', 'cancelled')
            AND finished_at < now() - %(finished_retention)s::float8 * interval '1 second')
           OR (state = 'failed'
               AND finished_at < now() - %(failed_retention)s::float8 * interval '1 second'))
    -- A succeeded job whose dependents still wait keeps its result until they are released.
    AND (dependents IS NULL OR NOT EXISTS (
        SELECT 1 FROM akadze.jobs AS w WHERE w.id = ANY(akadze.jobs.dependents)
                                         AND w.state = 'waiting'))
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED
)
DELETE FROM akadze.jobs AS j USING doomed WHERE j.id = doomed.id;

-- name: job_get
SELECT id, task, queue, args, state, priority, scheduled_at, attempt, max_attempts, run_count,
       errors, result, meta, expires_at, cancel_requested, unique_key, worker_id,
       created_at, started_at, finished_at, upstreams, waiting_for, dependents, flow,
       upstream_results, position
FROM akadze.jobs WHERE id = %(id)s;

-- name: job_get_many
-- The jobs of these ids (a group's members, waited for together); missing ids are absent.
SELECT id, task, queue, args, state, priority, scheduled_at, attempt, max_attempts, run_count,
       errors, result, meta, expires_at, cancel_requested, unique_key, worker_id,
       created_at, started_at, finished_at, upstreams, waiting_for, dependents, flow,
       upstream_results, position
FROM akadze.jobs WHERE id = ANY(%(ids)s::bigint[]);

-- name: job_list
SELECT id, task, queue, args, state, priority, scheduled_at, attempt, max_attempts, run_count,
       errors, result, meta, expires_at, cancel_requested, unique_key, worker_id,
       created_at, started_at, finished_at, upstreams, waiting_for, dependents, flow,
       upstream_results, position
FROM akadze.jobs
WHERE (%(state)s::text IS NULL OR state = %(state)s)
  AND (%(queue)s::text IS NULL OR queue = %(queue)s)
  AND (%(task)s::text IS NULL OR task = %(task)s)
ORDER BY id DESC
LIMIT %(limit)s;

-- name: job_stats
SELECT queue, state, count(*) AS jobs FROM akadze.jobs GROUP BY queue, state ORDER BY queue, state;

-- name: autovacuum_runs
-- Whether autovacuum will vacuum the jobs table: on for the server (with the statistics it
-- needs) and not switched off for the table itself.
SELECT current_setting('autovacuum')::boolean
       AND current_setting('track_counts')::boolean
       AND coalesce((SELECT option_value::boolean FROM pg_options_to_table(c.reloptions)
                     WHERE option_name = 'autovacuum_enabled'), true)
FROM pg_class AS c WHERE c.oid = 'akadze.jobs'::regclass;

-- name: fair_index_state
-- jobs_fair_claim_idx (built by fair workers, akadze_core/store/fair_index.py): no row when it
-- does not exist; valid once a build has finished; building while a CREATE INDEX of it runs.
SELECT i.indisvalid AS valid,
       EXISTS (SELECT 1 FROM pg_stat_progress_create_index AS p
               WHERE p.index_relid = i.indexrelid) AS building
FROM pg_index AS i
WHERE i.indexrelid = to_regclass('akadze.jobs_fair_claim_idx');

-- name: fair_index_try_lock
-- Held by the one session building the index (session-level: a direct connection).
SELECT pg_try_advisory_lock(%(key)s) AS locked;

-- name: fair_index_unlock
SELECT pg_advisory_unlock(%(key)s);

-- name: fair_index_untimed
-- A build reads the whole table and waits for the transactions open on it: neither the
-- role's statement_timeout nor its lock_timeout may cut it short (an interrupted
-- CONCURRENTLY build leaves an invalid index behind). This session is the build's alone.
SET statement_timeout = 0; SET lock_timeout = 0;

-- name: fair_index_drop
-- An invalid index left by an interrupted build (no session is building it).
DROP INDEX CONCURRENTLY IF EXISTS akadze.jobs_fair_claim_idx;

-- name: fair_index_create
-- Fair claims walk the distinct task names of a queue (job_claim_fair): 0001's definition.
CREATE INDEX CONCURRENTLY IF NOT EXISTS jobs_fair_claim_idx
    ON akadze.jobs (queue, task, priority, scheduled_at, id) WHERE state = 'queued';

-- name: worker_register
-- slots: per queue, in the order of queues (NULL: not said; shown by the dashboard).
INSERT INTO akadze.workers (name, hostname, pid, queues, heartbeat_ttl, slots)
VALUES (%(name)s, %(hostname)s, %(pid)s, %(queues)s, %(heartbeat_ttl)s::float8 * interval '1 second',
        %(slots)s::integer[])
RETURNING id;

-- name: worker_heartbeat
-- One row per worker, one UPDATE per interval. No row means another worker judged this one
-- dead and rescued its jobs: the caller must not resurrect it.
-- control_pending: a remote-control request waits for this worker (the polling fallback
-- of the akadze_control NOTIFY, at no extra statement).
UPDATE akadze.workers SET heartbeat_at = now() WHERE id = %(id)s
RETURNING id, EXISTS (
    SELECT 1 FROM akadze.control_requests AS r
    WHERE workers.id = ANY (r.targets) AND r.expires_at > now()
      AND NOT EXISTS (SELECT 1 FROM akadze.control_replies AS p
                      WHERE p.request_id = r.id AND p.worker_id = workers.id)
) AS control_pending;

-- name: worker_set_queues
-- The queues a worker consumes changed at runtime (add_consumer / cancel_consumer).
UPDATE akadze.workers SET queues = %(queues)s WHERE id = %(id)s RETURNING id;

-- name: worker_unregister
DELETE FROM akadze.workers WHERE id = %(id)s;

-- name: job_update_meta
-- Merge top-level keys into the running job's meta (custom progress states), fenced.
UPDATE akadze.jobs SET meta = meta || %(patch)s::jsonb
WHERE id = %(id)s AND run_count = %(run_count)s AND claim_token = %(claim_token)s
      AND state = 'running'
RETURNING id;

-- name: job_hand_over
-- JobContext.hand_over (Celery's Task.replace): inside complete_tx, before the running job's
-- success is written, what waits on it (its dependents: a chain's next step, a fan-in's
-- callback, link callbacks) waits on %(to)s instead, at the same place in its upstreams (the
-- order of a fan-in's results), and the job is marked replaced_by %(to)s, so that a reader
-- holding its id follows to the replacement. Fenced like every outcome write: no row when the
-- run no longer owns the job. The settle of the job's success then finds no dependents.
WITH original AS (
    SELECT id, dependents FROM akadze.jobs
    WHERE id = %(id)s AND run_count = %(run_count)s AND claim_token = %(claim_token)s
      AND state = 'running'
    FOR UPDATE
), moved AS (
    UPDATE akadze.jobs AS w SET upstreams = array_replace(w.upstreams, o.id, %(to)s::bigint)
    FROM original AS o
    WHERE w.id = ANY(o.dependents) AND w.state = 'waiting'
    RETURNING w.id
), target AS (
    UPDATE akadze.jobs AS t
    SET dependents = coalesce(t.dependents, '{}'::bigint[]) || o.dependents
    FROM original AS o
    WHERE t.id = %(to)s AND o.dependents IS NOT NULL
    RETURNING t.id
)
UPDATE akadze.jobs AS j
SET dependents = NULL, meta = j.meta || jsonb_build_object('replaced_by', %(to)s::bigint)
FROM original AS o
WHERE j.id = o.id
RETURNING j.id, (SELECT count(*) FROM moved) AS moved, (SELECT count(*) FROM target) AS target;

-- name: job_find_by_task_id
-- The newest job carrying an external id (integrations such as the Celery facade set it),
-- else the job %(derived)s (the one the id would be derived from: akadze_core.model.task_ids)
-- when it carries none of its own.
-- Through jobs_meta_task_id_idx: its predicate (meta ? 'task_id') must be in the query, and
-- the matches are found before they are ordered (MATERIALIZED), or the planner, which has
-- no statistics for a partial expression index, walks the primary key backwards through
-- the whole table for an id that matches nothing (125 ms at 400,000 jobs, 0.1 ms this way).
SELECT id, task, queue, args, state, priority, scheduled_at, attempt, max_attempts, run_count,
       errors, result, meta, expires_at, cancel_requested, unique_key, worker_id,
       created_at, started_at, finished_at, upstreams, waiting_for, dependents, flow,
       upstream_results, position
FROM akadze.jobs WHERE id = coalesce((
    WITH matches AS MATERIALIZED (
        SELECT id FROM akadze.jobs WHERE meta ? 'task_id' AND meta->>'task_id' = %(task_id)s)
    SELECT max(id) FROM matches), (
    SELECT id FROM akadze.jobs WHERE id = %(derived)s::bigint AND NOT meta ? 'task_id'));

-- name: task_id_key
-- The key of the task ids derived from job ids (akadze_core.model.task_ids; migration 0014).
SELECT key FROM akadze.task_id_key;

-- name: job_purge
-- Delete queued jobs (all queues when %(queues)s is NULL), and waiting ones (later steps of
-- workflows: purging their upstreams would leave them waiting forever); running ones are
-- left alone.
DELETE FROM akadze.jobs
WHERE state IN ('queued', 'waiting') AND (%(queues)s::text[] IS NULL OR queue = ANY(%(queues)s::text[]));

-- name: worker_list
-- Registered workers; with %(live)s only those whose heartbeat is within their own TTL,
-- judged on the database clock.
SELECT id, name, hostname, pid, queues, heartbeat_ttl, started_at, heartbeat_at
FROM akadze.workers
WHERE NOT %(live)s OR heartbeat_at > now() - heartbeat_ttl
ORDER BY id;

-- name: job_list_scheduled
-- Queued jobs not due yet (countdowns, eta, retries waiting for their backoff).
SELECT id, task, queue, args, state, priority, scheduled_at, attempt, max_attempts, run_count,
       errors, result, meta, expires_at, cancel_requested, unique_key, worker_id,
       created_at, started_at, finished_at, upstreams, waiting_for, dependents, flow,
       upstream_results, position
FROM akadze.jobs
WHERE state = 'queued' AND scheduled_at > now()
ORDER BY scheduled_at, id
LIMIT %(limit)s;

-- name: schedule_clock
-- Schedules run on the database clock only, never on a worker's.
SELECT now() AS now;

-- name: schedule_list
-- source 'runtime': a runtime schedule owns the name, and a code declaration of it is skipped.
SELECT name, spec, last_tick, last_run, updated_at, source
FROM akadze.schedules WHERE name = ANY(%(names)s::text[]);

-- name: schedule_code_list
-- The schedules declared in code that ran against this database (their rows stay after a
-- declaration is removed), for a listing that cannot see the code that declares them.
SELECT name, spec, last_run FROM akadze.schedules WHERE source = 'code' ORDER BY name;

-- name: schedule_start
-- A schedule seen for the first time: the ticks up to %(tick)s passed before it existed.
INSERT INTO akadze.schedules (name, spec, last_tick)
VALUES (%(name)s, %(spec)s, %(tick)s)
ON CONFLICT (name) DO NOTHING;

-- name: schedule_reset
-- The trigger changed between deploys: start over from %(tick)s without enqueueing it.
UPDATE akadze.schedules
SET spec = %(spec)s, last_tick = %(tick)s, updated_at = now()
WHERE name = %(name)s AND spec <> %(spec)s AND source = 'code';

-- name: schedule_enqueue
-- Enqueue the run of tick %(tick)s, exactly once however many workers try at the same time:
-- the UPDATE takes the schedule's row lock, and a worker that waited for it re-reads the row
-- (READ COMMITTED), finds last_tick already at the tick, updates nothing and so inserts
-- nothing. The job is due at once and wakes the workers of its queue like job_insert.
-- %(expected)s (when not NULL) is the last tick the caller decided from: a tick that depends
-- on the last run (Celery's is_due) is enqueued only if nobody moved it since.
WITH advanced AS (
    UPDATE akadze.schedules
    SET last_tick = %(tick)s, last_run = %(tick)s, updated_at = now()
    WHERE name = %(name)s AND spec = %(spec)s AND last_tick < %(tick)s AND source = 'code'
      AND (%(expected)s::timestamptz IS NULL OR last_tick = %(expected)s::timestamptz)
    RETURNING name
),
inserted AS (
    INSERT INTO akadze.jobs (task, queue, args, priority, scheduled_at, max_attempts,
                             expires_at, meta)
    SELECT %(task)s, %(queue)s, %(args)s::jsonb, %(priority)s, now(), %(max_attempts)s,
           %(expires_at)s::timestamptz, %(meta)s::jsonb
    FROM advanced
    RETURNING id, queue
)
SELECT id, pg_notify('akadze_jobs', queue) IS NULL AS notified FROM inserted;

-- Runtime schedules (source 'runtime'): the definition lives in the row. Every statement
-- that changes one takes a new version and notifies akadze_schedules with the name (empty
-- when the name is too long for a payload: the workers then compare every version), which
-- Postgres delivers at commit, so a change made in a caller's transaction is heard only if
-- it commits.

-- name: schedule_runtime_add
-- Store a new runtime schedule, or (%(replace)s) replace the definition of the one holding
-- the name, a code schedule's state row included. Ticks up to now() are accounted for: a new
-- schedule first runs at its next tick, and so does a replaced one whose trigger changed
-- (last_tick never moves back: a tick at or before it ran or was skipped already). No row
-- comes back when the name is taken and %(replace)s is false.
WITH stored AS (
    INSERT INTO akadze.schedules AS s
        (name, spec, last_tick, source, task, args, queue, priority, max_attempts, expires,
         meta, paused, version, changed_at)
    VALUES (%(name)s, %(spec)s, now(), 'runtime', %(task)s, %(args)s::jsonb, %(queue)s,
            %(priority)s, %(max_attempts)s, %(expires)s::interval, %(meta)s::jsonb,
            %(paused)s, nextval('akadze.schedule_versions'), now())
    ON CONFLICT (name) DO UPDATE
    SET spec = EXCLUDED.spec,
        last_tick = CASE WHEN s.source = 'runtime' AND s.spec = EXCLUDED.spec
                         AND NOT (s.paused AND NOT EXCLUDED.paused)
                         THEN s.last_tick ELSE greatest(s.last_tick, now()) END,
        source = 'runtime', task = EXCLUDED.task, args = EXCLUDED.args,
        queue = EXCLUDED.queue, priority = EXCLUDED.priority,
        max_attempts = EXCLUDED.max_attempts, expires = EXCLUDED.expires,
        meta = EXCLUDED.meta, paused = EXCLUDED.paused, version = EXCLUDED.version,
        changed_at = now(), updated_at = now(),
        created_at = CASE WHEN s.source = 'runtime' THEN s.created_at ELSE now() END
    WHERE %(replace)s
    RETURNING s.*
)
SELECT name, source, spec, task, args, queue, priority, max_attempts, expires, meta, paused,
       version, created_at, changed_at, last_run,
       pg_notify('akadze_schedules', CASE WHEN octet_length(name) <= 7000 THEN name ELSE '' END)
           IS NULL AS notified
FROM stored;

-- name: schedule_owner
SELECT source FROM akadze.schedules WHERE name = %(name)s;

-- name: schedule_runtime_pause
-- Pause (%(paused)s true) or resume a runtime schedule. Resuming a paused one accounts for
-- the ticks up to now(): the ticks missed while it was paused do not run, the next one does.
WITH changed AS (
    UPDATE akadze.schedules
    SET last_tick = CASE WHEN paused AND NOT %(paused)s THEN greatest(last_tick, now())
                         ELSE last_tick END,
        paused = %(paused)s, version = nextval('akadze.schedule_versions'),
        changed_at = now(), updated_at = now()
    WHERE name = %(name)s AND source = 'runtime'
    RETURNING name
)
SELECT name,
       pg_notify('akadze_schedules', CASE WHEN octet_length(name) <= 7000 THEN name ELSE '' END)
           IS NULL AS notified
FROM changed;

-- name: schedule_runtime_remove
WITH removed AS (
    DELETE FROM akadze.schedules WHERE name = %(name)s AND source = 'runtime'
    RETURNING name
)
SELECT name,
       pg_notify('akadze_schedules', CASE WHEN octet_length(name) <= 7000 THEN name ELSE '' END)
           IS NULL AS notified
FROM removed;

-- name: schedule_runtime_list
-- Runtime schedules, all of them (%(names)s NULL) or those named.
SELECT name, source, spec, task, args, queue, priority, max_attempts, expires, meta, paused,
       version, created_at, changed_at, last_run
FROM akadze.schedules
WHERE source = 'runtime' AND (%(names)s::text[] IS NULL OR name = ANY(%(names)s::text[]))
ORDER BY name;

-- name: schedule_runtime_timing
-- What a worker's timetable holds of the runtime schedules named: no args, no meta (the tick
-- statement takes those from the row).
SELECT name, spec, paused, version, last_tick
FROM akadze.schedules
WHERE source = 'runtime' AND name = ANY(%(names)s::text[]);

-- name: schedule_runtime_versions
SELECT name, version FROM akadze.schedules WHERE source = 'runtime';

-- name: schedule_runtime_fingerprint
-- Any add, change or removal changes one of these (versions only grow, a row's new version
-- is taken after its old one committed): the workers' poll, cheaper than every version.
SELECT count(*) AS count, coalesce(sum(version), 0)::text AS total,
       coalesce(max(version), 0) AS newest
FROM akadze.schedules WHERE source = 'runtime';

-- name: schedule_runtime_enqueue
-- Enqueue one tick of each runtime schedule named, in one statement, exactly once per
-- schedule and tick however many workers try: as schedule_enqueue, each row is locked and
-- re-read (READ COMMITTED re-checks a row that changed while the lock was awaited), and
-- only a row still at an earlier tick, at the version the tick was computed from and not
-- paused is advanced, and only an advanced row inserts its job. Rows are locked in name
-- order, so two workers enqueueing overlapping sets wait on each other, never deadlock.
-- The job's fields come from the row; meta gains {"schedule": name, "tick": the tick's text}.
WITH due AS (
    -- %(due)s: [[name, version, tick as ISO text], ...]
    SELECT d ->> 0 AS name, (d ->> 1)::bigint AS version,
           (d ->> 2)::timestamptz AS tick, d ->> 2 AS tick_text
    FROM jsonb_array_elements(%(due)s::jsonb) AS d
),
locked AS (
    SELECT s.name, d.tick, d.tick_text
    FROM akadze.schedules AS s JOIN due AS d ON d.name = s.name
    WHERE s.source = 'runtime' AND s.version = d.version AND NOT s.paused
      AND s.last_tick < d.tick
    ORDER BY s.name
    FOR UPDATE OF s
),
advanced AS (
    UPDATE akadze.schedules AS s
    SET last_tick = l.tick, last_run = l.tick, updated_at = now()
    FROM locked AS l
    WHERE s.name = l.name
    RETURNING s.name, s.task, s.queue, s.args, s.priority, s.max_attempts, s.expires, s.meta,
              l.tick, l.tick_text
),
inserted AS (
    INSERT INTO akadze.jobs (task, queue, args, priority, scheduled_at, max_attempts,
                             expires_at, meta)
    SELECT task, queue, args, priority, now(), max_attempts, tick + expires,
           meta || jsonb_build_object('schedule', name, 'tick', tick_text)
    FROM advanced
    RETURNING id, queue
)
SELECT queue, count(*) AS jobs, pg_notify('akadze_jobs', queue) IS NULL AS notified
FROM inserted GROUP BY queue;

-- name: statement_lock_timeout
-- Bound the lock waits of the statement sent right after this one in the same pipeline
-- (one implicit transaction up to the Sync). is_local: the setting ends with that
-- transaction, so nothing leaks to the session, nor through a transaction pooler to another
-- client. It cannot sit inside the statement itself: a relation's lock is taken while the
-- statement is parsed, before any set_config in it runs.
SELECT set_config('lock_timeout', %(timeout)s, true);

-- name: control_send
-- A remote-control request to the workers %(targets)s, announced to them at commit: the
-- payload lists the targets (empty when too long for a payload: every worker looks).
WITH request AS (
    INSERT INTO akadze.control_requests (command, arguments, targets, reply, expires_at)
    VALUES (%(command)s, %(arguments)s::jsonb, %(targets)s::bigint[], %(reply)s,
            now() + %(ttl)s::float8 * interval '1 second')
    RETURNING id, targets
)
SELECT id, pg_notify('akadze_control', CASE WHEN cardinality(targets) <= 400
                                            THEN array_to_string(targets, ',')
                                            ELSE '' END) IS NULL AS notified
FROM request;

-- name: control_pending
-- The requests addressed to this worker that it has not answered yet, oldest first.
SELECT r.id, r.command, r.arguments, r.reply FROM akadze.control_requests AS r
WHERE %(worker_id)s = ANY (r.targets) AND r.expires_at > now()
  AND NOT EXISTS (SELECT 1 FROM akadze.control_replies AS p
                  WHERE p.request_id = r.id AND p.worker_id = %(worker_id)s)
ORDER BY r.id;

-- name: control_reply
-- A worker's answer (NULL: handled without a reply), announced to the sender at commit.
WITH answer AS (
    INSERT INTO akadze.control_replies (request_id, worker_id, worker_name, reply)
    VALUES (%(request_id)s, %(worker_id)s, %(worker_name)s, %(reply)s::jsonb)
    ON CONFLICT DO NOTHING
    RETURNING request_id
)
SELECT request_id, pg_notify('akadze_control_reply', request_id::text) IS NULL AS notified
FROM answer;

-- name: control_replies
-- The answers to one request so far, in the order they came.
SELECT worker_id, worker_name, reply FROM akadze.control_replies
WHERE request_id = %(request_id)s ORDER BY created_at, worker_id;

-- name: control_prune
-- Expired requests, and the replies whose request is gone.
WITH requests AS (
    DELETE FROM akadze.control_requests WHERE expires_at < now() RETURNING id
)
DELETE FROM akadze.control_replies AS p
WHERE p.request_id IN (SELECT id FROM requests)
   OR NOT EXISTS (SELECT 1 FROM akadze.control_requests AS r WHERE r.id = p.request_id);

-- name: control_scheduled
-- The jobs of %(queues)s waiting for their eta (countdowns, retries in backoff) that this
-- worker lists in inspect().scheduled(): each under one worker only, the live one with the
-- lowest id among those consuming its queue, so the fleet's replies add up to the truth.
SELECT id, task, queue, args, state, priority, scheduled_at, attempt, max_attempts, run_count,
       errors, result, meta, expires_at, cancel_requested, unique_key, worker_id,
       created_at, started_at, finished_at, upstreams, waiting_for, dependents, flow,
       upstream_results, position
FROM akadze.jobs AS j
WHERE j.state = 'queued' AND j.scheduled_at > now() AND j.queue = ANY (%(queues)s::text[])
  AND NOT EXISTS (SELECT 1 FROM akadze.workers AS w
                  WHERE w.id < %(worker_id)s AND j.queue = ANY (w.queues)
                    AND w.heartbeat_at > now() - w.heartbeat_ttl)
ORDER BY j.scheduled_at, j.id
LIMIT %(limit)s;

-- name: control_revoked
-- Task ids revoked within the last %(window)s seconds (cancelled or expired, or running
-- with a cancel requested), newest first: what Celery's workers keep in their revoked set
-- (task_id NULL: the caller derives it from the id, akadze_core.model.task_ids).
SELECT id, meta->>'task_id' AS task_id FROM (
    SELECT id, meta, finished_at AS revoked_at FROM akadze.jobs
    WHERE state = 'cancelled' AND finished_at > now() - %(window)s::float8 * interval '1 second'
    UNION ALL
    SELECT id, meta, now() FROM akadze.jobs WHERE state = 'running' AND cancel_requested
) AS revoked
ORDER BY revoked_at DESC
LIMIT %(limit)s;

-- name: metrics_job_counts
-- Prometheus (akadze_core.ops.metrics): jobs per queue and state, every state but succeeded,
-- each read from a partial index up to %(cap)s entries: queued (due) and scheduled (queued,
-- not due yet) from jobs_claim_idx, running from jobs_running_idx (bounded by the fleet's
-- slots), waiting, failed and cancelled from jobs_state_queue_idx; all but running
-- index-only. Never a scan of the table: a scrape costs the same behind a million
-- succeeded jobs; a state with more than %(cap)s jobs is reported as %(cap)s.
SELECT queue, state, count(*) AS jobs
FROM ((SELECT queue, CASE WHEN scheduled_at <= now() THEN 'queued' ELSE 'scheduled' END AS state
       FROM akadze.jobs WHERE state = 'queued' LIMIT %(cap)s)
      UNION ALL
      (SELECT queue, 'running' FROM akadze.jobs WHERE state = 'running' LIMIT %(cap)s)
      UNION ALL
      (SELECT queue, 'waiting' FROM akadze.jobs WHERE state = 'waiting' LIMIT %(cap)s)
      UNION ALL
      (SELECT queue, 'failed' FROM akadze.jobs WHERE state = 'failed' LIMIT %(cap)s)
      UNION ALL
      (SELECT queue, 'cancelled' FROM akadze.jobs WHERE state = 'cancelled' LIMIT %(cap)s)
     ) AS counted
GROUP BY queue, state;

-- name: metrics_state_estimates
-- Jobs per state in the whole table, estimated from the planner's statistics: the rows of
-- the last ANALYZE scaled to the table's current size (as the planner does), times each
-- state's frequency in pg_stats. Costs no read of the table; readable by any role that may
-- SELECT akadze.jobs. No rows before the first ANALYZE.
WITH size AS (
    SELECT CASE WHEN c.relpages > 0 AND c.reltuples >= 0
                THEN c.reltuples / c.relpages
                     * (pg_relation_size(c.oid) / current_setting('block_size')::float8)
           END AS rows
    FROM pg_class AS c WHERE c.oid = 'akadze.jobs'::regclass
)
SELECT f.state, round(size.rows * f.frequency)::bigint AS jobs
FROM size, pg_stats AS s
CROSS JOIN LATERAL unnest(s.most_common_vals::text::text[], s.most_common_freqs)
    AS f(state, frequency)
WHERE s.schemaname = 'akadze' AND s.tablename = 'jobs' AND s.attname = 'state'
  AND size.rows IS NOT NULL;

-- name: metrics_queues
-- Per queue: how long its oldest due job has waited since it was due (seconds, on the
-- database clock; 0 when none waits), and how many live workers serve it. The queues are
-- those with queued jobs and those of live workers. The queued side is a loose index scan
-- of jobs_claim_idx (queue, priority, scheduled_at): one probe per (queue, priority) pair,
-- whose first entry is its oldest job, at most %(groups)s pairs.
WITH RECURSIVE pairs AS (
    (SELECT queue, priority, 1 AS n FROM akadze.jobs
     WHERE state = 'queued' ORDER BY queue, priority LIMIT 1)
    UNION ALL
    SELECT next.queue, next.priority, pairs.n + 1
    FROM pairs CROSS JOIN LATERAL (
        SELECT j.queue, j.priority FROM akadze.jobs AS j
        WHERE j.state = 'queued' AND (j.queue, j.priority) > (pairs.queue, pairs.priority)
        ORDER BY j.queue, j.priority LIMIT 1) AS next
    WHERE pairs.n < %(groups)s
), oldest AS (
    SELECT pairs.queue, min(first.scheduled_at) AS due_since
    FROM pairs LEFT JOIN LATERAL (
        SELECT j.scheduled_at FROM akadze.jobs AS j
        WHERE j.state = 'queued' AND j.queue = pairs.queue AND j.priority = pairs.priority
          AND j.scheduled_at <= now()
        ORDER BY j.scheduled_at LIMIT 1) AS first ON true
    GROUP BY pairs.queue
), served AS (
    SELECT q.queue, count(*) AS workers
    FROM akadze.workers AS w CROSS JOIN LATERAL unnest(w.queues) AS q(queue)
    WHERE w.heartbeat_at > now() - w.heartbeat_ttl
    GROUP BY q.queue
)
SELECT coalesce(oldest.queue, served.queue) AS queue,
       coalesce(extract(epoch FROM now() - oldest.due_since)::float8, 0) AS oldest_age,
       coalesce(served.workers, 0) AS workers
FROM oldest FULL JOIN served ON served.queue = oldest.queue
ORDER BY 1;

-- name: metrics_workers
-- Registered workers, and those whose heartbeat is within their own TTL (database clock).
SELECT count(*) AS registered,
       count(*) FILTER (WHERE heartbeat_at > now() - heartbeat_ttl) AS live
FROM akadze.workers;

-- name: metrics_recent
-- The jobs finished in the last %(window)s seconds, the newest %(cap)s of each final state
-- (jobs_finished_idx: state, finished_at), as three grouping sets: jobs per queue, task and
-- state; the enqueue-to-start latency (started_at - scheduled_at: since the job was due)
-- per queue and bucket; the run time (finished_at - started_at) per task and bucket.
-- Bucket i counts the values in [bounds[i], bounds[i+1]) (width_bucket); 0 is below
-- bounds[1]. Jobs that never started (cancelled first) have neither duration.
WITH recent AS (
    (SELECT queue, task, state, scheduled_at, started_at, finished_at FROM akadze.jobs
     WHERE state = 'succeeded' AND finished_at > now() - %(window)s * interval '1 second'
     ORDER BY finished_at DESC LIMIT %(cap)s)
    UNION ALL
    (SELECT queue, task, state, scheduled_at, started_at, finished_at FROM akadze.jobs
     WHERE state = 'failed' AND finished_at > now() - %(window)s * interval '1 second'
     ORDER BY finished_at DESC LIMIT %(cap)s)
    UNION ALL
    (SELECT queue, task, state, scheduled_at, started_at, finished_at FROM akadze.jobs
     WHERE state = 'cancelled' AND finished_at > now() - %(window)s * interval '1 second'
     ORDER BY finished_at DESC LIMIT %(cap)s)
), timed AS (
    -- greatest() skips a NULL: a job that never started must stay NULL (no duration).
    SELECT queue, task, state,
           CASE WHEN started_at IS NOT NULL
                THEN greatest(extract(epoch FROM started_at - scheduled_at)::float8, 0) END
               AS wait,
           CASE WHEN started_at IS NOT NULL
                THEN greatest(extract(epoch FROM finished_at - started_at)::float8, 0) END
               AS run
    FROM recent
), bucketed AS (
    SELECT queue, task, state, wait, run,
           width_bucket(wait, %(bounds)s::float8[]) AS wait_bucket,
           width_bucket(run, %(bounds)s::float8[]) AS run_bucket
    FROM timed
)
SELECT queue, task, state, wait_bucket, run_bucket, count(*) AS jobs,
       sum(wait) AS wait_sum, sum(run) AS run_sum,
       GROUPING(queue, task, state, wait_bucket, run_bucket) AS grouping_id
FROM bucketed
GROUP BY GROUPING SETS ((queue, task, state), (queue, wait_bucket), (task, run_bucket));

-- name: queue_pause
-- Pause a queue for the whole fleet (akadze.queue_pause in functions.sql): true when it was
-- not paused already. Returns once the claims of the queue under way have committed.
SELECT akadze.queue_pause(%(queue)s::text, %(by)s::text) AS changed;

-- name: queue_resume
-- Resume a paused queue and wake its idle workers (akadze.queue_resume): true when it was
-- paused.
SELECT akadze.queue_resume(%(queue)s::text) AS changed;

-- name: queue_paused
-- The paused queues, in name order: when and by whom each was paused.
SELECT queue, paused_at, paused_by FROM akadze.queue_pauses ORDER BY queue;

-- name: queue_list
-- Every queue the database knows of (those with queued jobs, those of live workers, the
-- paused ones), whether it is paused, its due jobs (counted up to %(cap)s) and live workers.
WITH RECURSIVE queued(queue) AS (
    -- A loose index scan of jobs_claim_idx: one probe per queue with queued jobs.
    (SELECT queue FROM akadze.jobs WHERE state = 'queued' ORDER BY queue LIMIT 1)
    UNION ALL
    SELECT (SELECT j.queue FROM akadze.jobs AS j
            WHERE j.state = 'queued' AND j.queue > queued.queue ORDER BY j.queue LIMIT 1)
    FROM queued WHERE queued.queue IS NOT NULL
), known AS (
    SELECT queue FROM queued WHERE queue IS NOT NULL
    UNION
    SELECT q.queue FROM akadze.workers AS w CROSS JOIN LATERAL unnest(w.queues) AS q(queue)
    WHERE w.heartbeat_at > now() - w.heartbeat_ttl
    UNION
    SELECT queue FROM akadze.queue_pauses
)
SELECT k.queue, p.queue IS NOT NULL AS paused, p.paused_at, p.paused_by,
       (SELECT count(*) FROM (SELECT 1 FROM akadze.jobs AS j
                              WHERE j.state = 'queued' AND j.queue = k.queue
                                AND j.scheduled_at <= now() LIMIT %(cap)s) AS due) AS due,
       (SELECT count(*) FROM akadze.workers AS w
        WHERE k.queue = ANY(w.queues) AND w.heartbeat_at > now() - w.heartbeat_ttl) AS workers
FROM known AS k LEFT JOIN akadze.queue_pauses AS p ON p.queue = k.queue
ORDER BY k.queue;
-- name: limit_set
-- Set a rate limit (kind 'queue' or 'task'); the claims read it from their next one on.
INSERT INTO akadze.limits (kind, name, rate, period)
VALUES (%(kind)s, %(name)s, %(rate)s, %(period)s::float8 * interval '1 second')
ON CONFLICT (kind, name) DO UPDATE SET rate = excluded.rate, period = excluded.period
RETURNING 1;

-- name: limit_clear
-- Remove a rate limit (its ledger goes with it); whether there was one.
DELETE FROM akadze.limits WHERE kind = %(kind)s AND name = %(name)s RETURNING 1;

-- name: limit_list
SELECT kind, name, rate, extract(epoch FROM period)::float8 AS period
FROM akadze.limits ORDER BY kind, name;

-- name: limit_wait
-- Seconds until the first start under a limit that binds the claims of a queue leaves its
-- window (NULL: no such start): when a claim cut short by a limit may find room again.
SELECT extract(epoch FROM min(s.started_at + l.period) - clock_timestamp())::float8 AS wait
FROM akadze.limits AS l
CROSS JOIN LATERAL (
    SELECT min(x.started_at) AS started_at FROM akadze.limit_starts AS x
    WHERE x.kind = l.kind AND x.name = l.name AND x.started_at > clock_timestamp() - l.period
) AS s
WHERE l.kind = 'task' OR (l.kind = 'queue' AND l.name = %(queue)s);

-- name: limit_queues
-- Which of these queues' claims go through the limited claim now.
SELECT q.name FROM unnest(%(queues)s::text[]) AS q(name) WHERE akadze.claim_is_limited(q.name);
