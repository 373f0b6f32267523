-- The akadze schema as the migrations leave a database (akadze_core/store/migrations.py): its
-- tables, indexes, sequences and functions, dumped by pg_dump from a freshly migrated
-- database. Generated, not applied by anything: edit a migration or sql/functions.sql, then
-- regenerate it with
--     python -m tests.schema_dump
-- (tests/integration/test_schema.py checks that the migrations add up to it).

CREATE SCHEMA akadze;

CREATE FUNCTION akadze.claim_is_limited(p_queue text) RETURNS boolean
    LANGUAGE plpgsql STABLE
    AS $$
BEGIN
    RETURN EXISTS (SELECT 1 FROM akadze.limits AS l
                   WHERE l.kind = 'task' OR (l.kind = 'queue' AND l.name = p_queue))
        OR EXISTS (SELECT 1 FROM akadze.jobs AS j
                   WHERE j.state = 'queued' AND j.queue = p_queue
                     AND j.meta ? 'concurrency_key');
END
$$;

CREATE FUNCTION akadze.claim_jobs(p_lock_timeout text, p_queue text, p_limit integer, p_worker_id bigint, p_floor_priority integer[], p_floor_at timestamp with time zone[], p_floor_id bigint[]) RETURNS TABLE(id bigint, task text, queue text, args text, state text, priority integer, scheduled_at timestamp with time zone, attempt integer, max_attempts integer, run_count integer, claim_token bigint, expires_at timestamp with time zone, meta text, created_at timestamp with time zone, started_at timestamp with time zone, cancel_requested boolean, last_error text, upstreams bigint[], upstream_results text, result_arg text, "position" integer, releases boolean, notified boolean)
    LANGUAGE plpgsql
    SET plan_cache_mode TO 'force_generic_plan'
    SET enable_seqscan TO 'off'
    SET enable_bitmapscan TO 'off'
    SET jit TO 'off'
    AS $$
#variable_conflict use_column
BEGIN
    IF p_lock_timeout IS NOT NULL THEN
        PERFORM set_config('lock_timeout', p_lock_timeout, true);
    END IF;
    -- A paused queue: claim nothing (akadze.queue_pause).
    IF akadze.queue_claimable(p_queue) IS NOT TRUE THEN
        RETURN;
    END IF;
    IF akadze.claim_is_limited(p_queue) THEN
        RETURN QUERY SELECT * FROM akadze.claim_jobs_limited(p_lock_timeout, p_queue, p_limit,
                                                             p_worker_id);
        RETURN;
    END IF;
    RETURN QUERY
        WITH RECURSIVE floor AS (
            SELECT * FROM unnest(p_floor_priority::integer[], p_floor_at::timestamptz[],
                                 p_floor_id::bigint[]) AS f(priority, at, id)
        ),
        unfloored(priority, floored) AS (
            -- Every priority present without a floor, ascending, one probe of the claim
            -- index apiece (a loose index scan): the next one above the last, below the next
            -- floor; none there, the walk steps onto that floor (a row marked floored,
            -- whose entries it never reads) and on past it. bigint bounds one past
            -- integer's range stand for "no bound".
            SELECT -2147483649::bigint, true
            UNION ALL
            SELECT coalesce(n.priority, b.below), n.priority IS NULL
            FROM unfloored AS l
            CROSS JOIN LATERAL (SELECT min(f.priority)::bigint AS below FROM floor AS f
                                WHERE f.priority > l.priority) AS b
            LEFT JOIN LATERAL (SELECT j.priority::bigint AS priority FROM akadze.jobs AS j
                               WHERE j.state = 'queued' AND j.queue = p_queue
                                 AND j.priority > l.priority
                                 AND j.priority < coalesce(b.below, 2147483648)
                               ORDER BY j.priority LIMIT 1) AS n ON true
            WHERE n.priority IS NOT NULL OR b.below IS NOT NULL
        ),
        picked AS (
            SELECT c.* FROM floor AS f CROSS JOIN LATERAL (
                SELECT j.id, j.priority, j.scheduled_at FROM akadze.jobs AS j
                WHERE j.state = 'queued' AND j.queue = p_queue AND j.priority = f.priority
                  AND (j.scheduled_at, j.id) > (f.at, f.id) AND j.scheduled_at <= now()
                  -- A keyed job queued after claim_is_limited looked is the limited claim's.
                  AND NOT j.meta ? 'concurrency_key'
                ORDER BY j.scheduled_at, j.id
                LIMIT p_limit
                FOR UPDATE SKIP LOCKED
            ) AS c
            UNION ALL
            -- The unfloored priorities come in ascending order and each in (scheduled_at,
            -- id) order, so the rows come in the claim's order, and the LIMIT stops the
            -- walk, the reads and the locks at the first p_limit: no more are locked than
            -- a single read of them all in that order would lock.
            (SELECT c.* FROM unfloored AS u CROSS JOIN LATERAL (
                SELECT j.id, j.priority, j.scheduled_at FROM akadze.jobs AS j
                WHERE j.state = 'queued' AND j.queue = p_queue AND j.priority = u.priority
                  AND j.scheduled_at <= now()
                  -- A keyed job queued after claim_is_limited looked is the limited claim's.
                  AND NOT j.meta ? 'concurrency_key'
                ORDER BY j.scheduled_at, j.id
                LIMIT p_limit
                FOR UPDATE SKIP LOCKED
            ) AS c
            WHERE NOT u.floored
            LIMIT p_limit)
        ),
        chosen AS (
            SELECT id FROM picked ORDER BY priority, scheduled_at, id LIMIT p_limit
        ),
        claimed AS (
            UPDATE akadze.jobs AS j
            SET state = CASE WHEN j.cancel_requested OR j.expires_at <= now()
                             THEN 'cancelled' ELSE 'running' END,
                run_count = j.run_count + CASE WHEN j.cancel_requested OR j.expires_at <= now()
                                               THEN 0 ELSE 1 END,
                attempt = j.attempt + CASE WHEN j.cancel_requested OR j.expires_at <= now()
                                           THEN 0 ELSE 1 END,
                worker_id = CASE WHEN j.cancel_requested OR j.expires_at <= now()
                                 THEN NULL ELSE p_worker_id END,
                started_at = now(),
                -- The run's fencing token (with run_count): random, so a claim lost in a failover
                -- and made again under the same run_count still gets a token of its own.
                claim_token = (random() * 9007199254740992)::bigint,
                finished_at = CASE WHEN j.cancel_requested OR j.expires_at <= now()
                                   THEN now() END
            WHERE j.id = ANY(ARRAY(SELECT id FROM chosen))
            RETURNING j.*
        ),
        settled AS (
            SELECT akadze.settle(array_agg(id)) AS touched FROM claimed
            WHERE state = 'cancelled' AND (dependents IS NOT NULL OR on_failure IS NOT NULL)
            HAVING count(*) > 0
        )
        SELECT id, task, queue, args::text AS args, state, priority, scheduled_at, attempt,
               max_attempts, run_count, claim_token, expires_at, meta::text AS meta, created_at,
               started_at, cancel_requested, (errors -> -1)::text AS last_error, upstreams,
               upstream_results::text AS upstream_results, flow->>'result_arg' AS result_arg, position,
               -- Its outcome is flushed without waiting for company when it may release a job
               -- that waits on it: a chain's next step, a fan-in's body with few upstreams left
               -- (no more than this claim takes). Every other member of a fan-in gathers like a
               -- plain job: a 10,000-member chord's drain wrote an outcome batch per claim.
               dependents IS NOT NULL AND EXISTS (
                   SELECT 1 FROM akadze.jobs AS d
                   WHERE d.id = ANY(claimed.dependents) AND d.state = 'waiting'
                     AND d.waiting_for <= p_limit) AS releases,
               CASE WHEN state = 'cancelled' THEN pg_notify('akadze_done', id::text) IS NULL END
                   AS notified
        FROM claimed
        WHERE (SELECT count(*) FROM settled) >= 0
        ORDER BY priority, scheduled_at, id;
