-- Flower's HTTP API and Prometheus series (akadze_compat.flower_api), read from the jobs and
-- workers tables. Only SELECTs: actions go through the facade (send_task, revoke) and the
-- workers' remote control. Every statement is bounded: by an index and a LIMIT, or by the
-- newest %(window)s ids (Flower keeps the last max_tasks tasks in memory; this reads as far).

-- name: tasks
-- The tasks list: the newest %(window)s jobs (a primary-key range), filtered, sorted as
-- asked (%(sort)s: id, name, state, received, started; %(descending)s), one page of it.
-- The worker's name comes from its row (gone once the worker unregistered).
WITH bounds AS (SELECT coalesce(max(id), 0) - %(window)s AS low FROM akadze.jobs)
SELECT j.*, w.name AS worker_name
FROM akadze.jobs AS j
LEFT JOIN akadze.workers AS w ON w.id = j.worker_id
WHERE j.id > (SELECT low FROM bounds)
  AND (%(task)s::text IS NULL OR j.task = %(task)s::text)
  AND (%(states)s::text[] IS NULL OR j.state = ANY(%(states)s::text[]))
  AND (%(worker)s::text IS NULL OR w.name = %(worker)s::text)
  AND (%(since)s::timestamptz IS NULL OR j.created_at >= %(since)s::timestamptz)
  AND (%(until)s::timestamptz IS NULL OR j.created_at <= %(until)s::timestamptz)
  AND (%(text)s::text IS NULL OR strpos(lower(j.task), lower(%(text)s::text)) > 0
       OR j.meta->>'task_id' = %(text)s::text)
ORDER BY
  CASE WHEN %(sort)s = 'name' AND NOT %(descending)s THEN j.task END ASC,
  CASE WHEN %(sort)s = 'name' AND %(descending)s THEN j.task END DESC,
  CASE WHEN %(sort)s = 'state' AND NOT %(descending)s THEN j.state END ASC,
  CASE WHEN %(sort)s = 'state' AND %(descending)s THEN j.state END DESC,
  CASE WHEN %(sort)s = 'started' AND NOT %(descending)s THEN j.started_at END ASC,
  CASE WHEN %(sort)s = 'started' AND %(descending)s THEN j.started_at END DESC,
  CASE WHEN %(sort)s = 'received' AND NOT %(descending)s THEN j.id END ASC,
  j.id DESC
LIMIT %(limit)s OFFSET %(offset)s;

-- name: task_types
-- The task names of the newest %(window)s jobs (Flower: the types its events have seen).
SELECT DISTINCT task FROM akadze.jobs
WHERE id > (SELECT coalesce(max(id), 0) - %(window)s FROM akadze.jobs)
ORDER BY task;

-- name: worker_of
-- The name of one worker (by id).
SELECT name FROM akadze.workers WHERE id = %(id)s;

-- name: workers
-- Every registered worker and whether it is live (its heartbeat within its TTL).
SELECT id, name, heartbeat_at > now() - heartbeat_ttl AS live FROM akadze.workers ORDER BY id;

-- name: clock
SELECT now() AS now;

-- name: finished_since
-- The jobs that reached final state %(state)s after the last scrape's mark (finished_at,
-- id) and at least %(lag)s seconds ago (an outcome's finished_at is its transaction's
-- start: the lag lets a commit in flight land first), oldest first, at most %(limit)s
-- (jobs_finished_idx).
SELECT j.id, j.task, j.state, j.started_at, j.finished_at, w.name AS worker_name,
       extract(epoch FROM j.finished_at - j.started_at) AS runtime
FROM akadze.jobs AS j
LEFT JOIN akadze.workers AS w ON w.id = j.worker_id
WHERE j.state = %(state)s::text
  AND j.finished_at >= %(after)s::timestamptz
  AND (j.finished_at, j.id) > (%(after)s::timestamptz, %(after_id)s::bigint)
  AND j.finished_at <= now() - make_interval(secs => %(lag)s)
ORDER BY j.finished_at, j.id
LIMIT %(limit)s;

-- name: running
-- The running jobs and their workers (jobs_running_idx), up to %(limit)s of them.
SELECT r.id, w.name AS worker_name
FROM (SELECT id, worker_id FROM akadze.jobs WHERE state = 'running' LIMIT %(limit)s) AS r
JOIN akadze.workers AS w ON w.id = r.worker_id;
