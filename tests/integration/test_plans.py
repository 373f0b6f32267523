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


def test_claim_reads_indexes_on_its_cached_generic_plan(db: psycopg.Connection) -> None:
    """The claim keeps one generic plan per session: past the plan cache's first calls it
    must still read the claim index and fetch the claimed rows by primary key, never scan
    the table (a join to the chosen ids was planned as a hash join over every row)."""
    db.execute("INSERT INTO akadze.jobs (task, queue, args) "
               "SELECT 't', 'q', '{}' FROM generate_series(1, 5000)")
    db.execute("ANALYZE akadze.jobs")
    plans: list[str] = []
    db.add_notice_handler(lambda notice: plans.append(notice.message_primary or ""))
    db.execute("LOAD 'auto_explain'")
    db.execute("SET auto_explain.log_min_duration = 0")
    db.execute("SET auto_explain.log_nested_statements = on")
    db.execute("SET client_min_messages = log")
    claimed = []
    for _ in range(7):  # beyond the five custom plans a plan cache may try first
        plans.clear()
        claimed += database.fetch_all(
            db, "job_claim", lock_timeout=None, queue="q", limit=10, worker_id=1,
            floor_priority=[], floor_at=[], floor_id=[])
    db.execute("RESET client_min_messages")
    plan = "\n".join(text for text in plans if "UPDATE akadze.jobs" in text)
    assert "jobs_claim_idx" in plan and "jobs_pkey" in plan, plan
    assert "Seq Scan" not in plan and "Hash Join" not in plan, plan
    assert len(claimed) == 70 and len({row["id"] for row in claimed}) == 70


def test_the_claim_plan_kept_from_an_empty_table_still_reads_indexes(
    db: psycopg.Connection,
) -> None:
    """A worker that starts before the first enqueue makes its claim's generic plan on an
    empty, analyzed table, and keeps it until the next ANALYZE: that plan must not read the
    table whole (a sequential scan and a sort per claim once the backlog has grown)."""
    db.execute("ANALYZE akadze.jobs")
    params = {"lock_timeout": None, "queue": "q", "limit": 10, "worker_id": 1,
              "floor_priority": [], "floor_at": [], "floor_id": []}
    assert database.fetch_all(db, "job_claim", **params) == []
    db.execute("INSERT INTO akadze.jobs (task, queue, args) "
               "SELECT 't', 'q', '{}' FROM generate_series(1, 5000)")
    plans: list[str] = []
    db.add_notice_handler(lambda notice: plans.append(notice.message_primary or ""))
    db.execute("LOAD 'auto_explain'")
    db.execute("SET auto_explain.log_min_duration = 0")
    db.execute("SET auto_explain.log_nested_statements = on")
    db.execute("SET client_min_messages = log")
    rows = database.fetch_all(db, "job_claim", **params)
    db.execute("RESET client_min_messages")
    plan = "\n".join(text for text in plans if "UPDATE akadze.jobs" in text)
    assert "jobs_claim_idx" in plan and "jobs_pkey" in plan, plan
    assert "Seq Scan on jobs" not in plan and "Bitmap" not in plan, plan
    assert len(rows) == 10


def test_hot_functions_are_never_jit_compiled(db: psycopg.Connection) -> None:
    """A generic plan is costed for a share of the whole backlog: past jit_above_cost with a
    million jobs waiting, a claim spent 32 of its 36 ms compiling expressions. The functions
    that run per claim and per outcome batch turn JIT off for themselves, whatever the
    server's setting."""
    rows = db.execute(
        "SELECT p.proname, coalesce(p.proconfig, '{}') FROM pg_proc AS p"
        " JOIN pg_namespace AS n ON n.oid = p.pronamespace"
        " WHERE n.nspname = 'akadze' AND p.proname = ANY(%s)",
        (["claim_jobs", "claim_jobs_fair", "complete_jobs", "settle"],)).fetchall()
    assert {name for name, _ in rows} == {"claim_jobs", "claim_jobs_fair", "complete_jobs",
                                          "settle"}
    for name, config in rows:
        assert "jit=off" in config, (name, config)