END
$$;

CREATE FUNCTION akadze.claim_jobs_fair(p_lock_timeout text, p_queue text, p_limit integer, p_worker_id bigint, p_after_task text) RETURNS TABLE(id bigint, task text, queue text, args text, state text, priority integer, scheduled_at timestamp with time zone, attempt integer, max_attempts integer, run_count integer, claim_token bigint, expires_at timestamp with time zone, meta text, created_at timestamp with time zone, started_at timestamp with time zone, cancel_requested boolean, last_error text, upstreams bigint[], upstream_results text, result_arg text, "position" integer, releases boolean, notified boolean)
    LANGUAGE plpgsql
    SET jit TO 'off'
    AS $$
#variable_conflict use_column
BEGIN
    IF p_lock_timeout IS NOT NULL THEN
        PERFORM set_config('lock_timeout', p_lock_timeout, true);
    END IF;
    -- A paused queue: claim nothing (akadze.queue_pause).
    IF akadze.queue_claimable(p_queue) IS NOT TRUE THEN
        RETURN;
    END IF;
    IF akadze.claim_is_limited(p_queue) THEN
        RETURN QUERY SELECT * FROM akadze.claim_jobs_limited(p_lock_timeout, p_queue, p_limit,
                                                             p_worker_id);
        RETURN;
    END IF;
    RETURN QUERY
        WITH RECURSIVE tasks AS (
            -- Each (task, priority) present, one probe of the index apiece (a loose index
            -- scan), so that each is read by (scheduled_at, id) up to now() below: read by
            -- (priority, scheduled_at, id) within a task, `scheduled_at <= now()` bounds
            -- nothing and the read passes every job of the task scheduled for later.
            (SELECT task, priority FROM akadze.jobs
             WHERE state = 'queued' AND queue = p_queue ORDER BY task, priority LIMIT 1)
            UNION ALL
            SELECT n.task, n.priority FROM tasks CROSS JOIN LATERAL (
                SELECT j.task, j.priority FROM akadze.jobs AS j
                WHERE j.state = 'queued' AND j.queue = p_queue
                  AND (j.task, j.priority) > (tasks.task, tasks.priority)
                ORDER BY j.task, j.priority LIMIT 1
            ) AS n
        ),
        candidates AS (
            SELECT c.id, c.priority, c.scheduled_at, tasks.task,
                   (p_after_task::text IS NOT NULL AND tasks.task <= p_after_task) AS wrapped,
                   row_number() OVER (PARTITION BY tasks.task
                                      ORDER BY c.priority, c.scheduled_at, c.id) AS turn
            FROM tasks
            CROSS JOIN LATERAL (
                SELECT id, priority, scheduled_at FROM akadze.jobs AS j
                WHERE j.state = 'queued' AND j.queue = p_queue AND j.task = tasks.task
                  AND j.priority = tasks.priority AND j.scheduled_at <= now()
                  -- A keyed job queued after claim_is_limited looked is the limited claim's.
                  AND NOT j.meta ? 'concurrency_key'
                ORDER BY j.scheduled_at, j.id
                LIMIT p_limit
            ) AS c
        ),
        picked AS (
            SELECT j.id, c.turn, c.wrapped
            FROM akadze.jobs AS j JOIN candidates AS c ON c.id = j.id
            WHERE j.state = 'queued'
            ORDER BY c.turn, c.priority, c.wrapped, c.task, c.scheduled_at, c.id
            LIMIT p_limit
            FOR UPDATE OF j SKIP LOCKED
        ),
        claimed AS (
            UPDATE akadze.jobs AS j
            SET state = CASE WHEN j.cancel_requested OR j.expires_at <= now()
                             THEN 'cancelled' ELSE 'running' END,
                run_count = j.run_count + CASE WHEN j.cancel_requested OR j.expires_at <= now()
                                               THEN 0 ELSE 1 END,
                attempt = j.attempt + CASE WHEN j.cancel_requested OR j.expires_at <= now()
                                           THEN 0 ELSE 1 END,
                worker_id = CASE WHEN j.cancel_requested OR j.expires_at <= now()
                                 THEN NULL ELSE p_worker_id END,
                started_at = now(),
                -- The run's fencing token (with run_count): random, so a claim lost in a failover
                -- and made again under the same run_count still gets a token of its own.
                claim_token = (random() * 9007199254740992)::bigint,
                finished_at = CASE WHEN j.cancel_requested OR j.expires_at <= now()
                                   THEN now() END
            FROM picked
            WHERE j.id = picked.id
            RETURNING j.*, picked.turn, picked.wrapped
        ),
        settled AS (
            SELECT akadze.settle(array_agg(id)) AS touched FROM claimed
            WHERE state = 'cancelled' AND (dependents IS NOT NULL OR on_failure IS NOT NULL)
            HAVING count(*) > 0
        )
        SELECT id, task, queue, args::text AS args, state, priority, scheduled_at, attempt,
               max_attempts, run_count, claim_token, expires_at, meta::text AS meta, created_at,
               started_at, cancel_requested, (errors -> -1)::text AS last_error, upstreams,
               upstream_results::text AS upstream_results, flow->>'result_arg' AS result_arg, position,
               -- Its outcome is flushed without waiting for company when it may release a job
               -- that waits on it: a chain's next step, a fan-in's body with few upstreams left
               -- (no more than this claim takes). Every other member of a fan-in gathers like a
               -- plain job: a 10,000-member chord's drain wrote an outcome batch per claim.
               dependents IS NOT NULL AND EXISTS (
                   SELECT 1 FROM akadze.jobs AS d
                   WHERE d.id = ANY(claimed.dependents) AND d.state = 'waiting'
                     AND d.waiting_for <= p_limit) AS releases,
               CASE WHEN state = 'cancelled' THEN pg_notify('akadze_done', id::text) IS NULL END
                   AS notified
        FROM claimed
        WHERE (SELECT count(*) FROM settled) >= 0
        -- In rotation order: the caller passes the last row's task as the next after_task.
        ORDER BY turn, priority, wrapped, task, scheduled_at, id;
