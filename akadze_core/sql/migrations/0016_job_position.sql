-- A job's position in the fan-out it was added with (Workflow.add_many(first_position=...):
-- a Celery group member's group_index), NULL for any other job. It was a key written into
-- each job's meta by the insert (jsonb_set per row, then a new jsonb each), which was an
-- eighth of a 10,000-member group's insert (63.7 -> 55.4 ms, medians of 12): with the
-- number in a column of its own, the members of a fan-out share one meta, as
-- enqueue_many's jobs do. Adding a nullable column without a default rewrites nothing.
ALTER TABLE akadze.jobs ADD COLUMN IF NOT EXISTS position integer;
COMMENT ON COLUMN akadze.jobs.position IS
    'The job''s index in the fan-out it was added with (Workflow.add_many(first_position=)), else NULL';
