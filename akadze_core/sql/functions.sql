-- The akadze functions: the one place each is defined. Re-applied whole by `akadze migrate`
-- whenever this file's checksum differs from the one recorded in akadze.repeatable_migrations,
-- after the versioned migrations (akadze_core/migrations.py says why and what that implies).
-- So a function is edited here, in place, and no migration restates it.
--
-- Every statement must be safe to run again on a database that already has it: CREATE OR
-- REPLACE FUNCTION (or CREATE OR REPLACE TRIGGER for a trigger binding one of them). A
-- function's name, arguments or return type cannot change that way: a versioned migration
-- drops the old one first (DROP FUNCTION IF EXISTS), and this file then creates the new one.

-- Raise a clear error from inside a statement (a refused workflow inserts nothing).
CREATE OR REPLACE FUNCTION akadze.refuse(message text) RETURNS boolean
LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION USING MESSAGE = message, ERRCODE = 'AKZ01';
END
$$;

-- The payload of an akadze_jobs notification (claim floors, akadze_core/floors.py): a claim
-- reads the claim index only above the last key its worker claimed, and a job committed
-- later with a lower key must lower that floor, so inserts say the lowest key they wrote:
-- the queue, then (after a unit separator) the priority and scheduled_at in microseconds
-- since the epoch. Postgres still folds identical notifications of a transaction into one:
-- the enqueues of one transaction share its now() and so, at one priority, their payload.
CREATE OR REPLACE FUNCTION akadze.job_notice(queue text, priority integer, scheduled_at timestamptz)
RETURNS text
LANGUAGE sql STABLE PARALLEL SAFE
RETURN queue || chr(31) || priority::text || chr(31)
       || (extract(epoch FROM scheduled_at) * 1000000)::bigint::text;

-- The depth a doomed job passes on to the jobs waiting on it, reached at `depth` (see the
-- walk in akadze.settle): a fan-in that fails (reached at 0) passes 0; one cancelled
-- closes one of the inputs entered from outside; any job adds the fan-ins it opens
-- (flow 'enters'). One SQL expression, inlined where it is called.
CREATE OR REPLACE FUNCTION akadze.doom_depth_passed(flow jsonb, depth integer) RETURNS integer
LANGUAGE sql IMMUTABLE
AS $$
    SELECT CASE WHEN flow->>'on_upstream_failure' IS DISTINCT FROM 'fail'
                THEN depth + coalesce((flow->>'enters')::integer, 0)
                WHEN depth = 0 THEN 0
                ELSE depth - 1 + coalesce((flow->>'enters')::integer, 0)
           END
$$;

-- settle(finished): what follows from jobs that have just reached a final state, called by
-- every statement that finishes a job with dependents or errbacks, after its own writes
-- (which a VOLATILE function's statements see), in the transaction that writes the outcome,
-- so it is never lost and never done twice. Set-based: one call per statement, however many
-- jobs it finished. Each step is its own statement so it takes a fresh snapshot: a
-- dependent's row lock waits for a concurrent settle of the same dependent, and the next
-- statement then sees what that one committed (the results of the other upstreams).
--
-- Cheap per call, since a fan-in's members settle once per outcome flush (on a 5,000-member
-- chord, 20 outcomes per flush: 0.3 ms a call, where looking the finished rows up again in
-- each step took 2.2 ms):
-- * The finished rows are read once, each by primary key (a lookup per id, LIMIT 1 so no
--   state test is pushed into it), and sorted into the three arrays the later steps need.
--   `id = ANY(finished) AND state = ...` in each step is answered with a bitmap AND of the
--   primary key and the finished-jobs index, reading every succeeded job of that index,
--   once per step and call: a cost that grows with the table's history.
-- * A step with nothing to do is not run: the usual flush (successes only) runs the read,
--   the count-down and, when a dependent reaches zero, the release; the recursive walk
--   downstream of failures and the errback insert run only when something failed.
-- * Generic plans (the function's plan_cache_mode): every statement is driven by arrays
--   through the primary key, so the arrays' contents cannot make another plan better, and
--   planning a custom plan per call cost more than running it.
--
-- A fail-on-upstream job (a Celery chord's body) fails only for a failure inside its inputs
-- (its header), and is cancelled when the failure came from before them: in
-- chain(a, chord(header, body)) a failing `a` cancels the header and the body, and an
-- errback linked to the whole chain runs once, as in Celery (which stores a's failure in
-- the later steps and calls no errback of theirs). A fan-in's inputs are marked when the
-- workflow is built (Workflow.mark_inputs: flow 'enters', how many fan-ins a job opens);
-- the walk downstream of a failure counts the inputs it entered from outside and the
-- fan-ins it closed.
--
-- Two facts go into the UpstreamFailed entry for akadze_compat to read Celery's states:
-- 'entered', above 0 for a job inside inputs the failure came from outside of (a Celery
-- task never sent: PENDING, where a later chain step reads FAILURE), and, for a job
-- cancelled after a fan-in that failed in the same walk, that fan-in as its 'upstream' (a
-- step after a failed chord body reads the body's ChordError, as in Celery).
CREATE OR REPLACE FUNCTION akadze.settle(finished bigint[]) RETURNS integer
LANGUAGE plpgsql VOLATILE
SET plan_cache_mode = force_generic_plan
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
