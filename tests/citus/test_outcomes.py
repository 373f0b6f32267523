"""Citus mode keeps complete_tx (the job's success, the caller's writes and its next job in
one transaction over several nodes) and fair claims (a flooding task does not starve the
others, in every shard)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import psycopg
import pytest

from akadze_core import App, Worker, current
from akadze_core.store import database
from tests.helpers import job, run_worker_until
from tests.integration.lease_support import fake_worker


@pytest.fixture
def reports(citus_db: psycopg.Connection) -> Iterator[psycopg.Connection]:
    """A user table on the coordinator that the tasks write to."""
    citus_db.execute("CREATE TABLE reports (id int PRIMARY KEY)")
    try:
        yield citus_db
    finally:
        citus_db.execute("DROP TABLE reports")


def register_build(app: App, *, fail: bool = False) -> Any:
    @app.task("report.notify")
    async def notify(report_id: int) -> None: ...

    @app.task("report.build", max_attempts=1)
    async def build(report_id: int) -> None:
        async with current().complete_tx() as connection:
            await connection.execute("INSERT INTO reports (id) VALUES (%s)", (report_id,))
            # Another tenant: the next job is written on another shard, in the same
            # transaction.
            await notify.configure(meta={"tenant": f"notify-{report_id}"}).using(
                session=connection).enqueue(report_id=report_id)
            if fail:
                raise ValueError("the report is broken")

    return build


def states(db: psycopg.Connection, task: str) -> list[str]:
    return [row[0] for row in db.execute(
        "SELECT state FROM akadze.jobs WHERE task = %s ORDER BY id", (task,)).fetchall()]


async def test_complete_tx_commits_the_writes_the_next_job_and_the_success_together(
        citus_app: App, reports: psycopg.Connection) -> None:
    build = register_build(citus_app)
    ids = [build.configure(meta={"tenant": f"t{n}"}).enqueue(report_id=n) for n in range(4)]
    await run_worker_until(Worker(citus_app, poll_interval=0.1), lambda: all(
        job(reports, job_id)["state"] == "succeeded" for job_id in ids))
    assert [row[0] for row in reports.execute("SELECT id FROM reports ORDER BY id")] == \
        [0, 1, 2, 3]
    # The next jobs (run by the same worker since: one queue) were committed with them.
    assert len(states(reports, "report.notify")) == 4


async def test_an_error_in_complete_tx_rolls_everything_back(
        citus_app: App, reports: psycopg.Connection) -> None:
    build = register_build(citus_app, fail=True)
    job_id = build.enqueue(report_id=7)
    await run_worker_until(Worker(citus_app, poll_interval=0.1),
                           lambda: job(reports, job_id)["state"] == "failed")
    assert reports.execute("SELECT count(*) FROM reports").fetchone() == (0,)
    assert states(reports, "report.notify") == []
    assert [error["type"] for error in job(reports, job_id)["errors"]] == ["ValueError"]


async def test_a_fair_worker_rotates_across_task_names(
        citus_app: App, citus_db: psycopg.Connection) -> None:
    started: list[str] = []

    @citus_app.task("flood")
    async def flood(n: int) -> None:
        started.append("A")

    @citus_app.task("trickle")
    async def trickle(n: int) -> None:
        started.append("B")

    flood.enqueue_many([{"n": n} for n in range(20)])
    trickle.enqueue_many([{"n": n} for n in range(2)])
    await run_worker_until(Worker(citus_app, slots=1, fair=True, poll_interval=0.1),
                           lambda: len(started) == 22)
    # Both of B's jobs start long before A's flood is through.
    assert started.index("B") <= 2
    assert len(started) - started[::-1].index("B") - 1 <= 4
    # The fair index was built on the distributed table, led by the shard.
    row = citus_db.execute("SELECT indexdef FROM pg_indexes"
                           " WHERE indexname = 'jobs_fair_claim_idx'").fetchone()
    assert row is not None and "(shard, queue, task" in row[0]


async def test_a_fair_claim_reads_every_shard_and_rotates_within_each(
        citus_app: App, citus_db: psycopg.Connection, citus_url: str) -> None:
    @citus_app.task("a")
    async def a() -> None: ...

    @citus_app.task("b")
    async def b() -> None: ...

    tenants = [f"t{n}" for n in range(4)]
    for tenant in tenants:
        a.configure(meta={"tenant": tenant}).enqueue_many([{}] * 5)
        b.configure(meta={"tenant": tenant}).enqueue()
    worker_id = fake_worker(citus_db, ttl=60)
    async with await psycopg.AsyncConnection.connect(citus_url, autocommit=True) as connection:
        rows = await database.claim_jobs(connection, "default", 100, worker_id, True)
        assert len(rows) == 24  # every shard read
        again = await database.claim_jobs(connection, "default", 100, worker_id, True)
        assert again == []
    # Within each shard's batch, a b comes in the first turn, before a's second job.
    by_shard: dict[int, list[str]] = {}
    for row in rows:
        by_shard.setdefault(row["id"] % 1024, []).append(row["task"])
    assert len(by_shard) > 1
    for shard_tasks in by_shard.values():
        assert "b" in shard_tasks[:2]
    citus_db.execute("DELETE FROM akadze.workers")
