"""Citus mode on a real cluster: the core path a job takes, under the seed rules."""

from __future__ import annotations

import asyncio
import logging
import time
from datetime import datetime, timezone

import psycopg
import pytest

from akadze_core import App, Worker
from tests.helpers import job, run_worker_until


def shard_of(job_id: int) -> int:
    return job_id % 1024


def placement(db: psycopg.Connection, job_id: int) -> str:
    """The worker node holding the job's shard (host:port)."""
    row = db.execute(
        "SELECT nodename || ':' || nodeport FROM citus_shards"
        " WHERE table_name = 'akadze.jobs'::regclass"
        "   AND shardid = get_shard_id_for_distribution_column('akadze.jobs', %s)",
        (shard_of(job_id),)).fetchone()
    assert row is not None
    return str(row[0])


async def test_enqueue_run_succeed(citus_app: App, citus_db: psycopg.Connection) -> None:
    app = citus_app

    @app.task("greet")
    async def greet(name: str) -> str:
        return f"hello {name}"

    first = greet.enqueue(name="ada")
    second = await greet.enqueue_async(name="bob")
    many = greet.enqueue_many([{"name": str(n)} for n in range(50)])
    assert len(many) == 50
    row = citus_db.execute("SELECT shard FROM akadze.jobs WHERE id = %s", (first,)).fetchone()
    assert row == (shard_of(first),)
    ids = [first, second, *many]
    worker = Worker(app, slots=4, poll_interval=0.1)
    code = await run_worker_until(worker, lambda: all(
        job(citus_db, i)["state"] == "succeeded" for i in ids))
    assert code == 0
    assert job(citus_db, first)["result"] == "hello ada"
    assert job(citus_db, many[7])["result"] == "hello 7"
    assert job(citus_db, first)["attempt"] == 1
    found = await app.get_job_async(first)
    assert found is not None and (found.state, found.result) == ("succeeded", "hello ada")
    assert set(app.get_jobs([second, many[0]])) == {second, many[0]}


async def test_a_waiter_hears_the_outcome_on_the_coordinator(citus_app: App) -> None:
    @citus_app.task("answer")
    async def answer() -> int:
        return 42

    job_id = answer.enqueue()
    worker = Worker(citus_app, poll_interval=0.1)
    runner = asyncio.create_task(worker.run())
    try:
        done = await citus_app.wait_for_job_async(job_id, timeout=30)
    finally:
        worker.request_stop()
        await asyncio.wait_for(runner, 30)
    assert (done.state, done.result) == ("succeeded", 42)


async def test_every_maintenance_service_runs_in_citus_mode(
        citus_app: App, citus_db: psycopg.Connection, caplog: pytest.LogCaptureFixture) -> None:
    """Prune, rescue, orphans and schedules each run several rounds without a refusal (a
    refused statement in a service stops the worker)."""

    @citus_app.task("tick")
    async def tick() -> None: ...

    old = tick.enqueue()
    citus_db.execute("UPDATE akadze.jobs SET state = 'succeeded', finished_at = %s"
                     " WHERE shard = %s AND id = %s",
                     (datetime(2000, 1, 1, tzinfo=timezone.utc), shard_of(old), old))
    worker = Worker(citus_app, poll_interval=0.1, prune_interval=0.2, heartbeat_interval=0.2)
    started = time.monotonic()
    code = await run_worker_until(worker, lambda: time.monotonic() - started > 3)
    assert code == 0
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR], caplog.text
    assert citus_db.execute("SELECT count(*) FROM akadze.jobs WHERE id = %s",
                            (old,)).fetchone() == (0,)  # pruned


def test_migrate_citus_on_a_migrated_coordinator_sets_the_lanes(
        citus_url: str, citus_db: psycopg.Connection) -> None:
    from click.testing import CliRunner

    from akadze_core.cli.main import cli

    try:
        result = CliRunner().invoke(cli, ["--database-url", citus_url, "migrate", "--citus",
                                          "--lanes", "3"])
        assert result.exit_code == 0, result.output
        assert "nothing to do" in result.output
        lanes = citus_db.execute("SELECT lanes FROM akadze.citus_settings").fetchone()
        assert lanes == (3,)
        refused = CliRunner().invoke(cli, ["--database-url", citus_url, "migrate",
                                           "--lanes", "3"])
        assert refused.exit_code == 2 and "give --citus too" in refused.output
    finally:
        citus_db.execute("UPDATE akadze.citus_settings SET lanes = 1")
