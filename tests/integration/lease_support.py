"""Helpers shared by the enqueue, claim, fencing/rescue and maintenance tests.

Everything here talks to the real test database: fake worker rows, direct claims through
``akadze_core.store.database``, and polling loops that wait on the database instead of sleeping.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import psycopg

from akadze_core import Worker
from akadze_core.store import database

# Short intervals so every worker test finishes in a second or two.
FAST = {"poll_interval": 0.05, "heartbeat_interval": 0.2, "heartbeat_ttl": 1}


def job_count(db: psycopg.Connection) -> int:
    """How many rows akadze.jobs holds."""
    row = db.execute("SELECT count(*) FROM akadze.jobs").fetchone()
    assert row is not None
    return int(row[0])


def scalar(db: psycopg.Connection, sql: str, params: Any = None) -> Any:
    """The first column of the first row of ``sql``."""
    row = db.execute(sql, params).fetchone()
    assert row is not None
    return row[0]


def fake_worker(
    db: psycopg.Connection, *, heartbeat_age: float = 0.0, ttl: float = 1.0, name: str = "fake"
) -> int:
    """Insert a worker row whose last heartbeat was ``heartbeat_age`` seconds ago."""
    return int(scalar(
        db,
        "INSERT INTO akadze.workers (name, hostname, pid, queues, heartbeat_ttl, heartbeat_at)"
        " VALUES (%s, 'test', 0, '{default}', %s * interval '1 second',"
        "         now() - %s * interval '1 second') RETURNING id",
        (name, ttl, heartbeat_age),
    ))


async def claim(
    url: str, worker_id: int, limit: int, queue: str = "default", fair: bool = False
) -> list[dict[str, Any]]:
    """Claim on a fresh autocommit connection, as a worker would."""
    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as connection:
        return await database.claim_jobs(connection, queue, limit, worker_id, fair)


async def rescue(url: str) -> list[dict[str, Any]]:
    """Run one rescue on a fresh autocommit connection."""
    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as connection:
        return await database.rescue_jobs(connection)


async def wait_until(
    predicate: Callable[[], bool], timeout: float = 5.0, interval: float = 0.02
) -> float:
    """Poll ``predicate`` without blocking the event loop; returns the seconds it took."""
    started = time.monotonic()
    while not predicate():
        if time.monotonic() - started > timeout:
            raise AssertionError(f"timed out after {timeout}s")
        await asyncio.sleep(interval)
    return time.monotonic() - started


@contextlib.asynccontextmanager
async def running(worker: Worker) -> AsyncIterator[asyncio.Task[int]]:
    """Run ``worker`` in the background for the block, then stop it and check it exited 0."""
    runner = asyncio.create_task(worker.run())
    try:
        yield runner
    finally:
        if not runner.done():
            worker.request_stop()
        code = await asyncio.wait_for(runner, 15)
    assert code == 0


def listening(db: psycopg.Connection) -> bool:
    """True once some session of this database has run ``LISTEN akadze_jobs``."""
    return bool(scalar(
        db,
        "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
        " AND query ILIKE 'LISTEN%%akadze_jobs%%'",
    ))
