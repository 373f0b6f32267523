-- Integrations may give a job an external id in meta.task_id (the Celery facade stores a
-- caller-chosen Celery task id there); looking it up must not scan the table.
CREATE INDEX jobs_meta_task_id_idx ON akadze.jobs ((meta->>'task_id'))
    WHERE meta ? 'task_id';
