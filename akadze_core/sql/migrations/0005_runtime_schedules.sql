-- Runtime schedules: definitions stored next to the ticks, made and changed while workers
-- run (App.runtime_schedules, `akadze schedules add/pause/resume/remove`).
--
-- One row per schedule name, whoever owns it. `source` says who: 'code' rows are the state
-- rows of schedules declared in code (only name, spec, last_tick, last_run matter there);
-- 'runtime' rows also hold the definition. A name belongs to one source: adding a runtime
-- schedule over a code row is refused unless asked to replace it, and a worker that
-- declares in code a name owned by a runtime row skips its declaration (with a warning).

-- Every change of a runtime definition takes the next value: a worker compares the versions
-- it holds with the stored ones (a removed and re-added name gets a new one), and the tick
-- statement enqueues only for the version the worker computed the tick from.
CREATE SEQUENCE akadze.schedule_versions;

ALTER TABLE akadze.schedules
    ADD COLUMN source       text        NOT NULL DEFAULT 'code'
        CHECK (source IN ('code', 'runtime')),
    -- The job each tick enqueues, with the defaults resolved when the schedule was stored.
    ADD COLUMN task         text,
    ADD COLUMN args         jsonb,
    ADD COLUMN queue        text,
    ADD COLUMN priority     integer,
    ADD COLUMN max_attempts integer,
    -- A job's expires_at is its tick plus this (NULL: never expires).
    ADD COLUMN expires      interval,
    ADD COLUMN meta         jsonb,
    -- A paused schedule enqueues nothing; resuming does not run the ticks it missed.
    ADD COLUMN paused       boolean     NOT NULL DEFAULT false,
    ADD COLUMN version      bigint,
    ADD COLUMN created_at   timestamptz NOT NULL DEFAULT now(),
    -- When the definition last changed (updated_at moves with every tick).
    ADD COLUMN changed_at   timestamptz,
    ADD CONSTRAINT schedules_runtime_definition CHECK (
        source = 'code' OR (task IS NOT NULL AND args IS NOT NULL AND queue IS NOT NULL
                            AND priority IS NOT NULL AND max_attempts >= 1
                            AND meta IS NOT NULL AND version IS NOT NULL
                            AND changed_at IS NOT NULL));
