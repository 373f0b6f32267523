-- Citus mode: the functions the Citus dialect's statements (sql/citus/queries.sql) call.
-- Applied by `akadze migrate --citus` after sql/functions.sql, one statement at a time (each
-- block ends at a line holding only `-- statement`), again whenever its checksum changes.
--
-- What every function here keeps to, for Citus to route it:
-- * each statement on akadze.jobs names one shard (`shard = <value>`): a router query on one
--   node, where FOR UPDATE SKIP LOCKED is allowed;
-- * the clock is bound once (v_now) and passed in, never now()/random() inside a CASE or an
--   UPDATE of the distributed table (Citus refuses to push volatile calls down);
-- * no STABLE function takes a column in an UPDATE (Citus cannot evaluate it on the
--   coordinator): times are computed as epoch seconds (to_timestamp is immutable) and JSON
--   is built from text, not by jsonb_build_object;
-- * notifications are statements of their own on the coordinator (PERFORM pg_notify), where
--   the listeners are, never in a RETURNING or a CTE.

-- The shard of an id: its low ten bits.
CREATE OR REPLACE FUNCTION akadze.citus_shard_of(p_id bigint) RETURNS integer
LANGUAGE sql IMMUTABLE PARALLEL SAFE
RETURN mod(p_id, 1024)::integer
-- statement

-- The shard of a new job, from its tenant (meta "tenant"), else its unique key, else its
-- queue spread over the queue's lanes by a hash of the args: whatever shares a tenant or a
-- key shares a shard, so per-shard uniqueness is uniqueness for them. 16 slots: a claim of an
-- empty queue reads each once; Citus maps the slots onto its shards (citus.shard_count).
CREATE OR REPLACE FUNCTION akadze.citus_shard_for(
    p_meta jsonb, p_unique_key text, p_queue text, p_args jsonb, p_lanes integer)
RETURNS integer
LANGUAGE sql IMMUTABLE PARALLEL SAFE
RETURN CASE
    WHEN p_meta ? 'tenant' THEN mod(abs(hashtext('t' || (p_meta ->> 'tenant'))::bigint), 16)
    WHEN p_unique_key IS NOT NULL THEN mod(abs(hashtext('u' || p_unique_key)::bigint), 16)
    ELSE mod(abs(hashtext('q' || p_queue)::bigint)
             + mod(abs(hashtext(p_args::text)::bigint), greatest(p_lanes, 1)), 16)
END::integer
-- statement

-- Enqueue one job (job_insert, job_insert_unique): the row routed to its shard, then the
-- wake-up as a coordinator statement of the same transaction (heard at commit).
CREATE OR REPLACE FUNCTION akadze.citus_enqueue(
    p_task text, p_queue text, p_args jsonb, p_priority integer, p_scheduled_at timestamptz,
    p_delay float8, p_max_attempts integer, p_expires_at timestamptz, p_unique_key text,
    p_meta jsonb)
RETURNS TABLE (id bigint, notified boolean, inserted boolean)
LANGUAGE plpgsql VOLATILE
AS $$
DECLARE
    v_now timestamptz := now();
    v_shard integer := akadze.citus_shard_for(
        p_meta, p_unique_key, p_queue, p_args, (SELECT lanes FROM akadze.citus_settings));
    v_id bigint := nextval('akadze.citus_job_numbers') * 1024 + v_shard;
    v_at timestamptz := coalesce(p_scheduled_at, v_now + p_delay * interval '1 second');
    v_found bigint;
BEGIN
    INSERT INTO akadze.jobs AS j (id, shard, task, queue, args, priority, scheduled_at,
                                  max_attempts, expires_at, unique_key, meta, created_at)
    VALUES (v_id, v_shard, p_task, p_queue, p_args, p_priority, v_at, p_max_attempts,
            p_expires_at, p_unique_key, p_meta, v_now)
    ON CONFLICT (shard, unique_key) WHERE unique_key IS NOT NULL AND state IN ('queued', 'running')
    DO NOTHING;
    IF NOT FOUND THEN
        -- The active job holding the key, in the same shard (the key chose it).
        SELECT j.id INTO v_found FROM akadze.jobs AS j
        WHERE j.shard = v_shard AND j.unique_key = p_unique_key
          AND j.state IN ('queued', 'running')
        LIMIT 1;
        RETURN QUERY SELECT v_found, NULL::boolean, false;
        RETURN;
    END IF;
    IF v_at <= v_now THEN
        PERFORM pg_notify('akadze_jobs', akadze.job_notice(p_queue, p_priority, v_at));
    END IF;
    RETURN QUERY SELECT v_id, v_at <= v_now, true;
END
$$
-- statement

-- Claim up to p_limit due jobs of a queue: one router statement per shard, from a random
-- shard on (claimers of one queue spread over its shards), until the limit is met. Order is
-- (priority, scheduled_at, id) within a shard, not across shards. The floors are ignored:
-- each shard's claim index is read from its head.
CREATE OR REPLACE FUNCTION akadze.citus_claim_jobs(
    p_lock_timeout text, p_queue text, p_limit integer, p_worker_id bigint,
    p_floor_priority integer[], p_floor_at timestamptz[], p_floor_id bigint[])
RETURNS SETOF akadze.citus_claimed
LANGUAGE plpgsql VOLATILE
AS $$
DECLARE
    v_now timestamptz := now();
    v_start integer := floor(random() * 16)::integer;
    v_shard integer;
    v_token bigint;
    v_rows akadze.citus_claimed[] := '{}';
    v_batch akadze.citus_claimed[];
    -- Jobs of a workflow cancelled at the claim: what waits on them ends too.
    v_settle bigint[];
BEGIN
    IF p_lock_timeout IS NOT NULL THEN
        PERFORM set_config('lock_timeout', p_lock_timeout, true);
    END IF;
    -- A paused queue gives nothing, exactly once its pause committed (akadze.queue_claimable).
    IF NOT akadze.queue_claimable(p_queue) THEN
        RETURN;
    END IF;
    FOR step IN 0..15 LOOP
        EXIT WHEN cardinality(v_rows) >= p_limit;
        v_shard := mod(v_start + step, 16);
        -- The run's fencing token (with run_count), one per shard's batch: the id tells the
        -- runs of a batch apart.
        v_token := floor(random() * 9007199254740992)::bigint;
        WITH chosen AS (
            SELECT j.id FROM akadze.jobs AS j
            WHERE j.shard = v_shard AND j.state = 'queued' AND j.queue = p_queue
              AND j.scheduled_at <= v_now
            ORDER BY j.priority, j.scheduled_at, j.id
            LIMIT p_limit - cardinality(v_rows)
            FOR UPDATE SKIP LOCKED
        ),
        claimed AS (
            UPDATE akadze.jobs AS j
            SET state = CASE WHEN j.cancel_requested OR j.expires_at <= v_now
                             THEN 'cancelled' ELSE 'running' END,
                run_count = j.run_count + CASE WHEN j.cancel_requested OR j.expires_at <= v_now
                                               THEN 0 ELSE 1 END,
                attempt = j.attempt + CASE WHEN j.cancel_requested OR j.expires_at <= v_now
                                           THEN 0 ELSE 1 END,
                worker_id = CASE WHEN j.cancel_requested OR j.expires_at <= v_now
                                 THEN NULL ELSE p_worker_id END,
                started_at = v_now,
                claim_token = v_token,
                finished_at = CASE WHEN j.cancel_requested OR j.expires_at <= v_now
                                   THEN v_now END
            FROM chosen
            WHERE j.shard = v_shard AND j.id = chosen.id
            RETURNING j.*
        )
        SELECT array_agg(ROW(c.id, c.task, c.queue, c.args::text, c.state, c.priority,
                             c.scheduled_at, c.attempt, c.max_attempts, c.run_count,
                             c.claim_token, c.expires_at, c.meta::text, c.created_at,
                             c.started_at, c.cancel_requested, (c.errors -> -1)::text,
                             c.upstreams, c.upstream_results::text, c.flow ->> 'result_arg',
                             c.position,
                             -- Flushed at once when it may release a job that waits on it
                             -- (as on one server: a fan-in's member gathers like a plain
                             -- job until few upstreams are left).
                             c.dependents IS NOT NULL AND EXISTS (
                                 SELECT 1 FROM akadze.jobs AS d
                                 WHERE d.shard = v_shard AND d.id = ANY(c.dependents)
                                   AND d.state = 'waiting' AND d.waiting_for <= p_limit),
                             NULL::boolean)
                         ::akadze.citus_claimed),
               array_agg(c.id) FILTER (WHERE c.state = 'cancelled'
                                       AND (c.dependents IS NOT NULL
                                            OR c.on_failure IS NOT NULL))
        INTO v_batch, v_settle FROM claimed AS c;
        v_rows := v_rows || coalesce(v_batch, '{}');
        IF v_settle IS NOT NULL THEN
            PERFORM akadze.citus_settle(v_shard, v_settle);
        END IF;
    END LOOP;
    -- Cancelled at the claim (cancel requested or expired while queued): whoever waits hears.
    PERFORM pg_notify('akadze_done', r.id::text) FROM unnest(v_rows) AS r
    WHERE r.state = 'cancelled';
    RETURN QUERY SELECT * FROM unnest(v_rows) AS r
                 ORDER BY r.priority, r.scheduled_at, r.id;
END
$$
-- statement

-- Write a batch of run outcomes (job_complete_many): the batch split by shard, one router
-- statement per shard, each row fenced by run_count and claim_token as on one server. The
-- seed rules are the single-server ones, with the clock bound once.
CREATE OR REPLACE FUNCTION akadze.citus_complete_jobs(
    p_lock_timeout text, p_id bigint[], p_run_count integer[], p_claim_token bigint[],
    p_kind text[], p_result text[], p_delay float8[], p_error text[], p_max_attempts integer[])