END
$$;

CREATE FUNCTION akadze.claim_jobs_limited(p_lock_timeout text, p_queue text, p_limit integer, p_worker_id bigint) RETURNS TABLE(id bigint, task text, queue text, args text, state text, priority integer, scheduled_at timestamp with time zone, attempt integer, max_attempts integer, run_count integer, claim_token bigint, expires_at timestamp with time zone, meta text, created_at timestamp with time zone, started_at timestamp with time zone, cancel_requested boolean, last_error text, upstreams bigint[], upstream_results text, result_arg text, "position" integer, releases boolean, notified boolean)
    LANGUAGE plpgsql
    SET jit TO 'off'
    AS $$
#variable_conflict use_column
DECLARE
    v_room integer;
    v_want integer;
    v_found integer;
    v_round integer := 0;
    v_tasks text[] := '{}';
    v_task_room integer[] := '{}';
    v_keys text[] := '{}';
    v_key_room integer[] := '{}';
    v_full_tasks text[] := '{}';
    v_full_keys text[] := '{}';
    v_seen bigint[] := '{}';
    v_take bigint[] := '{}';
    v_job record;
    v_i integer;
    v_k integer;
    v_at timestamptz;
BEGIN
    IF p_lock_timeout IS NOT NULL THEN
        PERFORM set_config('lock_timeout', p_lock_timeout, true);
    END IF;
    v_room := least(coalesce(akadze.limit_room('queue', p_queue, true), p_limit), p_limit);
    -- Only the queue's own limit can bind (no task limit, no keyed job queued here): take
    -- the room in one set-based read, not job by job, so the queue's limit row -- which the
    -- fleet's claims of this queue take in turns -- is held for as short a time as the plain
    -- claim's statement. A keyed job committed since the check is left to the next claim.
    IF v_room > 0
       AND NOT EXISTS (SELECT 1 FROM akadze.limits AS l WHERE l.kind = 'task')
       AND NOT EXISTS (SELECT 1 FROM akadze.jobs AS j
                       WHERE j.state = 'queued' AND j.queue = p_queue
                         AND j.meta ? 'concurrency_key') THEN
        SELECT coalesce(array_agg(c.id), '{}') INTO v_take FROM (
            SELECT j.id FROM akadze.jobs AS j
            WHERE j.state = 'queued' AND j.queue = p_queue AND j.scheduled_at <= now()
              AND NOT j.meta ? 'concurrency_key'
            ORDER BY j.priority, j.scheduled_at, j.id
            LIMIT v_room
            FOR UPDATE SKIP LOCKED) AS c;
        v_round := 8;  -- taken: no job-by-job rounds
    END IF;
    WHILE cardinality(v_take) < v_room AND v_round < 8 LOOP
        v_round := v_round + 1;
        v_want := v_room - cardinality(v_take);
        v_found := 0;
        FOR v_job IN
            SELECT j.id, j.task, j.meta ->> 'concurrency_key' AS key,
                   j.meta ->> 'max_concurrency' AS max_concurrency
            FROM akadze.jobs AS j
            WHERE j.state = 'queued' AND j.queue = p_queue AND j.scheduled_at <= now()
              AND j.id <> ALL(v_seen) AND j.task <> ALL(v_full_tasks)
              AND NOT coalesce(j.meta ->> 'concurrency_key' = ANY(v_full_keys), false)
            ORDER BY j.priority, j.scheduled_at, j.id
            LIMIT v_want
            FOR UPDATE SKIP LOCKED
        LOOP
            v_found := v_found + 1;
            v_seen := v_seen || v_job.id;
            v_i := array_position(v_tasks, v_job.task);
            IF v_i IS NULL THEN
                v_tasks := v_tasks || v_job.task;
                v_task_room := v_task_room
                    || coalesce(akadze.limit_room('task', v_job.task, false), 2147483647);
                v_i := cardinality(v_tasks);
            END IF;
            IF v_task_room[v_i] <= 0 THEN
                v_full_tasks := v_full_tasks || v_job.task;
                CONTINUE;
            END IF;
            IF v_job.key IS NOT NULL THEN
                v_k := array_position(v_keys, v_job.key);
                IF v_k IS NULL THEN
                    v_keys := v_keys || v_job.key;
                    v_k := cardinality(v_keys);
                    IF pg_try_advisory_xact_lock(hashtext('akadze.concurrency_key'),
                                                 hashtext(v_job.key)) THEN
                        v_key_room := v_key_room || (
                            greatest(1, coalesce(v_job.max_concurrency::integer, 1))
                            - (SELECT count(*) FROM akadze.jobs AS r
                               WHERE r.state = 'running' AND r.meta ? 'concurrency_key'
                                 AND r.meta ->> 'concurrency_key' = v_job.key))::integer;
                    ELSE
                        v_key_room := v_key_room || 0;
                    END IF;
                END IF;
                IF v_key_room[v_k] <= 0 THEN
                    v_full_keys := v_full_keys || v_job.key;
                    CONTINUE;
                END IF;
                v_key_room[v_k] := v_key_room[v_k] - 1;
            END IF;
            v_task_room[v_i] := v_task_room[v_i] - 1;
            v_take := v_take || v_job.id;
        END LOOP;
        EXIT WHEN v_found < v_want;  -- nothing more to read
    END LOOP;
    IF cardinality(v_take) = 0 THEN
        RETURN;
    END IF;
    -- After every lock: later than each limit's count, earlier than the next holder's.
    v_at := clock_timestamp();
    RETURN QUERY
        WITH claimed AS (
            UPDATE akadze.jobs AS j
            SET state = CASE WHEN j.cancel_requested OR j.expires_at <= now()
                             THEN 'cancelled' ELSE 'running' END,
                run_count = j.run_count + CASE WHEN j.cancel_requested OR j.expires_at <= now()
                                               THEN 0 ELSE 1 END,
                attempt = j.attempt + CASE WHEN j.cancel_requested OR j.expires_at <= now()
                                           THEN 0 ELSE 1 END,
                worker_id = CASE WHEN j.cancel_requested OR j.expires_at <= now()
                                 THEN NULL ELSE p_worker_id END,
                -- The limits' instant: the starts a window is measured by.
                started_at = v_at,
                claim_token = (random() * 9007199254740992)::bigint,
                finished_at = CASE WHEN j.cancel_requested OR j.expires_at <= now()
                                   THEN now() END
            WHERE j.id = ANY(v_take)
            RETURNING j.*
        ),
        ledger AS (
            INSERT INTO akadze.limit_starts (kind, name, started_at, n)
            SELECT l.kind, l.name, v_at, count(*)
            FROM claimed AS c JOIN akadze.limits AS l
              ON (l.kind = 'queue' AND l.name = c.queue) OR (l.kind = 'task' AND l.name = c.task)
            WHERE c.state = 'running'
            GROUP BY l.kind, l.name
        ),
        settled AS (
            SELECT akadze.settle(array_agg(id)) AS touched FROM claimed
            WHERE state = 'cancelled' AND (dependents IS NOT NULL OR on_failure IS NOT NULL)
            HAVING count(*) > 0
        )
        SELECT id, task, queue, args::text AS args, state, priority, scheduled_at, attempt,
               max_attempts, run_count, claim_token, expires_at, meta::text AS meta, created_at,
               started_at, cancel_requested, (errors -> -1)::text AS last_error, upstreams,
               upstream_results::text AS upstream_results, flow->>'result_arg' AS result_arg, position,
               dependents IS NOT NULL AND EXISTS (
                   SELECT 1 FROM akadze.jobs AS d
                   WHERE d.id = ANY(claimed.dependents) AND d.state = 'waiting'
                     AND d.waiting_for <= p_limit) AS releases,
               CASE WHEN state = 'cancelled' THEN pg_notify('akadze_done', id::text) IS NULL END
                   AS notified
        FROM claimed
        WHERE (SELECT count(*) FROM settled) >= 0
        ORDER BY priority, scheduled_at, id;
