-- django_celery_beat's own tables, read and written by akadze workers when beat_scheduler is
-- django_celery_beat's DatabaseScheduler (akadze_compat/django_beat.py). The tables are
-- django_celery_beat's (its migrations create them, in the database broker_url names); the
-- exactly-once state of each task lives in akadze.schedules, as for beat_schedule entries.
-- Run through akadze_core.store.database.run_statement.

-- name: djbeat_changed
-- django_celery_beat moves last_update whenever the ORM saves or deletes a periodic task or
-- a schedule (PeriodicTasks.changed and update_changed): the cheap check of every pass.
SELECT now() AS now,
       (SELECT last_update FROM django_celery_beat_periodictasks WHERE ident = 1)
           AS last_update;

-- name: djbeat_tasks
-- The enabled periodic tasks with their schedule, whichever of the four kinds it is.
SELECT t.id, t.name, t.task, t.args, t.kwargs, t.queue, t.exchange, t.routing_key, t.headers,
       t.priority, t.expires, t.expire_seconds, t.one_off, t.start_time, t.last_run_at,
       t.date_changed,
       t.interval_id, i.every AS interval_every, i.period AS interval_period,
       t.crontab_id, c.minute AS crontab_minute, c.hour AS crontab_hour,
       c.day_of_week AS crontab_day_of_week, c.day_of_month AS crontab_day_of_month,
       c.month_of_year AS crontab_month_of_year, c.timezone::text AS crontab_timezone,
       t.solar_id, s.event AS solar_event, s.latitude::float8 AS solar_latitude,
       s.longitude::float8 AS solar_longitude,
       t.clocked_id, k.clocked_time
FROM django_celery_beat_periodictask AS t
LEFT JOIN django_celery_beat_intervalschedule AS i ON i.id = t.interval_id
LEFT JOIN django_celery_beat_crontabschedule AS c ON c.id = t.crontab_id
LEFT JOIN django_celery_beat_solarschedule AS s ON s.id = t.solar_id
LEFT JOIN django_celery_beat_clockedschedule AS k ON k.id = t.clocked_id
WHERE t.enabled
ORDER BY t.id;

-- name: djbeat_ran
-- In the transaction that enqueued the task's run: what django_celery_beat's scheduler
-- writes after sending it. A run counts (total_run_count + 1, last_run_at = now); a one_off
-- task is then disabled as that scheduler disables it on its next check (saved disabled,
-- which clears last_run_at and, for one_off, resets the count) and the change is announced.
-- No row (the task was disabled, deleted, expired or not started in the meantime): the run
-- is withdrawn.
WITH ran AS (
    UPDATE django_celery_beat_periodictask
    SET last_run_at = CASE WHEN one_off THEN NULL ELSE now() END,
        total_run_count = CASE WHEN one_off THEN 0 ELSE total_run_count + 1 END,
        enabled = NOT one_off,
        date_changed = now()
    WHERE id = %(id)s AND enabled
      AND (expires IS NULL OR expires > now())
      AND (start_time IS NULL OR start_time <= now())
    RETURNING one_off
),
announced AS (
    INSERT INTO django_celery_beat_periodictasks (ident, last_update)
    SELECT 1, now() FROM ran WHERE ran.one_off
    ON CONFLICT (ident) DO UPDATE SET last_update = excluded.last_update
    RETURNING ident
)
SELECT one_off FROM ran;

-- name: djbeat_expire
-- Tasks past their expires time are disabled, as django_celery_beat's scheduler does (it
-- saves them disabled, which clears last_run_at, and announces nothing).
UPDATE django_celery_beat_periodictask
SET enabled = false, last_run_at = NULL, date_changed = now()
WHERE id = ANY(%(ids)s::int[]) AND enabled AND expires <= now()
RETURNING id;