RETURNS SETOF akadze.citus_completed
LANGUAGE plpgsql VOLATILE
AS $$
DECLARE
    v_now timestamptz := now();
    v_epoch float8 := extract(epoch FROM v_now);
    v_at text := to_jsonb(v_now)::text;
    v_shard integer;
    v_rows akadze.citus_completed[] := '{}';
    v_batch akadze.citus_completed[];
    v_settle bigint[];
    -- What settle changed (NULL: it did not run): the worker claims a released job at once.
    v_touched integer;
BEGIN
    IF p_lock_timeout IS NOT NULL THEN
        PERFORM set_config('lock_timeout', p_lock_timeout, true);
    END IF;
    FOR v_shard IN SELECT DISTINCT akadze.citus_shard_of(i) FROM unnest(p_id) AS i ORDER BY 1
    LOOP
        WITH outcome AS (
            SELECT * FROM unnest(p_id, p_run_count, p_claim_token, p_kind, p_result, p_delay,
                                 p_error, p_max_attempts)
                AS o(id, run_count, claim_token, kind, result, delay, error, max_attempts)
            WHERE akadze.citus_shard_of(o.id) = v_shard
        ),
        decided AS (
            SELECT o.*, j.attempt,
                   greatest(j.max_attempts, coalesce(o.max_attempts, 0)) AS budget,
                   CASE
                       WHEN o.kind = 'success' THEN 'succeeded'
                       WHEN o.kind = 'cancel' THEN 'cancelled'
                       WHEN j.cancel_requested OR j.expires_at <= v_now THEN 'cancelled'
                       WHEN o.kind = 'unstarted' THEN 'queued'
                       WHEN o.kind = 'fail' THEN 'failed'
                       WHEN o.kind = 'snooze' THEN 'queued'
                       WHEN j.attempt >= greatest(j.max_attempts, coalesce(o.max_attempts, 0))
                           THEN 'failed'
                       ELSE 'queued'
                   END AS next_state,
                   (o.kind IN ('snooze', 'unstarted')
                    OR (o.kind IN ('retry', 'fail', 'cancel')
                        AND (j.cancel_requested OR j.expires_at <= v_now)))
                       AS gives_back_attempt
            FROM outcome AS o
            JOIN akadze.jobs AS j ON j.shard = v_shard AND j.id = o.id
            WHERE j.shard = v_shard AND j.run_count = o.run_count
              AND j.claim_token = o.claim_token AND j.state = 'running'
            FOR UPDATE OF j
        ),
        updated AS (
            UPDATE akadze.jobs AS j
            SET state = d.next_state,
                attempt = j.attempt - CASE WHEN d.gives_back_attempt THEN 1 ELSE 0 END,
                max_attempts = d.budget,
                result = CASE WHEN d.kind = 'success' THEN d.result::jsonb ELSE j.result END,
                -- An array || an object appends the object.
                errors = CASE WHEN d.error IS NULL THEN j.errors
                              ELSE j.errors || (d.error::jsonb || (
                                  '{"attempt": ' || j.attempt::text || ', "at": ' || v_at
                                  || '}')::jsonb)
                         END,
                scheduled_at = CASE WHEN d.next_state = 'queued'
                                    THEN to_timestamp(v_epoch + d.delay)
                                    ELSE j.scheduled_at END,
                worker_id = NULL,
                finished_at = CASE WHEN d.next_state = 'queued' THEN NULL ELSE v_now END
            FROM decided AS d
            WHERE j.shard = v_shard AND j.id = d.id
            RETURNING j.id, j.run_count, j.state, j.queue, j.priority, j.scheduled_at,
                      (j.dependents IS NOT NULL OR j.on_failure IS NOT NULL) AS settles
        )
        SELECT array_agg(ROW(u.id, u.run_count, u.state, u.queue, u.priority, u.scheduled_at,
                             NULL::integer)::akadze.citus_completed),
               array_agg(u.id) FILTER (WHERE u.state <> 'queued' AND u.settles)
        INTO v_batch, v_settle FROM updated AS u;
        v_rows := v_rows || coalesce(v_batch, '{}');
        -- Workflows: the dependents and errbacks of the jobs that finished, in their shard.
        IF v_settle IS NOT NULL THEN
            v_touched := coalesce(v_touched, 0) + akadze.citus_settle(v_shard, v_settle);
        END IF;
    END LOOP;
    -- Whoever waits for a result hears of finished jobs: a coordinator statement, 500 ids
    -- a notification.
    PERFORM pg_notify('akadze_done', string_agg(d.id::text, ','))
    FROM (SELECT r.id, (row_number() OVER ()) / 500 AS chunk
          FROM unnest(v_rows) AS r WHERE r.state <> 'queued') AS d
    GROUP BY d.chunk;
    RETURN QUERY SELECT r.id, r.run_count, r.state, r.queue, r.priority, r.scheduled_at,
                        v_touched FROM unnest(v_rows) AS r;
END
$$
-- statement

-- Cancel one job by id (job_request_cancel): its shard from its id.
CREATE OR REPLACE FUNCTION akadze.citus_cancel(p_id bigint, p_signal smallint)
RETURNS TABLE (id bigint, state text, notified boolean)
LANGUAGE plpgsql VOLATILE
AS $$
DECLARE
    v_now timestamptz := now();
    v_state text;
    v_signal smallint;
    v_settles boolean;
BEGIN
    UPDATE akadze.jobs AS j
    SET cancel_requested = true,
        cancel_signal = CASE WHEN j.state = 'running'
                             THEN coalesce(p_signal, j.cancel_signal)
                             ELSE j.cancel_signal END,
        state = CASE WHEN j.state IN ('queued', 'waiting') THEN 'cancelled' ELSE j.state END,
        finished_at = CASE WHEN j.state IN ('queued', 'waiting') THEN v_now
                           ELSE j.finished_at END
    WHERE j.shard = akadze.citus_shard_of(p_id) AND j.id = p_id
      AND j.state IN ('waiting', 'queued', 'running')
    RETURNING j.state, j.cancel_signal, j.dependents IS NOT NULL
    INTO v_state, v_signal, v_settles;
    IF NOT FOUND THEN
        RETURN;
    END IF;
    -- A waiting or queued job of a workflow: what waits on it is cancelled with it.
    IF v_state = 'cancelled' AND v_settles THEN
        PERFORM akadze.citus_settle(akadze.citus_shard_of(p_id), ARRAY[p_id]);
    END IF;
    IF v_state = 'cancelled' THEN
        PERFORM pg_notify('akadze_done', p_id::text);
    ELSIF v_signal IS NOT NULL THEN
        PERFORM pg_notify('akadze_cancel', p_id::text || ':' || v_signal::text);
    ELSE
        PERFORM pg_notify('akadze_cancel', p_id::text);
    END IF;
    RETURN QUERY SELECT p_id, v_state, true;
END
$$
-- statement

-- Requeue a failed job by id (job_requeue). A newer active job holding its unique key wins;
-- keys live in one shard, so the check is the job's own shard.
CREATE OR REPLACE FUNCTION akadze.citus_requeue(p_id bigint)
RETURNS TABLE (id bigint, notified boolean)
LANGUAGE plpgsql VOLATILE
AS $$
DECLARE
    v_now timestamptz := now();
    v_shard integer := akadze.citus_shard_of(p_id);
    v_queue text;
BEGIN
    UPDATE akadze.jobs AS j
    SET state = 'queued', scheduled_at = v_now, finished_at = NULL, cancel_requested = false,
        cancel_signal = NULL, max_attempts = greatest(j.max_attempts, j.attempt + 1)
    WHERE j.shard = v_shard AND j.id = p_id AND j.state = 'failed'
      AND NOT EXISTS (SELECT 1 FROM akadze.jobs AS holder
                      WHERE holder.shard = v_shard AND holder.unique_key = j.unique_key
                        AND holder.state IN ('queued', 'running'))
    RETURNING j.queue INTO v_queue;
    IF NOT FOUND THEN
        RETURN;
    END IF;
    PERFORM pg_notify('akadze_jobs', v_queue);
    RETURN QUERY SELECT p_id, true;
END
$$
-- statement

-- Return the running jobs of dead workers (job_rescue), shard by shard. The dead workers'
-- rows go first (a reference table, on every node), so two rescuers rescue each job once.
-- The backoff's jitter is a hash of the id and a seed bound once: random() may not run
-- inside an UPDATE of a distributed table.
CREATE OR REPLACE FUNCTION akadze.citus_rescue(p_cap float8)
RETURNS SETOF akadze.citus_rescued
LANGUAGE plpgsql VOLATILE
AS $$
DECLARE
    v_now timestamptz := now();
    v_epoch float8 := extract(epoch FROM v_now);
    v_at text := to_jsonb(v_now)::text;
    v_seed text := random()::text;
    v_dead bigint[];
    v_live bigint[];
    v_rows akadze.citus_rescued[] := '{}';
    v_batch akadze.citus_rescued[];
    v_settle bigint[];
