-- Workflows: a job may wait for others (chains, fan-in) and name jobs to insert when it
-- fails (errbacks). Everything that follows from an outcome is written by akadze.settle in
-- the transaction that writes the outcome, so it is never lost and never done twice.

ALTER TABLE akadze.jobs DROP CONSTRAINT jobs_state_check;
-- waiting: inserted, never claimed until every upstream succeeded.
ALTER TABLE akadze.jobs ADD CONSTRAINT jobs_state_check
    CHECK (state IN ('waiting', 'queued', 'running', 'succeeded', 'failed', 'cancelled'));

ALTER TABLE akadze.jobs
    -- The jobs this one waits on, in order (the order of upstream_results); for an
    -- errback job, the job whose failure inserted it.
    ADD COLUMN upstreams bigint[],
    -- Upstreams not yet succeeded; the job is released at 0.
    ADD COLUMN waiting_for integer,
    -- The waiting jobs to settle when this one finishes.
    ADD COLUMN dependents bigint[],
    -- How the job takes its upstreams: {"pass": "one"|"list", "result_arg": name,
    -- "on_upstream_failure": "fail", "delay": seconds after release}; all keys optional.
    ADD COLUMN flow jsonb,
    -- Jobs to insert when this one ends failed: a JSON array of
    -- {task, queue, args, priority, max_attempts, meta, flow, delay, expires_at}.
    ADD COLUMN on_failure jsonb,
    -- Written at release when flow.pass is set: the single upstream's result ("one") or
    -- the list of results in upstreams order ("list"); an errback's failed job's error.
    ADD COLUMN upstream_results jsonb;

-- Raise a clear error from inside a statement (a refused workflow inserts nothing).
CREATE FUNCTION akadze.refuse(message text) RETURNS boolean
LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION USING MESSAGE = message, ERRCODE = 'AKZ01';
END
$$;

