-- The Citus dialect (App(citus=True)): the statements of sql/queries.sql that Citus cannot
-- run as written, by the same names. Every other statement of sql/queries.sql runs as it is
-- when its name is in akadze_core/store/queries.py's CITUS_AS_IS, and is refused with a
-- clear error otherwise. Each statement on akadze.jobs names one shard, or calls a function
-- of sql/citus/functions.sql that does so shard by shard.

-- name: job_insert
SELECT id, notified FROM akadze.citus_enqueue(
    %(task)s, %(queue)s, %(args)s::jsonb, %(priority)s, %(scheduled_at)s::timestamptz,
    %(delay)s::float8, %(max_attempts)s, %(expires_at)s::timestamptz, NULL, %(meta)s::jsonb);

-- name: job_insert_quiet
-- Citus: citus_enqueue sends the notice with the insert; it is never skipped (no notice owed
-- after the commit, so job_notice_send, which reads the row by id alone, is never run).
SELECT id, false AS owes_notice FROM akadze.citus_enqueue(
    %(task)s, %(queue)s, %(args)s::jsonb, %(priority)s, %(scheduled_at)s::timestamptz,
    %(delay)s::float8, %(max_attempts)s, %(expires_at)s::timestamptz, NULL, %(meta)s::jsonb);

-- name: job_insert_unique
SELECT id, notified, inserted FROM akadze.citus_enqueue(
    %(task)s, %(queue)s, %(args)s::jsonb, %(priority)s, %(scheduled_at)s::timestamptz,
    %(delay)s::float8, %(max_attempts)s, %(expires_at)s::timestamptz, %(unique_key)s,
    %(meta)s::jsonb);

-- name: job_insert_many
SELECT ids, notified FROM akadze.citus_enqueue_many(
    %(task)s, %(queue)s, %(args)b::text[], %(priority)s, %(scheduled_at)s::timestamptz,
    %(delay)s::float8, %(max_attempts)s, %(expires_at)s::timestamptz, %(meta)s::jsonb);

-- name: job_claim
SELECT * FROM akadze.citus_claim_jobs(
    %(lock_timeout)s::text, %(queue)s::text, %(limit)s::integer, %(worker_id)s::bigint,
    %(floor_priority)s::integer[], %(floor_at)s::timestamptz[], %(floor_id)s::bigint[]);

-- name: job_complete_many
SELECT * FROM akadze.citus_complete_jobs(
    %(lock_timeout)s::text, %(id)s::bigint[], %(run_count)s::int[], %(claim_token)s::bigint[],
    %(kind)s::text[], %(result)s::text[], %(delay)s::float8[], %(error)s::text[],
    %(max_attempts)s::int[]);

-- name: job_request_cancel
SELECT id, state, notified FROM akadze.citus_cancel(%(id)s::bigint, %(signal)s::smallint);

-- name: job_requeue
SELECT id, notified FROM akadze.citus_requeue(%(id)s::bigint);

-- name: job_rescue
SELECT * FROM akadze.citus_rescue(%(cap)s::float8);

-- name: job_prune
-- One row per job deleted: the caller counts the rows.
SELECT FROM generate_series(1, akadze.citus_prune(
    %(finished_retention)s::float8, %(failed_retention)s::float8, %(limit)s::integer));

-- name: job_get
SELECT id, task, queue, args, state, priority, scheduled_at, attempt, max_attempts, run_count,
       errors, result, meta, expires_at, cancel_requested, unique_key, worker_id,
       created_at, started_at, finished_at, upstreams, waiting_for, dependents, flow,
       upstream_results, position
FROM akadze.jobs WHERE shard = akadze.citus_shard_of(%(id)s::bigint) AND id = %(id)s;

-- name: job_update_meta
UPDATE akadze.jobs SET meta = meta || %(patch)s::jsonb
WHERE shard = akadze.citus_shard_of(%(id)s::bigint) AND id = %(id)s
  AND run_count = %(run_count)s AND claim_token = %(claim_token)s AND state = 'running'
