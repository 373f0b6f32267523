-- Task ids derived from job ids (akadze_core/task_ids.py): a job without meta.task_id is
-- known by a uuid4-shaped id computed from its job id and this database's key, so a
-- group of 10,000 members stores no id of its own per member and adds no entry per member
-- to jobs_meta_task_id_idx. The key is drawn once, here, so two databases never give
-- their jobs the same ids; it never changes (ids already handed out must keep resolving).
CREATE TABLE akadze.task_id_key (
    one boolean PRIMARY KEY DEFAULT true CHECK (one),
    key text    NOT NULL DEFAULT md5(gen_random_uuid()::text)
);
INSERT INTO akadze.task_id_key DEFAULT VALUES;
