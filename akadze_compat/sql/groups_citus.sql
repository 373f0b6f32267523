-- Citus mode (docs/how-to/citus.md): the statements of groups.sql that Citus cannot run as
-- written, by the same names. Citus computes no now() inside ON CONFLICT DO UPDATE; in VALUES
-- it does, once, on the coordinator.

-- name: group_save
INSERT INTO akadze.saved_groups (id, result, saved_at) VALUES (%(id)s, %(result)s::jsonb, now())
ON CONFLICT (id) DO UPDATE SET result = excluded.result, saved_at = excluded.saved_at;
