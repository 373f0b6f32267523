"""A claim reads the claim index up to now() in every priority: the jobs scheduled for later
(countdowns, retries with backoff) cost it nothing, however many wait. Measured by the pages
the claim's index scans read (auto_explain's buffers), never by time: the figure does not
move with the machine's load."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest

from akadze_core.store import database

FUTURE = 30000
CLAIM = {"lock_timeout": None, "queue": "q", "limit": 10, "worker_id": 1}
NO_FLOORS = {"floor_priority": [], "floor_at": [], "floor_id": []}


def node_reads(node: dict[str, Any], index: str) -> int:
    """Pages the scans of `index` under this plan node read, over all their loops (the index
    checks `scheduled_at <= now()` inside a page, so the entries it passes over are counted
    nowhere else)."""
    reads = 0
    if node.get("Index Name") == index:
        reads += node.get("Shared Hit Blocks", 0) + node.get("Shared Read Blocks", 0)
    for child in node.get("Plans", []):
        reads += node_reads(child, index)
    return reads


@pytest.fixture
def explained(db: psycopg.Connection) -> Iterator[list[dict[str, Any]]]:
    """The plans, run with ANALYZE, of the statements inside the functions `db` calls."""
    plans: list[dict[str, Any]] = []

    def keep(notice: psycopg.errors.Diagnostic) -> None:
        text = notice.message_primary or ""
        start = text.find("{")
        if start >= 0:
            plans.append(json.loads(text[start:]))

    db.add_notice_handler(keep)
    db.execute("LOAD 'auto_explain'")
    for setting in ("log_min_duration = 0", "log_nested_statements = on", "log_analyze = on",
                    "log_buffers = on", "log_timing = off", "log_format = json"):
        db.execute(f"SET auto_explain.{setting}")
    db.execute("SET client_min_messages = log")
    yield plans
    db.execute("RESET client_min_messages")


def locked(node: dict[str, Any]) -> int:
    """Rows the locking steps under this plan node locked."""
    rows = node.get("Actual Rows", 0) * node.get("Actual Loops", 1)
    return ((rows if node.get("Node Type") == "LockRows" else 0)
            + sum(locked(child) for child in node.get("Plans", [])))


def pages(db: psycopg.Connection, index: str) -> int:
    """The size of `index` in pages: what a claim that passes every later job reads."""
    row = db.execute("SELECT pg_relation_size(%s::regclass) / 8192", (index,)).fetchone()
    assert row is not None
    return int(row[0])


def claim_reads(plans: list[dict[str, Any]], index: str) -> int:
    """Entries of `index` read by the claim's own statement (the UPDATE of the claimed)."""
    claims = [p for p in plans if "UPDATE akadze.jobs" in p.get("Query Text", "")]
    assert claims, plans
    return sum(node_reads(p["Plan"], index) for p in claims)


def enqueue_later(db: psycopg.Connection, priorities: list[int]) -> None:
    """FUTURE jobs of queue q due tomorrow, spread over three tasks and `priorities`, and one
    due job in another queue (so the claim has nothing to take)."""
    db.execute(
        "INSERT INTO akadze.jobs (task, queue, args, priority, scheduled_at) "
        "SELECT 't' || (n %% 3), 'q', '{}', (%s::integer[])[1 + n / 3 %% cardinality(%s)], "
        "now() + interval '1 day' FROM generate_series(1, %s) AS n",
        (priorities, priorities, FUTURE))
    db.execute("INSERT INTO akadze.jobs (task, queue, args) VALUES ('t', 'other', '{}')")
    db.execute("ANALYZE akadze.jobs")


def test_an_idle_claim_without_floors_skips_the_later_jobs(
    db: psycopg.Connection, explained: list[dict[str, Any]],
) -> None:
    enqueue_later(db, [0, 5, 9])
    assert pages(db, "akadze.jobs_claim_idx") > 150
    for _ in range(7):  # past the custom plans, onto the kept generic plan
        explained.clear()
        assert database.fetch_all(db, "job_claim", **CLAIM, **NO_FLOORS) == []
        # Four probes (a priority each, one past the last) and three reads, a descent of
        # the index apiece.
        assert claim_reads(explained, "jobs_claim_idx") <= 30


