-- The dashboard workload's table: 1,000,000 jobs by default, 10,000 of them failed, finished
-- over the past week (about 6,000 in the last hour), a backlog and running jobs, in 8 queues
-- and 40 tasks; arguments, results and errors shaped like real ones.
INSERT INTO akadze.jobs (task, queue, args, state, priority, scheduled_at, attempt,
                         max_attempts, run_count, errors, result, meta, created_at,
                         started_at, finished_at, worker_id)
SELECT 'tasks.t' || (g %% 40), 'q' || (g %% 8),
       jsonb_build_object('n', g, 'user', 'u' || (g %% 977)),
       s.state, 0, s.created + interval '1 second', s.attempts, 3, s.attempts,
       CASE WHEN s.state = 'failed' THEN jsonb_build_array(jsonb_build_object(
           'type', 'ValueError', 'message', 'bad input ' || g, 'attempt', 3,
           'at', s.created + interval '3 seconds',
           'traceback', 'Traceback (most recent call last):\n  File "tasks.py", line 3\nValueError: bad input'))
            ELSE '[]'::jsonb END,
       CASE WHEN s.state = 'succeeded' THEN jsonb_build_object('ok', g) END,
       '{}'::jsonb, s.created,
       CASE WHEN s.state IN ('succeeded', 'failed', 'running') THEN s.created + interval '1.2 seconds' END,
       CASE WHEN s.state IN ('succeeded', 'failed', 'cancelled') THEN s.created + interval '2 seconds' END,
       CASE WHEN s.state = 'running' THEN 1 END
FROM generate_series(1, %(jobs)s) AS g
CROSS JOIN LATERAL (SELECT
    CASE WHEN g > %(jobs)s - %(queued)s - %(scheduled)s - %(running)s THEN
             CASE WHEN g > %(jobs)s - %(running)s THEN 'running' ELSE 'queued' END
         WHEN g %% (%(jobs)s / %(failed)s) = 0 THEN 'failed'
         WHEN g %% 500 = 1 THEN 'cancelled'
         ELSE 'succeeded' END AS state,
    CASE WHEN g %% (%(jobs)s / %(failed)s) = 0 THEN 3 ELSE 1 END AS attempts,
    -- Spread over the past week, the newest ids the most recent.
    now() - (%(jobs)s - g) * (interval '7 days' / %(jobs)s) AS created) AS s;