END
$$;

CREATE FUNCTION akadze.complete_jobs(p_lock_timeout text, p_id bigint[], p_run_count integer[], p_claim_token bigint[], p_kind text[], p_result text[], p_delay double precision[], p_error text[], p_max_attempts integer[]) RETURNS TABLE(id bigint, run_count integer, state text, queue text, priority integer, scheduled_at timestamp with time zone, settled integer)
    LANGUAGE plpgsql
    SET jit TO 'off'
    AS $$
#variable_conflict use_column
BEGIN
    IF p_lock_timeout IS NOT NULL THEN
        PERFORM set_config('lock_timeout', p_lock_timeout, true);
    END IF;
    RETURN QUERY
        WITH outcome AS (
            SELECT * FROM unnest(p_id::bigint[], p_run_count::int[], p_claim_token::bigint[],
                                 p_kind::text[], p_result::text[], p_delay::float8[],
                                 p_error::text[], p_max_attempts::int[])
                AS o(id, run_count, claim_token, kind, result, delay, error, max_attempts)
        ),
        decided AS (
            SELECT o.*, j.attempt,
                   greatest(j.max_attempts, coalesce(o.max_attempts, 0)) AS budget,
                   CASE
                       WHEN o.kind = 'success' THEN 'succeeded'
                       WHEN o.kind = 'cancel' THEN 'cancelled'
                       WHEN j.cancel_requested OR j.expires_at <= now() THEN 'cancelled'
                       -- The worker's timer fired before this clock's expiry: run it later.
                       WHEN o.kind = 'unstarted' THEN 'queued'
                       WHEN o.kind = 'fail' THEN 'failed'
                       WHEN o.kind = 'snooze' THEN 'queued'
                       WHEN j.attempt >= greatest(j.max_attempts, coalesce(o.max_attempts, 0))
                           THEN 'failed'
                       ELSE 'queued'
                   END AS next_state,
                   -- Seed 003: a body that raised anything (Cancel included) after a cancel request
                   -- or expiry does not spend its attempt.
                   (o.kind IN ('snooze', 'unstarted')
                    OR (o.kind IN ('retry', 'fail', 'cancel')
                        AND (j.cancel_requested OR j.expires_at <= now())))
                       AS gives_back_attempt
            FROM (SELECT * FROM outcome ORDER BY id) AS o
            -- Each job by primary key, locked in id order. A plain join let the planner drive this
            -- from the partial index of running jobs when its statistics said "none are running",
            -- turning a flush into running x outcomes comparisons (seconds at 10,000 running).
            -- LIMIT 1 (ids are unique anyway) keeps the fence's quals from being pushed in here.
            CROSS JOIN LATERAL (SELECT * FROM akadze.jobs WHERE id = o.id LIMIT 1 FOR UPDATE) AS j
            WHERE j.run_count = o.run_count AND j.claim_token = o.claim_token AND j.state = 'running'
        ),
        updated AS (
        UPDATE akadze.jobs AS j
        SET state = d.next_state,
            attempt = j.attempt - CASE WHEN d.gives_back_attempt THEN 1 ELSE 0 END,
            max_attempts = d.budget,
            result = CASE WHEN d.kind = 'success' THEN d.result::jsonb ELSE j.result END,
            errors = CASE WHEN d.error IS NULL THEN j.errors
                          ELSE j.errors || jsonb_build_array(
                              d.error::jsonb || jsonb_build_object('attempt', j.attempt, 'at', now()))
                     END,
            scheduled_at = CASE WHEN d.next_state = 'queued'
                                THEN now() + d.delay * interval '1 second' ELSE j.scheduled_at END,
            worker_id = NULL,
            finished_at = CASE WHEN d.next_state = 'queued' THEN NULL ELSE now() END
        FROM decided AS d
        -- decided fenced these rows and holds their locks: matching the id is enough, and keeps
        -- this join on the primary key too.
        WHERE j.id = d.id
        RETURNING j.id, j.run_count, j.state, j.queue, j.priority, j.scheduled_at,
                  (j.dependents IS NOT NULL OR j.on_failure IS NOT NULL) AS settles
        ),
        -- Whoever waits for a result (App.wait_for_job) hears of finished jobs: one NOTIFY per
        -- flush and 500 ids, far below the 8000-byte payload limit.
        finished AS (
            SELECT pg_notify('akadze_done', string_agg(id::text, ',')) AS notified
            FROM (SELECT id, (row_number() OVER ()) / 500 AS chunk
                  FROM updated WHERE state <> 'queued') AS done
            GROUP BY chunk
        ),
        -- Workflows: the dependents and errbacks of the jobs that finished, in this transaction
        -- (akadze.settle; one call per flush, only when a finished job has any).
        settled AS (
            SELECT akadze.settle(array_agg(id)) AS touched FROM updated
            WHERE state <> 'queued' AND settles HAVING count(*) > 0
        )
        -- settled: what settle changed (NULL when it did not run), so the worker claims a released
        -- job at once instead of waiting for the NOTIFY.
        -- queue, priority, scheduled_at: where a job queued again (a retry) now sorts in its queue
        -- (the worker's claim floors, akadze_core/store/floors.py).
        SELECT id, run_count, state, queue, priority, scheduled_at,
               (SELECT touched FROM settled) AS settled FROM updated
        -- Referencing the CTEs makes them run.
        WHERE (SELECT count(*) FROM finished) >= 0 AND (SELECT count(*) FROM settled) >= 0;
END
$$;

CREATE FUNCTION akadze.doom_depth_passed(flow jsonb, depth integer) RETURNS integer
    LANGUAGE sql IMMUTABLE
    AS $$
    SELECT CASE WHEN flow->>'on_upstream_failure' IS DISTINCT FROM 'fail'
                THEN depth + coalesce((flow->>'enters')::integer, 0)
                WHEN depth = 0 THEN 0
                ELSE depth - 1 + coalesce((flow->>'enters')::integer, 0)
           END
$$;

CREATE FUNCTION akadze.job_notice(queue text, priority integer, scheduled_at timestamp with time zone) RETURNS text
    LANGUAGE sql STABLE PARALLEL SAFE
    RETURN ((((queue || chr(31)) || (priority)::text) || chr(31)) || (((EXTRACT(epoch FROM scheduled_at) * (1000000)::numeric))::bigint)::text);

CREATE FUNCTION akadze.limit_room(p_kind text, p_name text, p_wait boolean) RETURNS integer
    LANGUAGE plpgsql
    AS $$
DECLARE
    v_rate integer;
    v_period interval;
    v_now timestamptz;
    v_used bigint;
BEGIN
    IF p_wait THEN
        SELECT l.rate, l.period INTO v_rate, v_period FROM akadze.limits AS l
        WHERE l.kind = p_kind AND l.name = p_name FOR UPDATE;
    ELSE
        SELECT l.rate, l.period INTO v_rate, v_period FROM akadze.limits AS l
        WHERE l.kind = p_kind AND l.name = p_name FOR UPDATE SKIP LOCKED;
        IF NOT FOUND THEN
            RETURN CASE WHEN EXISTS (SELECT 1 FROM akadze.limits AS l
                                     WHERE l.kind = p_kind AND l.name = p_name) THEN 0 END;
        END IF;
    END IF;
    IF NOT FOUND THEN
        RETURN NULL;
    END IF;
    v_now := clock_timestamp();
    DELETE FROM akadze.limit_starts AS s
    WHERE s.kind = p_kind AND s.name = p_name AND s.started_at <= v_now - v_period;
    SELECT coalesce(sum(s.n), 0) INTO v_used FROM akadze.limit_starts AS s
    WHERE s.kind = p_kind AND s.name = p_name;
    RETURN greatest(v_rate - v_used, 0)::integer;
END
$$;

CREATE FUNCTION akadze.queue_claimable(p_queue text) RETURNS boolean
    LANGUAGE plpgsql
    SET jit TO 'off'
    AS $$
BEGIN
    PERFORM pg_advisory_xact_lock_shared(akadze.queue_pause_key(), hashtext(p_queue));
    RETURN NOT EXISTS (SELECT 1 FROM akadze.queue_pauses AS p WHERE p.queue = p_queue);
END
$$;

CREATE FUNCTION akadze.queue_pause(p_queue text, p_by text) RETURNS boolean
    LANGUAGE plpgsql
    AS $$
DECLARE
    inserted integer;
BEGIN
    PERFORM pg_advisory_xact_lock(akadze.queue_pause_key(), hashtext(p_queue));
    INSERT INTO akadze.queue_pauses (queue, paused_by) VALUES (p_queue, p_by)
    ON CONFLICT (queue) DO NOTHING;
    GET DIAGNOSTICS inserted = ROW_COUNT;
    PERFORM pg_notify('akadze_pauses', '1' || p_queue);
    RETURN inserted > 0;
END
$$;

CREATE FUNCTION akadze.queue_pause_key() RETURNS integer
    LANGUAGE sql IMMUTABLE
    AS $$ SELECT 1635412337 $$;

CREATE FUNCTION akadze.queue_resume(p_queue text) RETURNS boolean
    LANGUAGE plpgsql
    AS $$
DECLARE
    deleted integer;
BEGIN
    DELETE FROM akadze.queue_pauses WHERE queue = p_queue;
    GET DIAGNOSTICS deleted = ROW_COUNT;
    PERFORM pg_notify('akadze_pauses', '0' || p_queue);
    PERFORM pg_notify('akadze_jobs', p_queue);
    RETURN deleted > 0;
END
$$;

CREATE FUNCTION akadze.refuse(message text) RETURNS boolean
    LANGUAGE plpgsql
    AS $$
BEGIN
    RAISE EXCEPTION USING MESSAGE = message, ERRCODE = 'AKZ01';
END
$$;

CREATE FUNCTION akadze.settle(finished bigint[]) RETURNS integer
    LANGUAGE plpgsql
    SET plan_cache_mode TO 'force_generic_plan'
    SET jit TO 'off'
    AS $$
DECLARE
    -- The finished jobs that count down dependents, that doom them, that have errbacks.
    succeeded bigint[];
    doomed_by bigint[];
    failed bigint[];
    ready bigint[];
    ended bigint[];
    touched integer := 0;
BEGIN
    -- These rows were finished by the calling statement, which holds their locks: their
    -- state cannot change under us.
    SELECT array_agg(j.id) FILTER (WHERE j.state = 'succeeded' AND j.dependents IS NOT NULL),
           array_agg(j.id) FILTER (WHERE j.state IN ('failed', 'cancelled')
                                   AND j.dependents IS NOT NULL),
           array_agg(j.id) FILTER (WHERE j.state = 'failed' AND j.on_failure IS NOT NULL)
    INTO succeeded, doomed_by, failed
    FROM (SELECT DISTINCT f.id FROM unnest(finished) AS f(id)) AS f
    CROSS JOIN LATERAL (SELECT x.id, x.state, x.dependents, x.on_failure
                        FROM akadze.jobs AS x WHERE x.id = f.id LIMIT 1) AS j;

    -- Successes and failures together (one flush of a busy worker): lock everything this
    -- call may change first, in one statement and in id order -- the successes'
    -- dependents and what waits downstream of the failures. Locked by the two steps below
    -- one after the other, two flushes could deadlock: each holding a dependent of its
    -- success that the other's failure dooms.
    IF succeeded IS NOT NULL AND doomed_by IS NOT NULL THEN
        PERFORM 1 FROM akadze.jobs AS w
        WHERE w.id IN (
            WITH RECURSIVE doomed(id) AS (
                SELECT d.id
                FROM akadze.jobs AS j CROSS JOIN LATERAL unnest(j.dependents) AS d(id)
                WHERE j.id = ANY(doomed_by)
                UNION
                SELECT d.id
                FROM doomed JOIN akadze.jobs AS x ON x.id = doomed.id
                CROSS JOIN LATERAL unnest(x.dependents) AS d(id)
                WHERE x.state = 'waiting'
            )
            SELECT id FROM doomed
            UNION
            SELECT d.id
            FROM akadze.jobs AS j CROSS JOIN LATERAL unnest(j.dependents) AS d(id)
            WHERE j.id = ANY(succeeded))
          AND w.state = 'waiting'
        ORDER BY w.id
        FOR UPDATE OF w;
    END IF;

    IF succeeded IS NOT NULL THEN
        -- Successes count down their dependents, once per dependent and statement, in id
        -- order (two settles locking the same dependents cannot deadlock).
        WITH counted AS (
            SELECT d.id, count(*)::integer AS n
            FROM akadze.jobs AS j CROSS JOIN LATERAL unnest(j.dependents) AS d(id)
            WHERE j.id = ANY(succeeded)
            GROUP BY d.id
        ), locked AS (
            SELECT w.id FROM akadze.jobs AS w JOIN counted AS c ON c.id = w.id
            WHERE w.state = 'waiting' ORDER BY w.id FOR UPDATE OF w
        ), updated AS (
            UPDATE akadze.jobs AS w SET waiting_for = w.waiting_for - c.n
            FROM counted AS c
            WHERE w.id = c.id AND w.id IN (SELECT id FROM locked) AND w.state = 'waiting'
            RETURNING w.id, w.waiting_for
        )
        -- RETURNING gives the new count: only the jobs at zero go on to the release.
        SELECT array_agg(id) FILTER (WHERE waiting_for <= 0) INTO ready FROM updated;
    END IF;

    IF ready IS NOT NULL THEN
        -- Release the ones at zero. A new statement: its snapshot is taken after the locks
        -- above were granted, so every upstream's result is visible here.
        WITH released AS (
            UPDATE akadze.jobs AS w
            SET state = 'queued',
                scheduled_at = greatest(w.scheduled_at,
                    now() + coalesce((w.flow->>'delay')::float8, 0) * interval '1 second'),
                upstream_results = CASE w.flow->>'pass'
                    WHEN 'one' THEN (SELECT u.result FROM akadze.jobs AS u
                                     WHERE u.id = w.upstreams[1])
                    WHEN 'list' THEN (SELECT coalesce(jsonb_agg(u.result ORDER BY o.ord), '[]')
                                      FROM unnest(w.upstreams) WITH ORDINALITY AS o(id, ord)
                                      JOIN akadze.jobs AS u ON u.id = o.id)
                    END
            WHERE w.id = ANY(ready) AND w.state = 'waiting' AND w.waiting_for <= 0
            RETURNING w.queue, w.scheduled_at <= now() AS due
        )
        SELECT touched + count(*) INTO touched
        FROM (SELECT pg_notify('akadze_jobs', queue) FROM released WHERE due GROUP BY queue) AS n;
    END IF;

    IF doomed_by IS NOT NULL THEN
        -- Failures and cancellations end everything waiting downstream of them, never run.
        -- The waiting rows read here cannot change meanwhile but by another settle of the
        -- same failure's descendants, which the UPDATE's state = 'waiting' re-check then
        -- skips.
        -- depth: how many fan-ins' inputs (Workflow.mark_inputs: each input's flow
        -- 'enters' counts the fan-ins it opens) the failure entered from outside, and has
        -- not closed, on its way to the job. A fail-on-upstream job reached at depth 0 is
        -- a fan-in whose own inputs failed: it fails, and what follows it sees a failure
        -- from inside (depth 0; `via` names the fan-in), so that a fan-in among whose
        -- inputs it is fails too (a chord in the body of a chord whose header failed, as
        -- Celery's error handling fails it). Reached at a greater depth, the failure came
        -- from before its inputs: it closes one of those fan-ins, is cancelled, and passes
        -- the rest of the depth on, plus the fan-ins it opens.
        WITH RECURSIVE doomed(id, culprit, depth, via) AS (
            SELECT d.id, j.id, 0, NULL::bigint
            FROM akadze.jobs AS j CROSS JOIN LATERAL unnest(j.dependents) AS d(id)
            WHERE j.id = ANY(doomed_by)
            UNION
            SELECT d.id, doomed.culprit,
                   akadze.doom_depth_passed(w.flow, doomed.depth),
                   CASE WHEN w.flow->>'on_upstream_failure' = 'fail' AND doomed.depth = 0
                        THEN w.id ELSE doomed.via END
            FROM doomed JOIN akadze.jobs AS w ON w.id = doomed.id
            CROSS JOIN LATERAL unnest(w.dependents) AS d(id)
            WHERE w.state = 'waiting'
        ), first_culprit AS (
            -- Reached along several paths, a job takes the least depth: a failure inside
            -- a fan-in's inputs fails it whatever else reached it from outside.
            SELECT DISTINCT ON (id) id, culprit, depth, via
            FROM doomed ORDER BY id, depth, culprit, via
        ), locked AS (
            SELECT w.id FROM akadze.jobs AS w JOIN first_culprit AS f ON f.id = w.id
            WHERE w.state = 'waiting' ORDER BY w.id FOR UPDATE OF w
        ), decided AS (
            SELECT f.id, f.via, c.id AS culprit, c.state AS culprit_state,
                   c.errors -> -1 AS culprit_error,
                   w.flow->>'on_upstream_failure' = 'fail' AND f.depth = 0 AS fails,
                   akadze.doom_depth_passed(w.flow, f.depth) AS entered
            FROM first_culprit AS f JOIN akadze.jobs AS w ON w.id = f.id
            JOIN akadze.jobs AS c ON c.id = f.culprit
        ), ended_rows AS (
            -- The entry names the job that stopped this one: the failed or cancelled
            -- culprit, or for a job cancelled after a fan-in that failed in this walk that
            -- fan-in (its entry, which is written by this same statement, rebuilt). A
            -- fan-in that fails names the culprit among its inputs. `entered`: the depth
            -- the job passes on; above 0 it lies inside inputs the failure came from
            -- outside of (akadze_compat: a Celery task never sent).
            UPDATE akadze.jobs AS w
            SET state = CASE WHEN d.fails THEN 'failed' ELSE 'cancelled' END,
                finished_at = now(),
                errors = w.errors || jsonb_build_array(CASE
                    WHEN d.via IS NULL OR d.fails THEN jsonb_build_object(
                        'type', 'UpstreamFailed',
                        'message', format('upstream job %s %s', d.culprit, d.culprit_state),
                        'traceback', NULL, 'attempt', w.attempt, 'at', now(),
                        'upstream', d.culprit, 'upstream_state', d.culprit_state,
                        'upstream_error', d.culprit_error, 'entered', d.entered)
                    ELSE jsonb_build_object(
                        'type', 'UpstreamFailed',
                        'message', format('upstream job %s failed', d.via),
                        'traceback', NULL, 'attempt', w.attempt, 'at', now(),
                        'upstream', d.via, 'upstream_state', 'failed',
                        'upstream_error', jsonb_build_object(
                            'type', 'UpstreamFailed',
                            'message', format('upstream job %s %s', d.culprit,
                                              d.culprit_state),
                            'traceback', NULL, 'at', now(),
                            'upstream', d.culprit, 'upstream_state', d.culprit_state,
                            'upstream_error', d.culprit_error),
                        'entered', d.entered)
                    END)
            FROM decided AS d
            WHERE w.id = d.id AND w.id IN (SELECT id FROM locked) AND w.state = 'waiting'
            RETURNING w.id, w.state, w.on_failure IS NOT NULL AS has_errbacks
        )
        SELECT array_agg(id), failed || array_agg(id) FILTER (WHERE state = 'failed'
                                                              AND has_errbacks)
        INTO ended, failed FROM ended_rows;

        IF ended IS NOT NULL THEN
            PERFORM pg_notify('akadze_done', string_agg(id::text, ','))
            FROM (SELECT id, (row_number() OVER ()) / 500 AS chunk
                  FROM unnest(ended) AS e(id)) AS x
            GROUP BY chunk;
            touched := touched + cardinality(ended);
        END IF;
    END IF;

    IF failed IS NOT NULL THEN
        -- Errbacks of the jobs that ended failed (their own failure, or a failed chord
        -- body).
        WITH inserted AS (
            INSERT INTO akadze.jobs (task, queue, args, priority, scheduled_at, max_attempts,
                                     expires_at, meta, upstreams, flow, upstream_results)
            SELECT s.task, s.queue, coalesce(s.args, '{}'), coalesce(s.priority, 0),
                   now() + coalesce(s.delay, 0) * interval '1 second',
                   coalesce(s.max_attempts, 3), s.expires_at, coalesce(s.meta, '{}'),
                   ARRAY[f.id], s.flow, CASE WHEN s.flow ? 'pass' THEN f.errors -> -1 END
            FROM akadze.jobs AS f
            CROSS JOIN LATERAL jsonb_to_recordset(f.on_failure) AS s(
                task text, queue text, args jsonb, priority integer, max_attempts integer,
                meta jsonb, flow jsonb, delay float8, expires_at timestamptz)
            WHERE f.id = ANY(failed)
            RETURNING queue, scheduled_at <= now() AS due
        )
        SELECT touched + count(*) INTO touched
        FROM (SELECT pg_notify('akadze_jobs', queue) FROM inserted WHERE due GROUP BY queue)
            AS n;
    END IF;

    RETURN touched;
END
$$;

CREATE TABLE akadze.control_replies (
    request_id bigint NOT NULL,
    worker_id bigint NOT NULL,
    worker_name text NOT NULL,
    reply jsonb,
    created_at timestamp with time zone DEFAULT now() NOT NULL
);

CREATE TABLE akadze.control_requests (
    id bigint NOT NULL,
    command text NOT NULL,
    arguments jsonb DEFAULT '{}'::jsonb NOT NULL,
    targets bigint[] NOT NULL,
    reply boolean NOT NULL,
    created_at timestamp with time zone DEFAULT now() NOT NULL,
    expires_at timestamp with time zone NOT NULL
);

ALTER TABLE akadze.control_requests ALTER COLUMN id ADD GENERATED ALWAYS AS IDENTITY (
    SEQUENCE NAME akadze.control_requests_id_seq
    START WITH 1
    INCREMENT BY 1
    NO MINVALUE
    NO MAXVALUE
    CACHE 1
);

CREATE TABLE akadze.jobs (
    id bigint NOT NULL,
    task text NOT NULL,
    queue text NOT NULL,
    args jsonb DEFAULT '{}'::jsonb NOT NULL,
    state text DEFAULT 'queued'::text NOT NULL,
    priority integer DEFAULT 0 NOT NULL,
    scheduled_at timestamp with time zone DEFAULT now() NOT NULL,
    attempt integer DEFAULT 0 NOT NULL,
    max_attempts integer DEFAULT 3 NOT NULL,
    run_count integer DEFAULT 0 NOT NULL,
    errors jsonb DEFAULT '[]'::jsonb NOT NULL,
    result jsonb,
    meta jsonb DEFAULT '{}'::jsonb NOT NULL,
    expires_at timestamp with time zone,
    cancel_requested boolean DEFAULT false NOT NULL,
    unique_key text,
    worker_id bigint,
    created_at timestamp with time zone DEFAULT now() NOT NULL,
    started_at timestamp with time zone,
    finished_at timestamp with time zone,
    upstreams bigint[],
    waiting_for integer,
    dependents bigint[],
    flow jsonb,
    on_failure jsonb,
    upstream_results jsonb,
    cancel_signal smallint,
    "position" integer,
    claim_token bigint,
    CONSTRAINT jobs_max_attempts_check CHECK ((max_attempts >= 1)),
    CONSTRAINT jobs_state_check CHECK ((state = ANY (ARRAY['waiting'::text, 'queued'::text, 'running'::text, 'succeeded'::text, 'failed'::text, 'cancelled'::text])))
)
WITH (fillfactor='80', autovacuum_vacuum_scale_factor='0.02', autovacuum_analyze_scale_factor='0.02');

COMMENT ON COLUMN akadze.jobs."position" IS 'The job''s index in the fan-out it was added with (Workflow.add_many(first_position=)), else NULL';

COMMENT ON COLUMN akadze.jobs.claim_token IS 'Random per claim: with run_count, the fencing token of the run that holds the job';

ALTER TABLE akadze.jobs ALTER COLUMN id ADD GENERATED ALWAYS AS IDENTITY (
    SEQUENCE NAME akadze.jobs_id_seq
    START WITH 1
    INCREMENT BY 1
    NO MINVALUE
    NO MAXVALUE
    CACHE 1
);

CREATE TABLE akadze.limit_starts (
    kind text NOT NULL,
    name text NOT NULL,
    started_at timestamp with time zone NOT NULL,
    n integer NOT NULL
);

CREATE TABLE akadze.limits (
    kind text NOT NULL,
    name text NOT NULL,
    rate integer NOT NULL,
    period interval NOT NULL,
    CONSTRAINT limits_kind_check CHECK ((kind = ANY (ARRAY['queue'::text, 'task'::text]))),
    CONSTRAINT limits_period_check CHECK ((period > '00:00:00'::interval)),
    CONSTRAINT limits_rate_check CHECK ((rate >= 1))
);

COMMENT ON TABLE akadze.limits IS 'Rate limits: at most rate starts in any window of period, per queue or per task';

CREATE TABLE akadze.migrations (
    version integer NOT NULL,
    name text NOT NULL,
    applied_at timestamp with time zone DEFAULT now() NOT NULL
);

CREATE TABLE akadze.queue_pauses (
    queue text NOT NULL,
    paused_at timestamp with time zone DEFAULT now() NOT NULL,
    paused_by text
);

COMMENT ON TABLE akadze.queue_pauses IS 'Queues no worker claims from until resumed (akadze queues pause/resume)';

CREATE TABLE akadze.repeatable_migrations (
    name text NOT NULL,
    checksum text NOT NULL,
    applied_at timestamp with time zone DEFAULT now() NOT NULL
);

CREATE TABLE akadze.saved_groups (
    id text NOT NULL,
    result jsonb NOT NULL,
    saved_at timestamp with time zone DEFAULT now() NOT NULL
);

CREATE SEQUENCE akadze.schedule_versions
    START WITH 1
    INCREMENT BY 1
    NO MINVALUE
    NO MAXVALUE
    CACHE 1;

CREATE TABLE akadze.schedules (
    name text NOT NULL,
    spec text NOT NULL,
    last_tick timestamp with time zone NOT NULL,
    last_run timestamp with time zone,
    updated_at timestamp with time zone DEFAULT now() NOT NULL,
    source text DEFAULT 'code'::text NOT NULL,
    task text,
    args jsonb,
    queue text,
    priority integer,
    max_attempts integer,
    expires interval,
    meta jsonb,
    paused boolean DEFAULT false NOT NULL,
    version bigint,
    created_at timestamp with time zone DEFAULT now() NOT NULL,
    changed_at timestamp with time zone,
    CONSTRAINT schedules_runtime_definition CHECK (((source = 'code'::text) OR ((task IS NOT NULL) AND (args IS NOT NULL) AND (queue IS NOT NULL) AND (priority IS NOT NULL) AND (max_attempts >= 1) AND (meta IS NOT NULL) AND (version IS NOT NULL) AND (changed_at IS NOT NULL)))),
    CONSTRAINT schedules_source_check CHECK ((source = ANY (ARRAY['code'::text, 'runtime'::text])))
);

CREATE TABLE akadze.task_id_key (
    one boolean DEFAULT true NOT NULL,
    key text DEFAULT md5((gen_random_uuid())::text) NOT NULL,
    CONSTRAINT task_id_key_one_check CHECK (one)
);

CREATE TABLE akadze.workers (
    id bigint NOT NULL,
    name text NOT NULL,
    hostname text NOT NULL,
    pid integer NOT NULL,
    queues text[] NOT NULL,
    heartbeat_ttl interval NOT NULL,
    started_at timestamp with time zone DEFAULT now() NOT NULL,
    heartbeat_at timestamp with time zone DEFAULT now() NOT NULL,
    slots integer[]
);

ALTER TABLE akadze.workers ALTER COLUMN id ADD GENERATED ALWAYS AS IDENTITY (
    SEQUENCE NAME akadze.workers_id_seq
    START WITH 1
    INCREMENT BY 1
    NO MINVALUE
    NO MAXVALUE
    CACHE 1
);

ALTER TABLE ONLY akadze.control_replies
    ADD CONSTRAINT control_replies_pkey PRIMARY KEY (request_id, worker_id);

ALTER TABLE ONLY akadze.control_requests
    ADD CONSTRAINT control_requests_pkey PRIMARY KEY (id);

ALTER TABLE ONLY akadze.jobs
    ADD CONSTRAINT jobs_pkey PRIMARY KEY (id);

ALTER TABLE ONLY akadze.limits
    ADD CONSTRAINT limits_pkey PRIMARY KEY (kind, name);

ALTER TABLE ONLY akadze.migrations
    ADD CONSTRAINT migrations_pkey PRIMARY KEY (version);

ALTER TABLE ONLY akadze.queue_pauses
    ADD CONSTRAINT queue_pauses_pkey PRIMARY KEY (queue);

ALTER TABLE ONLY akadze.repeatable_migrations
    ADD CONSTRAINT repeatable_migrations_pkey PRIMARY KEY (name);

ALTER TABLE ONLY akadze.saved_groups
    ADD CONSTRAINT saved_groups_pkey PRIMARY KEY (id);

ALTER TABLE ONLY akadze.schedules
    ADD CONSTRAINT schedules_pkey PRIMARY KEY (name);

ALTER TABLE ONLY akadze.task_id_key
    ADD CONSTRAINT task_id_key_pkey PRIMARY KEY (one);

ALTER TABLE ONLY akadze.workers
    ADD CONSTRAINT workers_pkey PRIMARY KEY (id);

CREATE INDEX jobs_claim_idx ON akadze.jobs USING btree (queue, priority, scheduled_at, id) WHERE (state = 'queued'::text);

CREATE INDEX jobs_failed_queue_idx ON akadze.jobs USING btree (queue, id) WHERE (state = 'failed'::text);

CREATE INDEX jobs_finished_idx ON akadze.jobs USING btree (state, finished_at) WHERE (state = ANY (ARRAY['succeeded'::text, 'failed'::text, 'cancelled'::text]));

CREATE INDEX jobs_keyed_claim_idx ON akadze.jobs USING btree (queue, priority, scheduled_at, id) WHERE ((state = 'queued'::text) AND (meta ? 'concurrency_key'::text));

CREATE INDEX jobs_keyed_running_idx ON akadze.jobs USING btree (((meta ->> 'concurrency_key'::text))) WHERE ((state = 'running'::text) AND (meta ? 'concurrency_key'::text));

CREATE INDEX jobs_meta_task_id_idx ON akadze.jobs USING btree (((meta ->> 'task_id'::text))) WHERE (meta ? 'task_id'::text);

CREATE INDEX jobs_running_idx ON akadze.jobs USING btree (worker_id) WHERE (state = 'running'::text);

CREATE INDEX jobs_state_queue_idx ON akadze.jobs USING btree (state, queue) WHERE (state = ANY (ARRAY['waiting'::text, 'failed'::text, 'cancelled'::text]));

CREATE UNIQUE INDEX jobs_unique_key_idx ON akadze.jobs USING btree (unique_key) WHERE ((unique_key IS NOT NULL) AND (state = ANY (ARRAY['queued'::text, 'running'::text])));

CREATE INDEX limit_starts_idx ON akadze.limit_starts USING btree (kind, name, started_at);

ALTER TABLE ONLY akadze.limit_starts
    ADD CONSTRAINT limit_starts_kind_name_fkey FOREIGN KEY (kind, name) REFERENCES akadze.limits(kind, name) ON DELETE CASCADE;
