"""Worker maintenance on real Postgres: pruning by retention, unknown task names, and rows
whose args were tampered with (failed with ArgsDecodeError, nothing unpickled)."""

from __future__ import annotations

import asyncio
import base64
import logging
import os
import pickle
from datetime import timedelta
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg.types.json import Jsonb

from akadze_core import App, Worker
from akadze_core.store import database
from tests.helpers import job, run_worker_until
from tests.integration.lease_support import FAST, fake_worker, running, scalar, wait_until


def age(db: psycopg.Connection, job_id: int, state: str, finished_ago: timedelta | None) -> None:
    """Put a job in ``state``, finished ``finished_ago`` before the database's now()."""
    db.execute("UPDATE akadze.jobs SET state = %s, finished_at = now() - %s WHERE id = %s",
               (state, finished_ago, job_id))


def exists(db: psycopg.Connection, job_id: int) -> bool:
    return bool(scalar(db, "SELECT count(*) FROM akadze.jobs WHERE id = %s", (job_id,)))


async def test_prune_deletes_finished_jobs_older_than_their_retention(
    db: psycopg.Connection, database_url: str
) -> None:
    app = App(database_url, succeeded_retention=timedelta(hours=1),
              failed_retention=timedelta(days=2))

    @app.task("old")
    async def old() -> None:
        return None

    hour, day = timedelta(hours=1), timedelta(days=1)
    cases = {
        # state, finished this long ago -> expected to survive?
        "succeeded, 2 h": ("succeeded", 2 * hour, False),
        "succeeded, 30 min": ("succeeded", hour / 2, True),
        "cancelled, 2 h": ("cancelled", 2 * hour, False),
        "cancelled, 30 min": ("cancelled", hour / 2, True),
        "failed, 3 d": ("failed", 3 * day, False),
        "failed, 1 d": ("failed", day, True),
        "failed, 2 h": ("failed", 2 * hour, True),
        # Active jobs stay whatever their timestamps say.
        "queued, far future": ("queued", 30 * day, True),
        "running": ("running", 30 * day, True),
    }
    ids = {label: old.configure(delay=timedelta(days=1)).enqueue() for label in cases}
    live = fake_worker(db, ttl=3600)
    for label, (state, ago, _) in cases.items():
        age(db, ids[label], state, ago)
    db.execute("UPDATE akadze.jobs SET worker_id = %s, created_at = now() - interval '60 days'"
               " WHERE state = 'running'", (live,))
    doomed = [ids[label] for label, (_, _, keep) in cases.items() if not keep]
    kept = [ids[label] for label, (_, _, keep) in cases.items() if keep]

    try:
        async with running(Worker(app, prune_interval=0.1, **FAST)):
            await wait_until(lambda: not any(exists(db, i) for i in doomed), timeout=3)
            await asyncio.sleep(0.3)  # a few more prune rounds: the rest stays
        assert all(exists(db, i) for i in kept), {
            label: exists(db, ids[label]) for label in cases}
        assert job(db, ids["running"])["state"] == "running"
    finally:
        await app.close_async()


async def test_prune_works_through_a_backlog_in_batches(
    db: psycopg.Connection, database_url: str
) -> None:
    app = App(database_url, succeeded_retention=60)

    @app.task("bulk")
    async def bulk() -> None:
        return None

    bulk.configure(delay=3600).enqueue_many([{}] * 250)
    db.execute("UPDATE akadze.jobs SET state = 'succeeded',"
               " finished_at = now() - interval '2 minutes'")
    fresh = bulk.configure(delay=3600).enqueue()
    age(db, fresh, "succeeded", timedelta(seconds=10))
    try:
        async with running(Worker(app, prune_interval=0.1, prune_batch=40, **FAST)):
            await wait_until(lambda: scalar(db, "SELECT count(*) FROM akadze.jobs") == 1,
                             timeout=3)
        assert exists(db, fresh)
    finally:
        await app.close_async()


