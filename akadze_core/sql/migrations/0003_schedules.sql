-- Schedules' state: the last tick accounted for, per schedule name. The schedules themselves
-- live in code; a row whose schedule is no longer declared is ignored (and harmless).

CREATE TABLE akadze.schedules (
    name       text        PRIMARY KEY,
    -- The trigger's text when last_tick was set: a different one means the schedule changed.
    spec       text        NOT NULL,
    -- The latest tick that was enqueued or deliberately skipped; only later ticks fire.
    last_tick  timestamptz NOT NULL,
    -- The tick of the last enqueued run (NULL: none yet), for `akadze schedules`.
    last_run   timestamptz,
    updated_at timestamptz NOT NULL DEFAULT now()
);