BEGIN
    -- Locked, then deleted: a heartbeat committed meanwhile is re-read under the lock.
    SELECT coalesce(array_agg(d.id), '{}') INTO v_dead
    FROM (SELECT w.id FROM akadze.workers AS w
          WHERE w.heartbeat_at < v_now - w.heartbeat_ttl FOR UPDATE) AS d;
    DELETE FROM akadze.workers AS w WHERE w.id = ANY(v_dead);
    SELECT coalesce(array_agg(w.id), '{}') INTO v_live FROM akadze.workers AS w;
    FOR v_shard IN 0..15 LOOP
        WITH lost AS (
            SELECT j.id FROM akadze.jobs AS j
            WHERE j.shard = v_shard AND j.state = 'running'
              AND (j.worker_id = ANY(v_dead)
                   -- A worker registered after v_live was read started its runs after v_now.
                   OR (NOT (j.worker_id = ANY(v_live)) AND j.started_at < v_now))
            FOR UPDATE OF j SKIP LOCKED
        ),
        rescued AS (
            UPDATE akadze.jobs AS j
            SET state = CASE WHEN j.cancel_requested OR j.expires_at <= v_now THEN 'cancelled'
                             WHEN j.attempt >= j.max_attempts THEN 'failed'
                             ELSE 'queued' END,
                errors = j.errors || ('{"attempt": ' || j.attempt::text || ', "at": ' || v_at
                    || ', "type": "WorkerLost", "message": '
                    || '"the worker running this job stopped heartbeating", "traceback": null, '
                    || '"worker_id": ' || coalesce(j.worker_id::text, 'null') || '}')::jsonb,
                -- The exponent is bounded first: power(2, 1024) overflows double precision.
                scheduled_at = to_timestamp(v_epoch
                    + least(power(2, least(greatest(j.attempt - 1, 0), 63)), p_cap)
                      * (0.5 + mod(abs(hashtext(j.id::text || v_seed)::bigint), 1000)::float8
                               / 2000.0::float8)),
                worker_id = NULL,
                finished_at = CASE WHEN j.cancel_requested OR j.expires_at <= v_now
                                     OR j.attempt >= j.max_attempts THEN v_now END
            FROM lost
            WHERE j.shard = v_shard AND j.id = lost.id
            RETURNING j.id, j.state, j.queue, j.task, j.attempt, j.max_attempts,
                      extract(epoch FROM j.scheduled_at - v_now)::float8 AS retry_in,
                      (j.dependents IS NOT NULL OR j.on_failure IS NOT NULL) AS settles
        )
        SELECT array_agg(ROW(r.id, r.state, r.queue, r.task, r.attempt, r.max_attempts,
                             r.retry_in, NULL::boolean)::akadze.citus_rescued),
               array_agg(r.id) FILTER (WHERE r.state <> 'queued' AND r.settles)
        INTO v_batch, v_settle FROM rescued AS r;
        v_rows := v_rows || coalesce(v_batch, '{}');
        IF v_settle IS NOT NULL THEN
            PERFORM akadze.citus_settle(v_shard, v_settle);
        END IF;
    END LOOP;
    PERFORM pg_notify('akadze_done', r.id::text) FROM unnest(v_rows) AS r
    WHERE r.state <> 'queued';
    PERFORM pg_notify('akadze_jobs', q.queue)
    FROM (SELECT DISTINCT r.queue FROM unnest(v_rows) AS r WHERE r.state = 'queued') AS q;
    RETURN QUERY SELECT * FROM unnest(v_rows);
END
$$
-- statement

-- Delete finished jobs past their retention (job_prune), up to p_limit, shard by shard.
CREATE OR REPLACE FUNCTION akadze.citus_prune(
    p_finished_retention float8, p_failed_retention float8, p_limit integer)
RETURNS integer
LANGUAGE plpgsql VOLATILE
AS $$
DECLARE
    v_now timestamptz := now();
    v_done integer := 0;
    v_count integer;
BEGIN
    FOR v_shard IN 0..15 LOOP
        EXIT WHEN v_done >= p_limit;
        WITH doomed AS (
            SELECT j.id FROM akadze.jobs AS j
            WHERE j.shard = v_shard
              AND ((j.state IN ('succeeded', 'cancelled')
                    AND j.finished_at < v_now - p_finished_retention * interval '1 second')
                   OR (j.state = 'failed'
                       AND j.finished_at < v_now - p_failed_retention * interval '1 second'))
              -- A succeeded job whose dependents still wait keeps its result until they are
              -- released (they are in its shard: a workflow is never split).
              AND (j.dependents IS NULL OR NOT EXISTS (
                  SELECT 1 FROM akadze.jobs AS w
                  WHERE w.shard = v_shard AND w.id = ANY(j.dependents) AND w.state = 'waiting'))
            LIMIT p_limit - v_done
            FOR UPDATE SKIP LOCKED
        )
        DELETE FROM akadze.jobs AS j USING doomed WHERE j.shard = v_shard AND j.id = doomed.id;
        GET DIAGNOSTICS v_count = ROW_COUNT;
        v_done := v_done + v_count;
    END LOOP;
    RETURN v_done;
END
$$
-- statement

-- Bulk insert of one task's jobs (job_insert_many): the rows are made on the coordinator
-- (each its shard and id) and routed to their shards; ids in input order.
CREATE OR REPLACE FUNCTION akadze.citus_enqueue_many(
    p_task text, p_queue text, p_args text[], p_priority integer, p_scheduled_at timestamptz,
    p_delay float8, p_max_attempts integer, p_expires_at timestamptz, p_meta jsonb)
RETURNS TABLE (ids bigint[], notified boolean)
LANGUAGE plpgsql VOLATILE
AS $$
DECLARE
    v_now timestamptz := now();
    v_at timestamptz := coalesce(p_scheduled_at, v_now + p_delay * interval '1 second');
    v_lanes integer := (SELECT lanes FROM akadze.citus_settings);
    v_ids bigint[];
BEGIN
    SELECT array_agg(nextval('akadze.citus_job_numbers') * 1024
                     + akadze.citus_shard_for(p_meta, NULL, p_queue, a.args, v_lanes)
                     ORDER BY a.n)
    INTO v_ids
    FROM (SELECT e.args, row_number() OVER (ORDER BY c.k, e.i) AS n
          FROM unnest(p_args) WITH ORDINALITY AS c(array_text, k)
          CROSS JOIN LATERAL jsonb_array_elements(c.array_text::jsonb)
              WITH ORDINALITY AS e(args, i)) AS a;
    IF v_ids IS NULL THEN
        RETURN QUERY SELECT '{}'::bigint[], NULL::boolean;
        RETURN;
    END IF;
    -- The jobs' args again, by position: the ids above were drawn in input order.
    INSERT INTO akadze.jobs (id, shard, task, queue, args, priority, scheduled_at, max_attempts,
                             expires_at, meta, created_at)
    SELECT v_ids[a.n], akadze.citus_shard_of(v_ids[a.n]), p_task, p_queue, a.args, p_priority,
           v_at, p_max_attempts, p_expires_at, p_meta, v_now
    FROM (SELECT e.args, row_number() OVER (ORDER BY c.k, e.i) AS n
          FROM unnest(p_args) WITH ORDINALITY AS c(array_text, k)
          CROSS JOIN LATERAL jsonb_array_elements(c.array_text::jsonb)
              WITH ORDINALITY AS e(args, i)) AS a;
    IF v_at <= v_now THEN
        PERFORM pg_notify('akadze_jobs', akadze.job_notice(p_queue, p_priority, v_at));
    END IF;
    RETURN QUERY SELECT v_ids, v_at <= v_now;
END
$$
-- statement

-- Graceful stop (job_return_many): unfinished runs back to queued, due now, without spending
-- the attempt; shard by shard, fenced.
CREATE OR REPLACE FUNCTION akadze.citus_return(
    p_id bigint[], p_run_count integer[], p_claim_token bigint[])
RETURNS TABLE (id bigint, notified boolean)
LANGUAGE plpgsql VOLATILE
AS $$
DECLARE
    v_now timestamptz := now();
    v_shard integer;
    v_ids bigint[] := '{}';
    v_queues text[] := '{}';
    v_batch_ids bigint[];
    v_batch_queues text[];
BEGIN
    FOR v_shard IN SELECT DISTINCT akadze.citus_shard_of(i) FROM unnest(p_id) AS i ORDER BY 1
    LOOP
        WITH returned AS (
            UPDATE akadze.jobs AS j
            SET state = 'queued', attempt = j.attempt - 1, worker_id = NULL, scheduled_at = v_now
            FROM unnest(p_id, p_run_count, p_claim_token) AS o(id, run_count, claim_token)
            WHERE j.shard = v_shard AND j.id = o.id AND j.run_count = o.run_count
              AND j.claim_token = o.claim_token AND j.state = 'running'
            RETURNING j.id, j.queue
        )
        SELECT array_agg(r.id), array_agg(r.queue) INTO v_batch_ids, v_batch_queues
        FROM returned AS r;
        v_ids := v_ids || coalesce(v_batch_ids, '{}');
        v_queues := v_queues || coalesce(v_batch_queues, '{}');
    END LOOP;
    PERFORM pg_notify('akadze_jobs', q) FROM (SELECT DISTINCT unnest(v_queues) AS q) AS d;
    RETURN QUERY SELECT r, true FROM unnest(v_ids) AS r;
END
$$
-- statement

-- After a connection error (job_return_orphans): this live worker's running jobs it does not
-- know about go back to queued without spending the attempt, shard by shard.
CREATE OR REPLACE FUNCTION akadze.citus_return_orphans(p_worker_id bigint, p_known bigint[])
RETURNS TABLE (id bigint, run_count integer, notified boolean)
LANGUAGE plpgsql VOLATILE
AS $$
DECLARE
    v_now timestamptz := now();
    v_rows bigint[] := '{}';
    v_runs integer[] := '{}';
    v_queues text[] := '{}';
    v_a bigint[];
    v_b integer[];
    v_c text[];
