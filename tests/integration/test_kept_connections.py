"""The claims and the outcome writes each keep their connection between calls.

The worker's pool hands out the connection idle the longest, so two steps taking turns with a
third connection idle moved both across every backend; each keeps its own now, and gives it
back to the pool at each heartbeat and before the pool closes.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import psycopg
import psycopg_pool
import pytest

from akadze_core import App, Worker
from akadze_core.store import database
from akadze_core.worker.lease import Lease
from akadze_core.worker.signals import Signals
from tests.helpers import run_worker_until


async def test_a_drain_claims_on_one_backend_and_writes_on_one(
        app: App, monkeypatch: pytest.MonkeyPatch) -> None:
    claims: list[int] = []
    writes: list[int] = []
    claim_jobs, complete_many = database.claim_jobs, database.complete_many

    async def claim(connection: psycopg.AsyncConnection, *args: Any,
                    **kwargs: Any) -> list[dict[str, Any]]:
        claims.append(connection.info.backend_pid)
        return await claim_jobs(connection, *args, **kwargs)

    async def write(connection: psycopg.AsyncConnection, *args: Any) -> list[dict[str, Any]]:
        writes.append(connection.info.backend_pid)
        return await complete_many(connection, *args)

    monkeypatch.setattr(database, "claim_jobs", claim)
    monkeypatch.setattr(database, "complete_many", write)
    ran: list[int] = []

    @app.task("kept.noop")
    async def noop(n: int) -> None:
        ran.append(n)
        await asyncio.sleep(0)

    jobs = 400
    await app.tasks["kept.noop"].enqueue_many_async([{"n": n} for n in range(jobs)])
    # No heartbeat during the drain: each step's connection is kept from its first call on.
    worker = Worker(app, schedules=False, slots=8, heartbeat_interval=30, heartbeat_ttl=60)
    assert await run_worker_until(worker, lambda: len(ran) >= jobs, timeout=60) == 0
    assert len(ran) == jobs
    assert len(claims) >= jobs // 8 and len(writes) >= 2
    assert len(set(claims)) == 1, f"claims on backends {sorted(set(claims))}"
    assert len(set(writes)) == 1, f"writes on backends {sorted(set(writes))}"
    assert set(claims) != set(writes)


@pytest.fixture
async def pool(database_url: str) -> AsyncIterator[psycopg_pool.AsyncConnectionPool]:
    """A worker-like pool of three open connections."""
    opened = psycopg_pool.AsyncConnectionPool(
        database_url, min_size=3, max_size=5, kwargs={"autocommit": True}, open=False)
    await opened.open(wait=True)
    yield opened
    await opened.close()


def _lease(app: App, pool: psycopg_pool.AsyncConnectionPool, lost: list[int]) -> Lease:
    lease = Lease(app, Signals(), name="kept", heartbeat_interval=5, heartbeat_ttl=10,
                  lock_timeout=5, health_file=None, control_pending=lambda: None)
    lease.open(pool, beaten=lambda: None, lost=lambda: lost.append(1))
    return lease


async def _pid(lease: Lease, keep: str | None) -> int:
    async with lease.connection(keep=keep) as connection:
        return connection.info.backend_pid


async def test_a_kept_connection_serves_its_step_again_until_released(
        app: App, pool: psycopg_pool.AsyncConnectionPool) -> None:
    lease = _lease(app, pool, [])
    kept = {await _pid(lease, "claim") for _ in range(4)}
    assert len(kept) == 1
    assert pool.get_stats()["pool_available"] == 2  # one of three held between calls
    # Another step's calls go through the pool as before.
    assert kept.isdisjoint({await _pid(lease, None) for _ in range(4)})
    await lease.release_kept()
    assert pool.get_stats()["pool_available"] == 3


async def test_a_step_that_failed_gives_its_connection_back(
        app: App, pool: psycopg_pool.AsyncConnectionPool) -> None:
    lease = _lease(app, pool, [])
    await _pid(lease, "claim")
    with pytest.raises(psycopg.errors.DivisionByZero):
        async with lease.connection(keep="claim") as connection:
            await connection.execute("SELECT 1 / 0")
    assert pool.get_stats()["pool_available"] == 3


async def test_a_kept_connection_found_dead_is_replaced_and_said(
        app: App, pool: psycopg_pool.AsyncConnectionPool, db: psycopg.Connection) -> None:
    lost: list[int] = []
    lease = _lease(app, pool, lost)
    pid = await _pid(lease, "write")
    db.execute("SELECT pg_terminate_backend(%s)", (pid,))
    await asyncio.sleep(0.2)  # the FATAL reaches the idle socket
    assert await _pid(lease, "write") != pid
    assert lost == [1]


async def test_a_small_pool_keeps_nothing(app: App, database_url: str) -> None:
    small = psycopg_pool.AsyncConnectionPool(
        database_url, min_size=2, max_size=2, kwargs={"autocommit": True}, open=False)
    await small.open(wait=True)
    try:
        lease = _lease(app, small, [])
        await _pid(lease, "claim")
        # Both connections stay free for the heartbeat and the other steps.
        assert small.get_stats()["pool_available"] == 2
    finally:
        await small.close()