async def test_unknown_task_fails_the_job_and_the_worker_goes_on(
    app: App, db: psycopg.Connection, database_url: str
) -> None:
    ran: list[int] = []

    @app.task("known")
    async def known(n: int) -> int:
        ran.append(n)
        return n

    # Another deployment (or a typo) enqueued a task this worker does not have.
    elsewhere = App(database_url)

    @elsewhere.task("only.elsewhere")
    async def only_elsewhere() -> None:
        return None

    try:
        unknown = only_elsewhere.enqueue()
        first = known.enqueue(n=1)
        async with running(Worker(app, **FAST)):
            await wait_until(lambda: job(db, first)["state"] == "succeeded")
            await wait_until(lambda: job(db, unknown)["state"] == "failed")
            later = known.enqueue(n=2)
            await wait_until(lambda: job(db, later)["state"] == "succeeded")
        assert ran == [1, 2]
        row = job(db, unknown)
        assert (row["state"], row["attempt"], row["max_attempts"]) == ("failed", 1, 3)
        [error] = row["errors"]
        assert error["type"] == "NotRegistered"
        assert "only.elsewhere" in error["message"] and "not registered" in error["message"]
        assert row["finished_at"] is not None
    finally:
        await elsewhere.close_async()


class _Explode:
    """Unpickling this creates a directory: proof that something was unpickled."""

    def __init__(self, path: str) -> None:
        self.path = path

    def __reduce__(self) -> tuple[Any, ...]:
        return (os.mkdir, (self.path,))


@pytest.mark.parametrize("tamper", ["pickle string", "array", "number", "pickle hex"])
async def test_tampered_args_fail_with_args_decode_error_and_nothing_is_unpickled(
    app: App, db: psycopg.Connection, tmp_path: Path, tamper: str
) -> None:
    ran: list[Any] = []

    @app.task("victim")
    async def victim(**kwargs: Any) -> None:
        ran.append(kwargs)

    marker = tmp_path / "unpickled"
    blob = pickle.dumps(_Explode(str(marker)))
    value = {
        "pickle string": base64.b64encode(blob).decode(),
        "array": [1, "two", {"three": 3}],
        "number": 42,
        "pickle hex": blob.hex(),
    }[tamper]
    job_id = victim.enqueue(fine=True)
    db.execute("UPDATE akadze.jobs SET args = %s WHERE id = %s", (Jsonb(value), job_id))
    after = victim.enqueue(fine=True)

    async with running(Worker(app, **FAST)):
        await wait_until(lambda: job(db, job_id)["state"] == "failed"
                         and job(db, after)["state"] == "succeeded")
    row = job(db, job_id)
    [error] = row["errors"]
    assert error["type"] == "ArgsDecodeError"
    assert row["attempt"] == 1  # failed at once: retrying cannot fix the row
    assert row["args"] == value  # left as found, for a human to look at
    assert ran == [{"fine": True}]
    assert not marker.exists()


# --- autovacuum: a worker says when the jobs table will not be vacuumed -----------------------

async def test_the_worker_warns_when_autovacuum_will_not_run_on_the_jobs_table(
        app: App, db: psycopg.Connection, caplog: pytest.LogCaptureFixture) -> None:
    server_on = scalar(db, "SELECT current_setting('autovacuum')::boolean "
                           "AND current_setting('track_counts')::boolean")
    async with await psycopg.AsyncConnection.connect(app.database_url,
                                                     autocommit=True) as connection:
        assert await database.autovacuum_runs_async(connection) is server_on
        db.execute("ALTER TABLE akadze.jobs SET (autovacuum_enabled = off)")
        assert await database.autovacuum_runs_async(connection) is False
    caplog.set_level(logging.WARNING, logger="akadze.worker")
    worker = Worker(app, slots=1, poll_interval=0.05)
    await run_worker_until(worker, lambda: worker.worker_id is not None)
    assert [r.getMessage() for r in caplog.records
            if r.getMessage().startswith("autovacuum does not run on akadze.jobs")]
    db.execute("ALTER TABLE akadze.jobs RESET (autovacuum_enabled)")
    async with await psycopg.AsyncConnection.connect(app.database_url,
                                                     autocommit=True) as connection:
        assert await database.autovacuum_runs_async(connection) is server_on
