-- Saved group results (akadze_compat's GroupResult.save / restore, Celery's save_group):
-- a group's id and its as_tuple() form; its members' states stay in their jobs.

CREATE TABLE akadze.saved_groups (
    id       text        PRIMARY KEY,
    result   jsonb       NOT NULL,
    saved_at timestamptz NOT NULL DEFAULT now()
);