BEGIN
    FOR v_shard IN 0..15 LOOP
        WITH returned AS (
            UPDATE akadze.jobs AS j
            SET state = 'queued', attempt = j.attempt - 1, worker_id = NULL, scheduled_at = v_now
            WHERE j.shard = v_shard AND j.worker_id = p_worker_id AND j.state = 'running'
              AND NOT (j.id = ANY(p_known))
            RETURNING j.id, j.run_count, j.queue
        )
        SELECT array_agg(r.id), array_agg(r.run_count), array_agg(r.queue)
        INTO v_a, v_b, v_c FROM returned AS r;
        v_rows := v_rows || coalesce(v_a, '{}');
        v_runs := v_runs || coalesce(v_b, '{}');
        v_queues := v_queues || coalesce(v_c, '{}');
    END LOOP;
    PERFORM pg_notify('akadze_jobs', q) FROM (SELECT DISTINCT unnest(v_queues) AS q) AS d;
    RETURN QUERY SELECT r.i, r.n, true FROM unnest(v_rows, v_runs) AS r(i, n);
END
$$
-- statement

-- Enqueue the run of a declared schedule's tick exactly once (schedule_enqueue): the row of
-- akadze.schedules (a reference table) is advanced under its row lock, and only the worker
-- whose UPDATE advanced it inserts the job (a racing one waits, re-reads the row and finds
-- the tick taken).
CREATE OR REPLACE FUNCTION akadze.citus_schedule_enqueue(
    p_name text, p_spec text, p_tick timestamptz, p_expected timestamptz, p_task text,
    p_queue text, p_args jsonb, p_priority integer, p_max_attempts integer,
    p_expires_at timestamptz, p_meta jsonb)
RETURNS TABLE (id bigint, notified boolean)
LANGUAGE plpgsql VOLATILE
AS $$
DECLARE
    v_now timestamptz := now();
BEGIN
    UPDATE akadze.schedules AS s
    SET last_tick = p_tick, last_run = p_tick, updated_at = v_now
    WHERE s.name = p_name AND s.spec = p_spec AND s.last_tick < p_tick AND s.source = 'code'
      AND (p_expected IS NULL OR s.last_tick = p_expected);
    IF NOT FOUND THEN
        RETURN;
    END IF;
    RETURN QUERY SELECT e.id, e.notified FROM akadze.citus_enqueue(
        p_task, p_queue, p_args, p_priority, v_now, 0, p_max_attempts, p_expires_at, NULL,
        p_meta) AS e;
END
$$
-- statement

-- Every queue the database knows of (queue_list): the loose index scan of one server is a
-- recursive walk Citus cannot plan over shards, so the queued queues come from one DISTINCT
-- over the shards, and each queue's due jobs from a count of its own (capped afterwards).
CREATE OR REPLACE FUNCTION akadze.citus_queue_list(p_cap integer)
RETURNS TABLE (queue text, paused boolean, paused_at timestamptz, paused_by text, due bigint,
               workers bigint)
LANGUAGE plpgsql VOLATILE
AS $$
#variable_conflict use_column
DECLARE
    v_now timestamptz := now();
    v_queued text[];
    v_live text[];
    v_known text;
BEGIN
    SELECT coalesce(array_agg(DISTINCT j.queue), '{}') INTO v_queued
    FROM akadze.jobs AS j WHERE j.state = 'queued';
    SELECT coalesce(array_agg(q.queue), '{}') INTO v_live
    FROM akadze.workers AS w CROSS JOIN LATERAL unnest(w.queues) AS q(queue)
    WHERE w.heartbeat_at > v_now - w.heartbeat_ttl;
    FOR v_known IN
        SELECT DISTINCT k FROM (SELECT unnest(v_queued) AS k UNION SELECT unnest(v_live)
                                UNION SELECT p.queue FROM akadze.queue_pauses AS p) AS u
        ORDER BY k
    LOOP
        RETURN QUERY
            SELECT v_known, p.queue IS NOT NULL, p.paused_at, p.paused_by,
                   least((SELECT count(*) FROM akadze.jobs AS j
                          WHERE j.state = 'queued' AND j.queue = v_known
                            AND j.scheduled_at <= v_now), p_cap::bigint),
                   (SELECT count(*) FROM akadze.workers AS w
                    WHERE v_known = ANY(w.queues) AND w.heartbeat_at > v_now - w.heartbeat_ttl)
            FROM (SELECT 1) AS one
            LEFT JOIN akadze.queue_pauses AS p ON p.queue = v_known;
    END LOOP;
END
$$
-- statement

-- A remote-control request (control_send): the row in the reference table, then the
-- notification as a coordinator statement of its own (the payload lists the targets, empty
-- when too long: every worker looks).
CREATE OR REPLACE FUNCTION akadze.citus_control_send(
    p_command text, p_arguments jsonb, p_targets bigint[], p_reply boolean, p_ttl float8)
RETURNS TABLE (id bigint, notified boolean)
LANGUAGE plpgsql VOLATILE
AS $$
DECLARE
    v_expires timestamptz := now() + p_ttl * interval '1 second';
    v_id bigint;
BEGIN
    INSERT INTO akadze.control_requests (command, arguments, targets, reply, expires_at)
    VALUES (p_command, p_arguments, p_targets, p_reply, v_expires)
    RETURNING control_requests.id INTO v_id;
    PERFORM pg_notify('akadze_control', CASE WHEN cardinality(p_targets) <= 400
                                             THEN array_to_string(p_targets, ',')
                                             ELSE '' END);
    RETURN QUERY SELECT v_id, true;
END
$$
-- statement

-- A worker's answer to a request (control_reply), announced to the sender at commit; no row
-- when this worker had answered already.
CREATE OR REPLACE FUNCTION akadze.citus_control_reply(
    p_request_id bigint, p_worker_id bigint, p_worker_name text, p_reply jsonb)
RETURNS TABLE (request_id bigint, notified boolean)
LANGUAGE plpgsql VOLATILE
AS $$
BEGIN
    INSERT INTO akadze.control_replies (request_id, worker_id, worker_name, reply)
    VALUES (p_request_id, p_worker_id, p_worker_name, p_reply)
    ON CONFLICT DO NOTHING;
    IF NOT FOUND THEN
        RETURN;
    END IF;
    PERFORM pg_notify('akadze_control_reply', p_request_id::text);
    RETURN QUERY SELECT p_request_id, true;
END
$$
-- statement

-- The notification of a runtime schedule's change (the name, or '' when too long for a
-- payload: every worker reloads).
CREATE OR REPLACE FUNCTION akadze.citus_schedule_notice(p_name text) RETURNS void
LANGUAGE sql VOLATILE
AS $$
    SELECT pg_notify('akadze_schedules',
                     CASE WHEN octet_length(p_name) <= 7000 THEN p_name ELSE '' END)
$$
-- statement

-- Store or replace a runtime schedule (schedule_runtime_add), as on one server: the clock
-- and the version are bound first (akadze.schedules is a reference table, and Citus sends
-- no now() inside a CASE nor a coordinator sequence to its workers).
CREATE OR REPLACE FUNCTION akadze.citus_schedule_runtime_add(
    p_name text, p_spec text, p_task text, p_args jsonb, p_queue text, p_priority integer,
    p_max_attempts integer, p_expires interval, p_meta jsonb, p_paused boolean,
    p_replace boolean)
RETURNS SETOF akadze.schedules
LANGUAGE plpgsql VOLATILE
AS $$
DECLARE
    v_now timestamptz := now();
    v_version bigint := nextval('akadze.schedule_versions');
    v_row akadze.schedules;
BEGIN
    INSERT INTO akadze.schedules AS s
        (name, spec, last_tick, source, task, args, queue, priority, max_attempts, expires,
         meta, paused, version, changed_at)
    VALUES (p_name, p_spec, v_now, 'runtime', p_task, p_args, p_queue, p_priority,
            p_max_attempts, p_expires, p_meta, p_paused, v_version, v_now)
    ON CONFLICT (name) DO UPDATE
    SET spec = EXCLUDED.spec,
        last_tick = CASE WHEN s.source = 'runtime' AND s.spec = EXCLUDED.spec
                         AND NOT (s.paused AND NOT EXCLUDED.paused)
                         THEN s.last_tick ELSE greatest(s.last_tick, v_now) END,
        source = 'runtime', task = EXCLUDED.task, args = EXCLUDED.args,
        queue = EXCLUDED.queue, priority = EXCLUDED.priority,
        max_attempts = EXCLUDED.max_attempts, expires = EXCLUDED.expires,
        meta = EXCLUDED.meta, paused = EXCLUDED.paused, version = EXCLUDED.version,
        changed_at = v_now, updated_at = v_now,
        created_at = CASE WHEN s.source = 'runtime' THEN s.created_at ELSE v_now END
    WHERE p_replace
    RETURNING s.* INTO v_row;
    IF NOT FOUND THEN
        RETURN;
    END IF;
    PERFORM akadze.citus_schedule_notice(p_name);
    RETURN NEXT v_row;
END
$$
-- statement

-- Pause or resume a runtime schedule (schedule_runtime_pause); resuming accounts for the
-- ticks up to now, as on one server.
CREATE OR REPLACE FUNCTION akadze.citus_schedule_runtime_pause(p_name text, p_paused boolean)
RETURNS TABLE (name text, notified boolean)
LANGUAGE plpgsql VOLATILE
AS $$
DECLARE
    v_now timestamptz := now();
    v_version bigint := nextval('akadze.schedule_versions');