-- settle(finished): what follows from jobs that have just reached a final state, called by
-- every statement that finishes a job with dependents or errbacks, after its own writes
-- (which a VOLATILE function's statements see). Set-based: one call per statement, however
-- many jobs it finished. Each step is its own statement so it takes a fresh snapshot: a
-- dependent's row lock waits for a concurrent settle of the same dependent, and the next
-- statement then sees what that one committed (the results of the other upstreams).
CREATE FUNCTION akadze.settle(finished bigint[]) RETURNS integer
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    decremented bigint[];
    ended bigint[];
    touched integer := 0;
BEGIN
    -- Successes and failures together (one flush of a busy worker): lock everything this
    -- call may change first, in one statement and in id order -- the successes'
    -- dependents and what waits downstream of the failures. Locked by the two steps below
    -- one after the other, two flushes could deadlock: each holding a dependent of its
    -- success that the other's failure dooms.
    IF EXISTS (SELECT 1 FROM akadze.jobs AS j WHERE j.id = ANY(finished)
               AND j.state = 'succeeded' AND j.dependents IS NOT NULL)
       AND EXISTS (SELECT 1 FROM akadze.jobs AS j WHERE j.id = ANY(finished)
                   AND j.state IN ('failed', 'cancelled') AND j.dependents IS NOT NULL) THEN
        PERFORM 1 FROM akadze.jobs AS w
        WHERE w.id IN (
            WITH RECURSIVE doomed(id) AS (
                SELECT d.id
                FROM akadze.jobs AS j CROSS JOIN LATERAL unnest(j.dependents) AS d(id)
                WHERE j.id = ANY(finished) AND j.state IN ('failed', 'cancelled')
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
            WHERE j.id = ANY(finished) AND j.state = 'succeeded')
          AND w.state = 'waiting'
        ORDER BY w.id
        FOR UPDATE OF w;
    END IF;

    -- Successes count down their dependents, once per dependent and statement, in id
    -- order (two settles locking the same dependents cannot deadlock).
    WITH counted AS (
        SELECT d.id, count(*)::integer AS n
        FROM akadze.jobs AS j CROSS JOIN LATERAL unnest(j.dependents) AS d(id)
        WHERE j.id = ANY(finished) AND j.state = 'succeeded'
        GROUP BY d.id
    ), locked AS (
        SELECT w.id FROM akadze.jobs AS w JOIN counted AS c ON c.id = w.id
        WHERE w.state = 'waiting' ORDER BY w.id FOR UPDATE OF w
    ), updated AS (
        UPDATE akadze.jobs AS w SET waiting_for = w.waiting_for - c.n
        FROM counted AS c
        WHERE w.id = c.id AND w.id IN (SELECT id FROM locked) AND w.state = 'waiting'
        RETURNING w.id
    )
    SELECT array_agg(id) INTO decremented FROM updated;

    IF decremented IS NOT NULL THEN
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
            WHERE w.id = ANY(decremented) AND w.state = 'waiting' AND w.waiting_for <= 0
            RETURNING w.queue, w.scheduled_at <= now() AS due
        )
        SELECT touched + count(*) INTO touched
        FROM (SELECT pg_notify('akadze_jobs', queue) FROM released WHERE due GROUP BY queue) AS n;
    END IF;

    -- Failures and cancellations end everything waiting downstream of them, never run.
    -- The waiting rows read here cannot change meanwhile but by another settle of the same
    -- failure's descendants, which the UPDATE's state = 'waiting' re-check then skips.
    WITH RECURSIVE doomed(id, culprit) AS (
        SELECT d.id, j.id
        FROM akadze.jobs AS j CROSS JOIN LATERAL unnest(j.dependents) AS d(id)
        WHERE j.id = ANY(finished) AND j.state IN ('failed', 'cancelled')
        UNION
        SELECT d.id, doomed.culprit
        FROM doomed JOIN akadze.jobs AS w ON w.id = doomed.id
        CROSS JOIN LATERAL unnest(w.dependents) AS d(id)
        WHERE w.state = 'waiting'
    ), first_culprit AS (
        SELECT DISTINCT ON (id) id, culprit FROM doomed ORDER BY id, culprit
    ), locked AS (
        SELECT w.id FROM akadze.jobs AS w JOIN first_culprit AS f ON f.id = w.id
        WHERE w.state = 'waiting' ORDER BY w.id FOR UPDATE OF w
    ), ended_rows AS (
        UPDATE akadze.jobs AS w
        SET state = CASE WHEN w.flow->>'on_upstream_failure' = 'fail' THEN 'failed'
                         ELSE 'cancelled' END,
            finished_at = now(),
            errors = w.errors || jsonb_build_array(jsonb_build_object(
                'type', 'UpstreamFailed',
                'message', format('upstream job %s %s', c.id, c.state),
                'traceback', NULL, 'attempt', w.attempt, 'at', now(),
                'upstream', c.id, 'upstream_state', c.state,
                'upstream_error', c.errors -> -1))
        FROM first_culprit AS f JOIN akadze.jobs AS c ON c.id = f.culprit
        WHERE w.id = f.id AND w.id IN (SELECT id FROM locked) AND w.state = 'waiting'
        RETURNING w.id
    )
    SELECT array_agg(id) INTO ended FROM ended_rows;

    IF ended IS NOT NULL THEN
        PERFORM pg_notify('akadze_done', string_agg(id::text, ','))
        FROM (SELECT id, (row_number() OVER ()) / 500 AS chunk FROM unnest(ended) AS e(id)) AS x
        GROUP BY chunk;
        touched := touched + cardinality(ended);
    END IF;

    -- Errbacks of the jobs that ended failed (their own failure, or a failed chord body).
    WITH failed AS (
        SELECT f.id, f.errors -> -1 AS error, f.on_failure
        FROM akadze.jobs AS f
        WHERE f.id = ANY(finished || coalesce(ended, '{}')) AND f.state = 'failed'
          AND f.on_failure IS NOT NULL
    ), inserted AS (
        INSERT INTO akadze.jobs (task, queue, args, priority, scheduled_at, max_attempts,
                                 expires_at, meta, upstreams, flow, upstream_results)
        SELECT s.task, s.queue, coalesce(s.args, '{}'), coalesce(s.priority, 0),
               now() + coalesce(s.delay, 0) * interval '1 second', coalesce(s.max_attempts, 3),
               s.expires_at, coalesce(s.meta, '{}'), ARRAY[f.id], s.flow,
               CASE WHEN s.flow ? 'pass' THEN f.error END
        FROM failed AS f
        CROSS JOIN LATERAL jsonb_to_recordset(f.on_failure) AS s(
            task text, queue text, args jsonb, priority integer, max_attempts integer,
            meta jsonb, flow jsonb, delay float8, expires_at timestamptz)
        RETURNING queue, scheduled_at <= now() AS due
    )
    SELECT touched + count(*) INTO touched
    FROM (SELECT pg_notify('akadze_jobs', queue) FROM inserted WHERE due GROUP BY queue) AS n;

    RETURN touched;
END
$$;
