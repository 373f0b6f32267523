-- Citus mode (`akadze migrate --citus`): turns the tables the versioned migrations made on the
-- coordinator into a distributed jobs table and reference tables. Applied once, after the
-- versioned migrations and before sql/citus/functions.sql, one statement at a time (Citus
-- forwards DDL to the workers statement by statement), each block below separated by a line
-- holding only `-- statement`.
--
-- The distribution column is `shard`, a slot in [0, 16) that the id carries in its low ten
-- bits (id = n * 1024 + shard): any statement given an id knows its shard, so lookups,
-- cancel and requeue by id are router queries on one node.

ALTER TABLE akadze.jobs ALTER COLUMN id DROP IDENTITY IF EXISTS
-- statement
CREATE SEQUENCE IF NOT EXISTS akadze.citus_job_numbers
-- statement
ALTER TABLE akadze.jobs ADD COLUMN IF NOT EXISTS shard integer NOT NULL DEFAULT 0
-- statement
ALTER TABLE akadze.jobs DROP CONSTRAINT IF EXISTS jobs_pkey
-- statement
-- Unique per shard: Citus enforces a unique index only when it holds the distribution column.
ALTER TABLE akadze.jobs ADD CONSTRAINT jobs_pkey PRIMARY KEY (shard, id)
-- statement
DROP INDEX IF EXISTS akadze.jobs_unique_key_idx
-- statement
CREATE UNIQUE INDEX IF NOT EXISTS jobs_unique_key_idx ON akadze.jobs (shard, unique_key)
    WHERE unique_key IS NOT NULL AND state IN ('queued', 'running')
-- statement
DROP INDEX IF EXISTS akadze.jobs_claim_idx
-- statement
CREATE INDEX IF NOT EXISTS jobs_claim_idx ON akadze.jobs (shard, queue, priority, scheduled_at, id)
    WHERE state = 'queued'
-- statement
SELECT create_distributed_table('akadze.jobs', 'shard')
-- statement
SELECT create_reference_table('akadze.workers')
-- statement
SELECT create_reference_table('akadze.schedules')
-- statement
SELECT create_reference_table('akadze.control_requests')
-- statement
SELECT create_reference_table('akadze.control_replies')
-- statement
SELECT create_reference_table('akadze.saved_groups')
-- statement
SELECT create_reference_table('akadze.task_id_key')
-- statement
SELECT create_reference_table('akadze.queue_pauses')
-- statement
-- Lanes per queue: how many shards one queue's untenanted, unkeyed jobs spread over. Set by
-- `akadze migrate --citus --lanes N` (a one-row reference table read once per enqueue).
CREATE TABLE IF NOT EXISTS akadze.citus_settings (
    one boolean PRIMARY KEY DEFAULT true CONSTRAINT citus_settings_one CHECK (one),
    lanes integer NOT NULL DEFAULT 1 CONSTRAINT citus_settings_lanes CHECK (lanes BETWEEN 1 AND 16))
-- statement
SELECT create_reference_table('akadze.citus_settings')
-- statement
INSERT INTO akadze.citus_settings DEFAULT VALUES ON CONFLICT (one) DO NOTHING
-- statement
-- The rows the functions of sql/citus/functions.sql return, gathered shard by shard.
CREATE TYPE akadze.citus_claimed AS (
    id bigint, task text, queue text, args text, state text, priority integer,
    scheduled_at timestamptz, attempt integer, max_attempts integer, run_count integer,
    claim_token bigint, expires_at timestamptz, meta text, created_at timestamptz,
    started_at timestamptz, cancel_requested boolean, last_error text, upstreams bigint[],
    upstream_results text, result_arg text, "position" integer, releases boolean,
    notified boolean)
-- statement
CREATE TYPE akadze.citus_completed AS (
    id bigint, run_count integer, state text, queue text, priority integer,
    scheduled_at timestamptz, settled integer)
-- statement
CREATE TYPE akadze.citus_rescued AS (
    id bigint, state text, queue text, task text, attempt integer, max_attempts integer,
    retry_in float8, notified boolean)