def test_an_idle_claim_with_floors_skips_the_later_jobs_between_them(
    db: psycopg.Connection, explained: list[dict[str, Any]],
) -> None:
    """Priorities 0, 5, 9 hold later jobs; floors at 3 and 7 leave three gaps to read."""
    enqueue_later(db, [0, 5, 9])
    at = db.execute("SELECT now() - interval '1 hour'").fetchone()[0]  # type: ignore[index]
    floors = {"floor_priority": [3, 7], "floor_at": [at, at], "floor_id": [1, 1]}
    for _ in range(7):
        explained.clear()
        assert database.fetch_all(db, "job_claim", **CLAIM, **floors) == []
        # Two probes per gap, three reads, two floors' reads.
        assert claim_reads(explained, "jobs_claim_idx") <= 40


def test_a_claim_behind_later_jobs_still_takes_the_due_ones_in_order(
    db: psycopg.Connection,
) -> None:
    enqueue_later(db, [0, 5])
    db.execute(
        "INSERT INTO akadze.jobs (task, queue, args, priority, scheduled_at) "
        "SELECT 'due', 'q', '{}', p, now() - n * interval '1 second' "
        "FROM unnest(ARRAY[9, 5, 0, 7]) AS p, generate_series(1, 3) AS n")
    rows = database.fetch_all(db, "job_claim", **CLAIM, **NO_FLOORS)
    assert [(r["priority"], r["task"]) for r in rows] == (
        [(0, "due")] * 3 + [(5, "due")] * 3 + [(7, "due")] * 3 + [(9, "due")])
    keys = [(r["priority"], r["scheduled_at"], r["id"]) for r in rows]
    assert keys == sorted(keys)


def test_the_priorities_without_a_floor_lock_no_more_than_the_limit_together(
    db: psycopg.Connection, explained: list[dict[str, Any]],
) -> None:
    """Ten priorities due, a floor at one: the floor's read locks up to the limit, and the
    other nine, read one by one, stop together at the limit, in the claim's order."""
    db.execute(
        "INSERT INTO akadze.jobs (task, queue, args, priority, scheduled_at) "
        "SELECT 't', 'q', '{}', n % 10, now() - interval '1 hour' - n * interval '1 ms' "
        "FROM generate_series(1, 2000) AS n")
    db.execute("ANALYZE akadze.jobs")
    at = db.execute("SELECT now() - interval '1 day'").fetchone()[0]  # type: ignore[index]
    floors = {"floor_priority": [3], "floor_at": [at], "floor_id": [1]}
    for _ in range(7):
        explained.clear()
        rows = database.fetch_all(db, "job_claim", **CLAIM, **floors)
        assert [r["priority"] for r in rows] == [0] * 10
        claims = [p for p in explained if "UPDATE akadze.jobs" in p.get("Query Text", "")]
        assert sum(locked(p["Plan"]) for p in claims) <= 20


def test_an_idle_fair_claim_skips_the_later_jobs(
    db: psycopg.Connection, explained: list[dict[str, Any]],
) -> None:
    db.execute("CREATE INDEX jobs_fair_claim_idx ON akadze.jobs "
               "(queue, task, priority, scheduled_at, id) WHERE state = 'queued'")
    enqueue_later(db, [0, 5, 9])
    assert pages(db, "akadze.jobs_fair_claim_idx") > 150
    for _ in range(7):
        explained.clear()
        assert database.fetch_all(
            db, "job_claim_fair", **CLAIM, after_task=None) == []
        # Three tasks, three priorities each: ten probes and nine reads.
        fair = [p for p in explained if "FROM akadze.jobs" in p.get("Query Text", "")
                and "UPDATE akadze.jobs" in p.get("Query Text", "")]
        assert fair, explained
        assert sum(node_reads(p["Plan"], "jobs_fair_claim_idx") for p in fair) <= 80
