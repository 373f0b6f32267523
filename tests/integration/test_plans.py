"""Hot-path statements stay index-driven whatever the planner's statistics say."""

from __future__ import annotations

import psycopg

from akadze_core.store import database


def test_complete_many_finds_jobs_by_primary_key_with_stale_statistics(
    db: psycopg.Connection,
) -> None:
    """Statistics taken while nothing ran say 'no running jobs'; the outcome write must still
    look each job up by id instead of scanning every running row per outcome."""
    db.execute("INSERT INTO akadze.jobs (task, queue, args) "
               "SELECT 't', 'q', '{}' FROM generate_series(1, 5000)")
    db.execute("ANALYZE akadze.jobs")
    db.execute("UPDATE akadze.jobs SET state = 'running', run_count = 1, claim_token = 7, "
               "worker_id = 1")
    ids = [row[0] for row in db.execute("SELECT id FROM akadze.jobs LIMIT 500")]
    params = {"lock_timeout": None, "id": ids, "run_count": [1] * len(ids),
              "claim_token": [7] * len(ids),
              "kind": ["success"] * len(ids),
              "result": ["null"] * len(ids), "delay": [0.0] * len(ids),
              "error": [None] * len(ids), "max_attempts": [None] * len(ids)}
    # The statement runs inside akadze.complete_jobs: auto_explain shows its plan.
    plans: list[str] = []
    db.add_notice_handler(lambda notice: plans.append(notice.message_primary or ""))
    db.execute("LOAD 'auto_explain'")
    db.execute("SET auto_explain.log_min_duration = 0")
    db.execute("SET auto_explain.log_nested_statements = on")
    db.execute("SET client_min_messages = log")
    rows = database.fetch_all(db, "job_complete_many", **params)
    db.execute("RESET client_min_messages")
    plan = "\n".join(text for text in plans if "UPDATE akadze.jobs" in text)
    assert "jobs_running_idx" not in plan, plan
    assert "jobs_pkey" in plan, plan
    assert len(rows) == 500 and {row["state"] for row in rows} == {"succeeded"}