RETURNING id;

-- name: job_return_many
SELECT id, notified FROM akadze.citus_return(
    %(id)s::bigint[], %(run_count)s::int[], %(claim_token)s::bigint[]);

-- name: job_return_orphans
SELECT id, run_count, notified FROM akadze.citus_return_orphans(
    %(worker_id)s::bigint, %(known)s::bigint[]);

-- name: schedule_enqueue
SELECT id, notified FROM akadze.citus_schedule_enqueue(
    %(name)s, %(spec)s, %(tick)s, %(expected)s::timestamptz, %(task)s, %(queue)s,
    %(args)s::jsonb, %(priority)s, %(max_attempts)s, %(expires_at)s::timestamptz,
    %(meta)s::jsonb);

-- name: queue_list
SELECT * FROM akadze.citus_queue_list(%(cap)s::integer);

-- name: control_send
SELECT id, notified FROM akadze.citus_control_send(
    %(command)s, %(arguments)s::jsonb, %(targets)s::bigint[], %(reply)s, %(ttl)s::float8);

-- name: control_reply
SELECT request_id, notified FROM akadze.citus_control_reply(
    %(request_id)s, %(worker_id)s, %(worker_name)s, %(reply)s::jsonb);

-- name: schedule_runtime_add
SELECT name, source, spec, task, args, queue, priority, max_attempts, expires, meta, paused,
       version, created_at, changed_at, last_run, true AS notified
FROM akadze.citus_schedule_runtime_add(
    %(name)s, %(spec)s, %(task)s, %(args)s::jsonb, %(queue)s, %(priority)s,
    %(max_attempts)s, %(expires)s::interval, %(meta)s::jsonb, %(paused)s, %(replace)s);

-- name: schedule_runtime_pause
SELECT name, notified FROM akadze.citus_schedule_runtime_pause(%(name)s, %(paused)s);

-- name: schedule_runtime_remove
SELECT name, notified FROM akadze.citus_schedule_runtime_remove(%(name)s);

-- name: schedule_runtime_enqueue
SELECT queue, jobs, notified FROM akadze.citus_schedule_runtime_enqueue(%(due)s::jsonb);

-- name: job_claim_fair
SELECT * FROM akadze.citus_claim_jobs_fair(
    %(lock_timeout)s::text, %(queue)s::text, %(limit)s::integer, %(worker_id)s::bigint,
    %(after_task)s::text);

-- name: fair_index_create
-- The fair claim's loose scan within one shard (citus_claim_jobs_fair).
CREATE INDEX CONCURRENTLY IF NOT EXISTS jobs_fair_claim_idx
    ON akadze.jobs (shard, queue, task, priority, scheduled_at, id) WHERE state = 'queued';

-- name: job_complete_in_tx
SELECT id, notified FROM akadze.citus_complete_in_tx(
    %(id)s::bigint, %(run_count)s::integer, %(claim_token)s::bigint, %(result)s::jsonb);

-- name: job_insert_graph
SELECT ids, notified, refused, linked FROM akadze.citus_insert_graph(
    %(templates)s::jsonb, %(nodes)b::text[], %(chunk_template)b::int[],
    %(external)s::bigint[], %(external_ref)s::bigint[], %(external_node)s::int[]);

-- name: job_insert_rows
-- A group: a workflow without edges, all in one shard (its first job's).
SELECT ids, notified FROM akadze.citus_insert_graph(
    %(templates)s::jsonb, %(nodes)b::text[], %(chunk_template)b::int[], '{}', '{}', '{}');

-- name: job_hand_over
SELECT id, moved, target FROM akadze.citus_hand_over(
    %(id)s::bigint, %(run_count)s::integer, %(claim_token)s::bigint, %(to)s::bigint);

-- name: limit_queues
-- Citus mode has no limited claim: setting a rate limit (limit_set) is refused, and so is a
-- job with a concurrency key, at enqueue. No queue is limited.
SELECT q.name FROM unnest(%(queues)s::text[]) AS q(name) WHERE false;
