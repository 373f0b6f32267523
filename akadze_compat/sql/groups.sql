-- akadze_compat's saved groups (GroupResult.save / restore / delete), in akadze.saved_groups
-- (migration 0006). Run through akadze_core.store.database.run_statement_sync.

-- name: group_save
INSERT INTO akadze.saved_groups (id, result) VALUES (%(id)s, %(result)s::jsonb)
ON CONFLICT (id) DO UPDATE SET result = excluded.result, saved_at = now();

-- name: group_load
SELECT result FROM akadze.saved_groups WHERE id = %(id)s;

-- name: group_delete
DELETE FROM akadze.saved_groups WHERE id = %(id)s;