BEGIN
    UPDATE akadze.schedules AS s
    SET last_tick = CASE WHEN s.paused AND NOT p_paused THEN greatest(s.last_tick, v_now)
                         ELSE s.last_tick END,
        paused = p_paused, version = v_version, changed_at = v_now, updated_at = v_now
    WHERE s.name = p_name AND s.source = 'runtime';
    IF NOT FOUND THEN
        RETURN;
    END IF;
    PERFORM akadze.citus_schedule_notice(p_name);
    RETURN QUERY SELECT p_name, true;
END
$$
-- statement

-- Remove a runtime schedule (schedule_runtime_remove).
CREATE OR REPLACE FUNCTION akadze.citus_schedule_runtime_remove(p_name text)
RETURNS TABLE (name text, notified boolean)
LANGUAGE plpgsql VOLATILE
AS $$
BEGIN
    DELETE FROM akadze.schedules AS s WHERE s.name = p_name AND s.source = 'runtime';
    IF NOT FOUND THEN
        RETURN;
    END IF;
    PERFORM akadze.citus_schedule_notice(p_name);
    RETURN QUERY SELECT p_name, true;
END
$$
-- statement

-- Enqueue one tick of each runtime schedule named (schedule_runtime_enqueue), exactly once
-- per schedule and tick however many workers try, as on one server: the rows are locked in
-- name order and re-read, and only a row still at an earlier tick, at the version the tick
-- was computed from and not paused is advanced; only an advanced row enqueues its job (routed
-- to its shard by akadze.citus_enqueue, which also wakes the queue's workers).
CREATE OR REPLACE FUNCTION akadze.citus_schedule_runtime_enqueue(p_due jsonb)
RETURNS TABLE (queue text, jobs bigint, notified boolean)
LANGUAGE plpgsql VOLATILE
AS $$
DECLARE
    v_now timestamptz := now();
    v_row record;
    v_queues text[] := '{}';
BEGIN
    FOR v_row IN
        SELECT s.name, s.task, s.queue, s.args, s.priority, s.max_attempts, s.expires,
               s.meta, d.tick, d.tick_text
        FROM akadze.schedules AS s
        JOIN (SELECT e ->> 0 AS name, (e ->> 1)::bigint AS version,
                     (e ->> 2)::timestamptz AS tick, e ->> 2 AS tick_text
              FROM jsonb_array_elements(p_due) AS e) AS d ON d.name = s.name
        WHERE s.source = 'runtime' AND s.version = d.version AND NOT s.paused
          AND s.last_tick < d.tick
        ORDER BY s.name
        FOR UPDATE OF s
    LOOP
        UPDATE akadze.schedules AS s
        SET last_tick = v_row.tick, last_run = v_row.tick, updated_at = v_now
        WHERE s.name = v_row.name;
        PERFORM akadze.citus_enqueue(
            v_row.task, v_row.queue, v_row.args, v_row.priority, v_now, 0,
            v_row.max_attempts, v_row.tick + v_row.expires, NULL,
            v_row.meta || jsonb_build_object('schedule', v_row.name, 'tick', v_row.tick_text));
        v_queues := v_queues || v_row.queue;
    END LOOP;
    RETURN QUERY SELECT q.queue, count(*), true FROM unnest(v_queues) AS q(queue)
                 GROUP BY q.queue;
END
$$
-- statement

-- A fair claim (job_claim_fair): one router statement per shard, from a random shard on,
-- until the limit is met, each the single-server fair claim within its shard: the shard's
-- task names of the queue (a loose scan of jobs_fair_claim_idx, filtered by the shard in both
-- arms), each task's oldest job first, then each task's second, in name order after
-- p_after_task. The rotation holds within a shard: tasks placed in other shards (by tenant,
-- or by a queue's lanes) are reached by the claims that start there.
CREATE OR REPLACE FUNCTION akadze.citus_claim_jobs_fair(
    p_lock_timeout text, p_queue text, p_limit integer, p_worker_id bigint, p_after_task text)
RETURNS SETOF akadze.citus_claimed
LANGUAGE plpgsql VOLATILE
AS $$
DECLARE
    v_now timestamptz := now();
    v_start integer := floor(random() * 16)::integer;
    v_shard integer;
    v_token bigint;
    v_rows akadze.citus_claimed[] := '{}';
    v_batch akadze.citus_claimed[];
    -- Jobs of a workflow cancelled at the claim: what waits on them ends too.
    v_settle bigint[];
BEGIN
    IF p_lock_timeout IS NOT NULL THEN
        PERFORM set_config('lock_timeout', p_lock_timeout, true);
    END IF;
    IF akadze.queue_claimable(p_queue) IS NOT TRUE THEN
        RETURN;
    END IF;
    FOR step IN 0..15 LOOP
        EXIT WHEN cardinality(v_rows) >= p_limit;
        v_shard := mod(v_start + step, 16);
        v_token := floor(random() * 9007199254740992)::bigint;
        WITH RECURSIVE tasks AS (
            (SELECT j.task FROM akadze.jobs AS j
             WHERE j.shard = v_shard AND j.state = 'queued' AND j.queue = p_queue
             ORDER BY j.task LIMIT 1)
            UNION ALL
            SELECT (SELECT j.task FROM akadze.jobs AS j
                    WHERE j.shard = v_shard AND j.state = 'queued' AND j.queue = p_queue
                      AND j.task > tasks.task
                    ORDER BY j.task LIMIT 1)
            FROM tasks WHERE tasks.task IS NOT NULL
        ),
        candidates AS (
            SELECT c.id, c.priority, c.scheduled_at, tasks.task,
                   (p_after_task IS NOT NULL AND tasks.task <= p_after_task) AS wrapped,
                   row_number() OVER (PARTITION BY tasks.task
                                      ORDER BY c.priority, c.scheduled_at, c.id) AS turn
            FROM tasks
            CROSS JOIN LATERAL (
                SELECT j.id, j.priority, j.scheduled_at FROM akadze.jobs AS j
                WHERE j.shard = v_shard AND j.state = 'queued' AND j.queue = p_queue
                  AND j.task = tasks.task AND j.scheduled_at <= v_now
                ORDER BY j.priority, j.scheduled_at, j.id
                LIMIT p_limit - cardinality(v_rows)
            ) AS c
            WHERE tasks.task IS NOT NULL
        ),
        picked AS (
            SELECT j.id, c.turn, c.wrapped FROM akadze.jobs AS j JOIN candidates AS c ON c.id = j.id
            WHERE j.shard = v_shard AND j.state = 'queued'
            ORDER BY c.turn, c.priority, c.wrapped, c.task, c.scheduled_at, c.id
            LIMIT p_limit - cardinality(v_rows)
            FOR UPDATE OF j SKIP LOCKED
        ),
        claimed AS (
            UPDATE akadze.jobs AS j
            SET state = CASE WHEN j.cancel_requested OR j.expires_at <= v_now
                             THEN 'cancelled' ELSE 'running' END,
                run_count = j.run_count + CASE WHEN j.cancel_requested OR j.expires_at <= v_now
                                               THEN 0 ELSE 1 END,
                attempt = j.attempt + CASE WHEN j.cancel_requested OR j.expires_at <= v_now
                                           THEN 0 ELSE 1 END,
                worker_id = CASE WHEN j.cancel_requested OR j.expires_at <= v_now
                                 THEN NULL ELSE p_worker_id END,
                started_at = v_now,
                claim_token = v_token,
                finished_at = CASE WHEN j.cancel_requested OR j.expires_at <= v_now
                                   THEN v_now END
            FROM picked
            WHERE j.shard = v_shard AND j.id = picked.id
            RETURNING j.*, picked.turn, picked.wrapped
        )
        SELECT array_agg(ROW(c.id, c.task, c.queue, c.args::text, c.state, c.priority,
                             c.scheduled_at, c.attempt, c.max_attempts, c.run_count,
                             c.claim_token, c.expires_at, c.meta::text, c.created_at,
                             c.started_at, c.cancel_requested, (c.errors -> -1)::text,
                             c.upstreams, c.upstream_results::text, c.flow ->> 'result_arg',
                             c.position,
                             -- Flushed at once when it may release a job that waits on it
                             -- (as on one server: a fan-in's member gathers like a plain
                             -- job until few upstreams are left).
                             c.dependents IS NOT NULL AND EXISTS (
                                 SELECT 1 FROM akadze.jobs AS d
                                 WHERE d.shard = v_shard AND d.id = ANY(c.dependents)
                                   AND d.state = 'waiting' AND d.waiting_for <= p_limit),
                             NULL::boolean)
                         ::akadze.citus_claimed
                         ORDER BY c.turn, c.priority, c.wrapped, c.task, c.scheduled_at, c.id),
               array_agg(c.id) FILTER (WHERE c.state = 'cancelled'
                                       AND (c.dependents IS NOT NULL
                                            OR c.on_failure IS NOT NULL))
        INTO v_batch, v_settle FROM claimed AS c;
        v_rows := v_rows || coalesce(v_batch, '{}');
        IF v_settle IS NOT NULL THEN
            PERFORM akadze.citus_settle(v_shard, v_settle);
        END IF;
    END LOOP;
    PERFORM pg_notify('akadze_done', r.id::text) FROM unnest(v_rows) AS r
    WHERE r.state = 'cancelled';
    -- In rotation order within each shard's batch: the caller passes the last row's task as
    -- the next after_task.
    RETURN QUERY SELECT * FROM unnest(v_rows);
END
$$
-- statement

-- complete_tx (job_complete_in_tx): the job succeeds in the caller's transaction, whatever
-- cancel or expiry happened meanwhile; fenced like every outcome write, routed by its id.
CREATE OR REPLACE FUNCTION akadze.citus_complete_in_tx(
    p_id bigint, p_run_count integer, p_claim_token bigint, p_result jsonb)
RETURNS TABLE (id bigint, notified boolean)
LANGUAGE plpgsql VOLATILE
AS $$
DECLARE
    v_now timestamptz := now();
    v_shard integer := akadze.citus_shard_of(p_id);
    v_settles boolean;
BEGIN
    UPDATE akadze.jobs AS j
    SET state = 'succeeded', result = p_result, worker_id = NULL, finished_at = v_now
    WHERE j.shard = v_shard AND j.id = p_id AND j.run_count = p_run_count
      AND j.claim_token = p_claim_token AND j.state = 'running'
    RETURNING (j.dependents IS NOT NULL OR j.on_failure IS NOT NULL) INTO v_settles;
    IF NOT FOUND THEN
        RETURN;
    END IF;
    IF v_settles THEN
        PERFORM akadze.citus_settle(v_shard, ARRAY[p_id]);
    END IF;
    PERFORM pg_notify('akadze_done', p_id::text);
    RETURN QUERY SELECT p_id, true;
END
$$
-- statement

-- Workflows in Citus mode. Every member of a workflow is placed in one shard, the workflow's
-- (its upstreams' shard when it waits on jobs enqueued before, else its first job's: that
-- job's tenant, or its queue's lane), so that what follows from a finished job -- counting
-- down its dependents, releasing them, the walk downstream of a failure, its errbacks -- is
-- a series of router statements on that one shard. A workflow that would wait on jobs of
-- another shard is refused (FeatureNotSupported), never split.

-- The jobs of a workflow insert (job_insert_graph's and job_insert_rows's nodes), in input
-- order (seq), each with its template (k, 1-based) and the fields job_insert_graph reads
-- from its JSON form.
CREATE OR REPLACE FUNCTION akadze.citus_graph_nodes(p_nodes text[], p_chunk_template integer[])
RETURNS TABLE (seq bigint, k integer, args jsonb, meta jsonb, "position" integer, flow jsonb,
               on_failure jsonb, ups bigint[], downs integer[], pending integer,
               waits_outside boolean)
LANGUAGE sql IMMUTABLE
AS $$
    SELECT row_number() OVER (ORDER BY c.chunk, a.ord), c.k,
           CASE WHEN jsonb_typeof(a.e) = 'array' THEN a.e -> 0 ELSE a.e END,
           coalesce(nullif(a.m, 'null'), nullif(a.e -> 1, 'null')),
           coalesce(q.first + a.ord::integer - 1, (a.e ->> 8)::integer),
           nullif(a.e -> 2, 'null'), nullif(a.e -> 3, 'null'), (a.e ->> 4)::bigint[],
           coalesce((a.e ->> 5)::integer[], q.downs), coalesce((a.e ->> 6)::integer, 0),
           coalesce((a.e ->> 7)::boolean, false)
    FROM unnest(p_nodes, p_chunk_template) WITH ORDINALITY AS c(array_text, k, chunk)
    CROSS JOIN LATERAL (SELECT c.array_text::jsonb AS j OFFSET 0) AS p
    CROSS JOIN LATERAL (SELECT (p.j ->> 'index')::integer AS first,
                               (p.j ->> 'downs')::integer[] AS downs OFFSET 0) AS q
    CROSS JOIN LATERAL ROWS FROM (
        jsonb_array_elements(CASE WHEN jsonb_typeof(p.j) = 'object' THEN p.j -> 'args'
                                  ELSE p.j END),
        jsonb_array_elements(p.j -> 'meta')) WITH ORDINALITY AS a(e, m, ord)
    ORDER BY c.chunk, a.ord
$$
-- statement

-- Insert a workflow's jobs (job_insert_graph, and job_insert_rows: a group is a workflow
-- without edges), all in the workflow's shard; the ids in input order. As on one server:
-- jobs inserted before and waited on (p_external) are locked and their dependents extended;
-- one that succeeded counts as done, one that failed, was cancelled or does not exist
-- refuses the whole insert (akadze.refuse); a job with nothing left to wait on is queued at
-- once, with the results of the jobs it waited on.
CREATE OR REPLACE FUNCTION akadze.citus_insert_graph(
    p_templates jsonb, p_nodes text[], p_chunk_template integer[], p_external bigint[],
    p_external_ref bigint[], p_external_node integer[])
RETURNS TABLE (ids bigint[], notified bigint, refused bigint, linked bigint)
LANGUAGE plpgsql VOLATILE
AS $$
DECLARE
    v_now timestamptz := now();
    v_external bigint[] := coalesce(p_external, '{}');
    v_shard integer;
    v_count integer;
    v_ids bigint[];
    v_known bigint[];
    v_states text[];
    v_results jsonb[];
    v_missing record;
    v_ref record;
    v_notified bigint := 0;
    v_notices text[];
    v_linked bigint := 0;
BEGIN
    SELECT count(*) INTO v_count FROM akadze.citus_graph_nodes(p_nodes, p_chunk_template);
    IF v_count = 0 THEN
        RETURN QUERY SELECT '{}'::bigint[], 0::bigint, 0::bigint, 0::bigint;
        RETURN;
    END IF;
    IF cardinality(v_external) > 0 THEN
        v_shard := akadze.citus_shard_of(v_external[1]);
        SELECT e.id INTO v_missing FROM unnest(v_external) AS e(id)
        WHERE akadze.citus_shard_of(e.id) <> v_shard LIMIT 1;
        IF FOUND THEN
            RAISE EXCEPTION USING ERRCODE = 'feature_not_supported',
                MESSAGE = format('a workflow would wait on jobs %s and %s, which are in '
                                 'different shards: in Citus mode a workflow''s jobs share '
                                 'one shard (see docs/how-to/citus.md)',
                                 v_external[1], v_missing.id);
        END IF;
    ELSE
        -- The first job's shard: its tenant, else its queue's lane.
        SELECT akadze.citus_shard_for(coalesce(n.meta, t.meta), NULL, t.queue, n.args,
                                      (SELECT lanes FROM akadze.citus_settings))
        INTO v_shard
        FROM akadze.citus_graph_nodes(p_nodes, p_chunk_template) AS n
        CROSS JOIN LATERAL jsonb_to_record(p_templates -> (n.k - 1)) AS t(queue text, meta jsonb)
        WHERE n.seq = 1;
    END IF;
    SELECT array_agg(i ORDER BY i) INTO v_ids
    FROM (SELECT nextval('akadze.citus_job_numbers') * 1024 + v_shard AS i
          FROM generate_series(1, v_count)) AS drawn;

    IF cardinality(v_external) > 0 THEN
        SELECT coalesce(array_agg(x.id), '{}'), coalesce(array_agg(x.state), '{}'),
               coalesce(array_agg(x.result), '{}')
        INTO v_known, v_states, v_results
        FROM (SELECT j.id, j.state, j.result FROM akadze.jobs AS j
              WHERE j.shard = v_shard AND j.id = ANY(v_external)
              ORDER BY j.id FOR UPDATE) AS x;
        FOR v_missing IN
            SELECT e.id, s.state FROM unnest(v_external) AS e(id)
            LEFT JOIN unnest(v_known, v_states) AS s(id, state) ON s.id = e.id
            WHERE s.id IS NULL OR s.state IN ('failed', 'cancelled')
            LIMIT 1
        LOOP
            PERFORM akadze.refuse(format('job %s, which a workflow job would wait on, %s',
                                         v_missing.id,
                                         coalesce(v_missing.state, 'does not exist')));
        END LOOP;
    END IF;

    -- The rows are made here, on the coordinator (no distributed table in the SELECT), and
    -- routed to the shard.
    INSERT INTO akadze.jobs (id, shard, task, queue, args, priority, scheduled_at, max_attempts,
                             expires_at, meta, state, upstreams, waiting_for, dependents, flow,
                             on_failure, upstream_results, position, created_at)
    SELECT v_ids[n.seq], v_shard, t.task, t.queue, n.args, t.priority,
           coalesce(t.at, v_now + coalesce(t.delay, 0) * interval '1 second'),
           t.max_attempts, t.expires_at, coalesce(n.meta, t.meta),
           CASE WHEN n.waiting > 0 THEN 'waiting' ELSE 'queued' END,
           n.upstream_ids, CASE WHEN n.ups IS NOT NULL THEN n.waiting END, n.dependent_ids,
           n.flow, n.on_failure,
           CASE WHEN n.ups IS NOT NULL AND n.waiting = 0 THEN
               CASE n.flow ->> 'pass'
                   WHEN 'one' THEN (SELECT x.result FROM unnest(v_known, v_results) AS x(id, result)
                                    WHERE x.id = n.upstream_ids[1])
                   WHEN 'list' THEN (SELECT jsonb_agg(x.result ORDER BY u.k)
                                     FROM unnest(n.upstream_ids) WITH ORDINALITY AS u(id, k)
                                     JOIN unnest(v_known, v_results) AS x(id, result)
                                         ON x.id = u.id)
               END
           END,
           n.position, v_now
    FROM (SELECT g.*,
                 CASE WHEN g.ups IS NOT NULL THEN ARRAY(
                     SELECT CASE WHEN u.ref < 0 THEN v_ids[-u.ref] ELSE u.ref END
                     FROM unnest(g.ups) WITH ORDINALITY AS u(ref, k) ORDER BY u.k)
                 END AS upstream_ids,
                 CASE WHEN g.downs IS NOT NULL THEN ARRAY(
                     SELECT v_ids[d.k] FROM unnest(g.downs) WITH ORDINALITY AS d(k, o)
                     ORDER BY d.o)
                 END AS dependent_ids,
                 g.pending + CASE WHEN g.waits_outside THEN (
                     SELECT count(*) FROM unnest(v_known, v_states) AS x(id, state)
                     WHERE x.id = ANY(g.ups) AND x.state <> 'succeeded') ELSE 0 END
                     AS waiting
          FROM akadze.citus_graph_nodes(p_nodes, p_chunk_template) AS g) AS n
    CROSS JOIN LATERAL jsonb_to_record(p_templates -> (n.k - 1)) AS t(
        task text, queue text, priority integer, max_attempts integer, at timestamptz,
        delay float8, expires_at timestamptz, meta jsonb);

    -- The jobs inserted before, still to finish, now wait for their new dependents.
    FOR v_ref IN
        SELECT e.ref, array_agg(v_ids[e.node] ORDER BY e.node) AS downstreams
        FROM unnest(p_external_ref, p_external_node) AS e(ref, node)
        JOIN unnest(v_known, v_states) AS x(id, state) ON x.id = e.ref
        WHERE x.state IN ('waiting', 'queued', 'running')
        GROUP BY e.ref ORDER BY e.ref
    LOOP
        UPDATE akadze.jobs AS j SET dependents = coalesce(j.dependents, '{}') || v_ref.downstreams
        WHERE j.shard = v_shard AND j.id = v_ref.ref;
        v_linked := v_linked + 1;
    END LOOP;

    -- Read first, then notified here: a statement on the jobs table runs on a worker node,
    -- where a NOTIFY reaches no listener (and cannot be prepared for the commit).
    SELECT array_agg(akadze.job_notice(d.queue, d.p, d.at)) INTO v_notices
    FROM (SELECT j.queue, min(j.priority) AS p, min(j.scheduled_at) AS at FROM akadze.jobs AS j
          WHERE j.shard = v_shard AND j.id = ANY(v_ids) AND j.state = 'queued'
            AND j.scheduled_at <= v_now
          GROUP BY j.queue) AS d;
    SELECT count(pg_notify('akadze_jobs', n)) INTO v_notified FROM unnest(v_notices) AS n;
    RETURN QUERY SELECT v_ids, v_notified, 0::bigint, v_linked;
END
$$
-- statement

-- settle (akadze.settle of one server) for the jobs of one shard that have just reached a
-- final state, called by every Citus statement that finishes a job with dependents or
-- errbacks, in the transaction that writes the outcome. The same steps and the same rules
-- (see akadze.settle in sql/functions.sql), each a router statement filtered by the shard
-- (the recursive walk in both its arms), the clock bound once, and the values Citus will
-- not compute inside an UPDATE (results passed on, error entries) read first by a SELECT.
CREATE OR REPLACE FUNCTION akadze.citus_settle(p_shard integer, p_finished bigint[])
RETURNS integer
LANGUAGE plpgsql VOLATILE
AS $$
DECLARE
    v_now timestamptz := now();
    v_epoch float8 := extract(epoch FROM v_now);
    succeeded bigint[];
    doomed_by bigint[];
    failed bigint[];
    ready bigint[];
    ended bigint[];
    touched integer := 0;
    v_ids bigint[];
    v_counts integer[];
    v_texts text[];
    v_culprits bigint[];
    v_depths integer[];
    v_vias bigint[];
    v_fails boolean[];
    v_queues text[];
    v_count integer;
    v_errback record;
BEGIN
    SELECT array_agg(j.id) FILTER (WHERE j.state = 'succeeded' AND j.dependents IS NOT NULL),
           array_agg(j.id) FILTER (WHERE j.state IN ('failed', 'cancelled')
                                   AND j.dependents IS NOT NULL),
           array_agg(j.id) FILTER (WHERE j.state = 'failed' AND j.on_failure IS NOT NULL)
    INTO succeeded, doomed_by, failed
    FROM akadze.jobs AS j WHERE j.shard = p_shard AND j.id = ANY(p_finished);

    -- What waits downstream of the failures, every generation: the walk of one server,
    -- filtered by the shard in both arms. Reached along several paths, a job takes the
    -- least depth.
    IF doomed_by IS NOT NULL THEN
        WITH RECURSIVE doomed(id, culprit, depth, via) AS (
            SELECT d.id, j.id, 0, NULL::bigint
            FROM akadze.jobs AS j CROSS JOIN LATERAL unnest(j.dependents) AS d(id)
            WHERE j.shard = p_shard AND j.id = ANY(doomed_by)
            UNION
            SELECT d.id, doomed.culprit,
                   CASE WHEN w.flow ->> 'on_upstream_failure' IS DISTINCT FROM 'fail'
                        THEN doomed.depth + coalesce((w.flow ->> 'enters')::integer, 0)
                        WHEN doomed.depth = 0 THEN 0
                        ELSE doomed.depth - 1 + coalesce((w.flow ->> 'enters')::integer, 0)
                   END,
                   CASE WHEN w.flow ->> 'on_upstream_failure' = 'fail' AND doomed.depth = 0
                        THEN w.id ELSE doomed.via END
            FROM doomed JOIN akadze.jobs AS w ON w.shard = p_shard AND w.id = doomed.id
            CROSS JOIN LATERAL unnest(w.dependents) AS d(id)
            WHERE w.shard = p_shard AND w.state = 'waiting'
        )
        SELECT array_agg(f.id ORDER BY f.id), array_agg(f.culprit ORDER BY f.id),
               array_agg(f.depth ORDER BY f.id), array_agg(f.via ORDER BY f.id)
        INTO v_ids, v_culprits, v_depths, v_vias
        FROM (SELECT DISTINCT ON (id) id, culprit, depth, via
              FROM doomed ORDER BY id, depth, culprit, via) AS f;
    END IF;

    -- Lock everything this call may change, in id order, in one statement: the successes'
    -- dependents and what waits downstream of the failures (two flushes locking them step
    -- by step could deadlock).
    PERFORM 1 FROM akadze.jobs AS w
    WHERE w.shard = p_shard AND w.state = 'waiting'
      AND (w.id = ANY(coalesce(v_ids, '{}'))
           OR w.id IN (SELECT d.id FROM akadze.jobs AS j
                       CROSS JOIN LATERAL unnest(j.dependents) AS d(id)
                       WHERE j.shard = p_shard AND j.id = ANY(coalesce(succeeded, '{}'))))
    ORDER BY w.id
    FOR UPDATE OF w;

    IF succeeded IS NOT NULL THEN
        -- Successes count down their dependents, once per dependent and call.
        SELECT array_agg(c.id ORDER BY c.id), array_agg(c.n ORDER BY c.id)
        INTO v_ids, v_counts
        FROM (SELECT d.id, count(*)::integer AS n
              FROM akadze.jobs AS j CROSS JOIN LATERAL unnest(j.dependents) AS d(id)
              WHERE j.shard = p_shard AND j.id = ANY(succeeded)
              GROUP BY d.id) AS c;
        WITH updated AS (
            UPDATE akadze.jobs AS w SET waiting_for = w.waiting_for - c.n
            FROM unnest(v_ids, v_counts) AS c(id, n)
            WHERE w.shard = p_shard AND w.id = c.id AND w.state = 'waiting'
            RETURNING w.id, w.waiting_for
        )
        SELECT array_agg(u.id) FILTER (WHERE u.waiting_for <= 0) INTO ready FROM updated AS u;
        -- The doomed walk above is read again below for the failures: keep it apart.
        v_ids := NULL;
    END IF;

    IF ready IS NOT NULL THEN
        -- Release the ones at zero, with what they pass on: read first (a new statement, its
        -- snapshot taken after the locks above, so every upstream's result is visible).
        SELECT array_agg(w.id),
               array_agg(CASE w.flow ->> 'pass'
                   WHEN 'one' THEN (SELECT u.result FROM akadze.jobs AS u
                                    WHERE u.shard = p_shard AND u.id = w.upstreams[1])::text
                   WHEN 'list' THEN (SELECT coalesce(jsonb_agg(u.result ORDER BY o.ord), '[]')
                                     FROM unnest(w.upstreams) WITH ORDINALITY AS o(id, ord)
                                     JOIN akadze.jobs AS u ON u.shard = p_shard AND u.id = o.id
                                     WHERE u.shard = p_shard)::text
               END)
        INTO v_ids, v_texts
        FROM akadze.jobs AS w
        WHERE w.shard = p_shard AND w.id = ANY(ready) AND w.state = 'waiting'
          AND w.waiting_for <= 0;
        WITH released AS (
            UPDATE akadze.jobs AS w
            SET state = 'queued',
                scheduled_at = greatest(w.scheduled_at, to_timestamp(
                    v_epoch + coalesce((w.flow ->> 'delay')::float8, 0))),
                upstream_results = r.passed::jsonb
            FROM unnest(v_ids, v_texts) AS r(id, passed)
            WHERE w.shard = p_shard AND w.id = r.id AND w.state = 'waiting'
            RETURNING w.queue, w.scheduled_at <= v_now AS due
        )
        SELECT count(*), array_agg(DISTINCT r.queue) FILTER (WHERE r.due)
        INTO v_count, v_queues FROM released AS r;
        touched := touched + v_count;
        PERFORM pg_notify('akadze_jobs', q) FROM unnest(v_queues) AS q;
    END IF;

    IF doomed_by IS NOT NULL THEN
        -- The walk again, under the locks: what is still waiting ends, never run. Its error
        -- entry (as akadze.settle writes it) is built by this SELECT.
        WITH RECURSIVE doomed(id, culprit, depth, via) AS (
            SELECT d.id, j.id, 0, NULL::bigint
            FROM akadze.jobs AS j CROSS JOIN LATERAL unnest(j.dependents) AS d(id)
            WHERE j.shard = p_shard AND j.id = ANY(doomed_by)
            UNION
            SELECT d.id, doomed.culprit,
                   CASE WHEN w.flow ->> 'on_upstream_failure' IS DISTINCT FROM 'fail'
                        THEN doomed.depth + coalesce((w.flow ->> 'enters')::integer, 0)
                        WHEN doomed.depth = 0 THEN 0
                        ELSE doomed.depth - 1 + coalesce((w.flow ->> 'enters')::integer, 0)
                   END,
                   CASE WHEN w.flow ->> 'on_upstream_failure' = 'fail' AND doomed.depth = 0
                        THEN w.id ELSE doomed.via END
            FROM doomed JOIN akadze.jobs AS w ON w.shard = p_shard AND w.id = doomed.id
            CROSS JOIN LATERAL unnest(w.dependents) AS d(id)
            WHERE w.shard = p_shard AND w.state = 'waiting'
        ), first_culprit AS (
            SELECT DISTINCT ON (id) id, culprit, depth, via
            FROM doomed ORDER BY id, depth, culprit, via
        ), decided AS (
            SELECT f.id, f.via, c.id AS culprit, c.state AS culprit_state,
                   c.errors -> -1 AS culprit_error, w.attempt,
                   w.flow ->> 'on_upstream_failure' = 'fail' AND f.depth = 0 AS fails,
                   CASE WHEN w.flow ->> 'on_upstream_failure' IS DISTINCT FROM 'fail'
                        THEN f.depth + coalesce((w.flow ->> 'enters')::integer, 0)
                        WHEN f.depth = 0 THEN 0
                        ELSE f.depth - 1 + coalesce((w.flow ->> 'enters')::integer, 0)
                   END AS entered
            FROM first_culprit AS f
            JOIN akadze.jobs AS w ON w.shard = p_shard AND w.id = f.id
            JOIN akadze.jobs AS c ON c.shard = p_shard AND c.id = f.culprit
            WHERE w.shard = p_shard AND c.shard = p_shard AND w.state = 'waiting'
        )
        SELECT array_agg(d.id ORDER BY d.id), array_agg(d.fails ORDER BY d.id),
               array_agg(jsonb_build_array(CASE
                   WHEN d.via IS NULL OR d.fails THEN jsonb_build_object(
                       'type', 'UpstreamFailed',
                       'message', format('upstream job %s %s', d.culprit, d.culprit_state),
                       'traceback', NULL, 'attempt', d.attempt, 'at', v_now,
                       'upstream', d.culprit, 'upstream_state', d.culprit_state,
                       'upstream_error', d.culprit_error, 'entered', d.entered)
                   ELSE jsonb_build_object(
                       'type', 'UpstreamFailed',
                       'message', format('upstream job %s failed', d.via),
                       'traceback', NULL, 'attempt', d.attempt, 'at', v_now,
                       'upstream', d.via, 'upstream_state', 'failed',
                       'upstream_error', jsonb_build_object(
                           'type', 'UpstreamFailed',
                           'message', format('upstream job %s %s', d.culprit,
                                             d.culprit_state),
                           'traceback', NULL, 'at', v_now,
                           'upstream', d.culprit, 'upstream_state', d.culprit_state,
                           'upstream_error', d.culprit_error),
                       'entered', d.entered)
               END)::text ORDER BY d.id)
        INTO v_ids, v_fails, v_texts
        FROM decided AS d;

        IF v_ids IS NOT NULL THEN
            WITH ended_rows AS (
                UPDATE akadze.jobs AS w
                SET state = CASE WHEN e.fails THEN 'failed' ELSE 'cancelled' END,
                    finished_at = v_now,
                    errors = w.errors || e.entry::jsonb
                FROM unnest(v_ids, v_fails, v_texts) AS e(id, fails, entry)
                WHERE w.shard = p_shard AND w.id = e.id AND w.state = 'waiting'
                RETURNING w.id, w.state, w.on_failure IS NOT NULL AS has_errbacks
            )
            SELECT array_agg(r.id),
                   failed || array_agg(r.id) FILTER (WHERE r.state = 'failed' AND r.has_errbacks)
            INTO ended, failed FROM ended_rows AS r;
        END IF;

        IF ended IS NOT NULL THEN
            PERFORM pg_notify('akadze_done', string_agg(x.id::text, ','))
            FROM (SELECT e.id, (row_number() OVER ()) / 500 AS chunk
                  FROM unnest(ended) AS e(id)) AS x
            GROUP BY x.chunk;
            touched := touched + cardinality(ended);
        END IF;
    END IF;

    IF failed IS NOT NULL THEN
        -- Errbacks of the jobs that ended failed, in the same shard: each a job of its own,
        -- made here and routed there.
        v_queues := '{}';
        FOR v_errback IN
            SELECT s.task, s.queue, coalesce(s.args, '{}') AS args,
                   coalesce(s.priority, 0) AS priority, coalesce(s.delay, 0) AS delay,
                   coalesce(s.max_attempts, 3) AS max_attempts, s.expires_at,
                   coalesce(s.meta, '{}') AS meta, f.id AS upstream, s.flow,
                   CASE WHEN s.flow ? 'pass' THEN f.errors -> -1 END AS passed
            FROM akadze.jobs AS f
            CROSS JOIN LATERAL jsonb_to_recordset(f.on_failure) AS s(
                task text, queue text, args jsonb, priority integer, max_attempts integer,
                meta jsonb, flow jsonb, delay float8, expires_at timestamptz)
            WHERE f.shard = p_shard AND f.id = ANY(failed)
        LOOP
            INSERT INTO akadze.jobs (id, shard, task, queue, args, priority, scheduled_at,
                                     max_attempts, expires_at, meta, upstreams, flow,
                                     upstream_results, created_at)
            VALUES (nextval('akadze.citus_job_numbers') * 1024 + p_shard, p_shard,
                    v_errback.task, v_errback.queue, v_errback.args, v_errback.priority,
                    v_now + v_errback.delay * interval '1 second', v_errback.max_attempts,
                    v_errback.expires_at, v_errback.meta, ARRAY[v_errback.upstream],
                    v_errback.flow, v_errback.passed, v_now);
            touched := touched + 1;
            IF v_errback.delay <= 0 THEN
                v_queues := v_queues || v_errback.queue;
            END IF;
        END LOOP;
        PERFORM pg_notify('akadze_jobs', q) FROM (SELECT DISTINCT unnest(v_queues) AS q) AS d;
    END IF;

    RETURN touched;
END
$$
-- statement

-- hand_over (job_hand_over, Celery's Task.replace), inside complete_tx: what waits on the
-- running job waits on p_to instead, at the same place in its upstreams, and the job is
-- marked replaced_by p_to. Fenced like every outcome write (no row: the run no longer owns
-- the job). The replacement must be in the job's shard when anything waits on it (the same
-- tenant, or the same queue with one lane): a workflow is never split over shards.
CREATE OR REPLACE FUNCTION akadze.citus_hand_over(
    p_id bigint, p_run_count integer, p_claim_token bigint, p_to bigint)
RETURNS TABLE (id bigint, moved bigint, target bigint)
LANGUAGE plpgsql VOLATILE
AS $$
DECLARE
    v_shard integer := akadze.citus_shard_of(p_id);
    v_dependents bigint[];
    v_moved bigint := 0;
    v_target bigint := 0;
BEGIN
    SELECT j.dependents INTO v_dependents FROM akadze.jobs AS j
    WHERE j.shard = v_shard AND j.id = p_id AND j.run_count = p_run_count
      AND j.claim_token = p_claim_token AND j.state = 'running'
    FOR UPDATE;
    IF NOT FOUND THEN
        RETURN;
    END IF;
    IF v_dependents IS NOT NULL THEN
        IF akadze.citus_shard_of(p_to) <> v_shard THEN
            RAISE EXCEPTION USING ERRCODE = 'feature_not_supported',
                MESSAGE = format('job %s cannot hand over to job %s, which is in another '
                                 'shard: in Citus mode a workflow''s jobs share one shard '
                                 '(see docs/how-to/citus.md)', p_id, p_to);
        END IF;
        UPDATE akadze.jobs AS w SET upstreams = array_replace(w.upstreams, p_id, p_to)
        WHERE w.shard = v_shard AND w.id = ANY(v_dependents) AND w.state = 'waiting';
        GET DIAGNOSTICS v_moved = ROW_COUNT;
        UPDATE akadze.jobs AS t SET dependents = coalesce(t.dependents, '{}') || v_dependents
        WHERE t.shard = v_shard AND t.id = p_to;
        GET DIAGNOSTICS v_target = ROW_COUNT;
    END IF;
    UPDATE akadze.jobs AS j
    SET dependents = NULL, meta = j.meta || ('{"replaced_by": ' || p_to::text || '}')::jsonb
    WHERE j.shard = v_shard AND j.id = p_id;
    RETURN QUERY SELECT p_id, v_moved, v_target;
END
$$
-- statement

-- What Citus mode does not do yet (akadze_core/store/queries.py: citus_queries): a clear
-- error instead of a statement that would run on the wrong rows.
CREATE OR REPLACE FUNCTION akadze.citus_refuse(p_statement text) RETURNS boolean
LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION USING
        MESSAGE = p_statement || ' is not available in Citus mode (see docs/how-to/citus.md)',
        ERRCODE = 'feature_not_supported';
END
$$
