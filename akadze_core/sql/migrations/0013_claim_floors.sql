-- Claim floors (akadze_core/floors.py): a claim reads the claim index only above the last
-- key its worker claimed, and a job committed later with a lower key must lower that floor.
-- Inserts say the lowest key they wrote in their akadze_jobs notification: the queue, then
-- (after a unit separator) the priority and scheduled_at in microseconds since the epoch.
-- Postgres still folds identical notifications of a transaction into one: the enqueues of
-- one transaction share its now() and so, at one priority, their payload.
CREATE FUNCTION akadze.job_notice(queue text, priority integer, scheduled_at timestamptz)
RETURNS text
LANGUAGE sql STABLE PARALLEL SAFE
RETURN queue || chr(31) || priority::text || chr(31)
       || (extract(epoch FROM scheduled_at) * 1000000)::bigint::text;
