"""The batching completer on real Postgres: outcomes finishing together share one flush."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

import psycopg

from akadze_core import App
from akadze_core.completer import Completer
from akadze_core.outcomes import succeeded
from tests.helpers import job
from tests.integration.lease_support import claim, fake_worker


async def _flushes(app: App, database_url: str, db: psycopg.Connection, *,
                   gather: float) -> list[int]:
    """Claim three jobs, hand their outcomes to a completer 30 ms apart; returns the size
    of each flush, once every outcome is written."""

    @app.task("batch.noop")
    async def noop() -> None: ...

    ids = [noop.enqueue() for _ in range(3)]
    rows = await claim(database_url, fake_worker(db), 3)
    assert sorted(row["id"] for row in rows) == sorted(ids)

    @contextlib.asynccontextmanager
    async def connection() -> AsyncIterator[psycopg.AsyncConnection]:
        async with await psycopg.AsyncConnection.connect(database_url,
                                                         autocommit=True) as opened:
            yield opened

    flushes: list[int] = []
    completer = Completer(connection, lambda batch, rows: flushes.append(len(batch)),
                          gather=gather)
    runner = asyncio.create_task(completer.run())
    await asyncio.sleep(0.05)  # idle before the first outcome, as in a worker
    for row in rows:
        completer.submit(succeeded(row["id"], row["run_count"], row["attempt"], None, None,
                                   claim_token=row["claim_token"]))
        await asyncio.sleep(0.03)
    assert await completer.close(timeout=10)
    await runner
    assert [job(db, job_id)["state"] for job_id in ids] == ["succeeded"] * 3
    return flushes


async def test_outcomes_arriving_within_the_gather_window_share_one_flush(
        app: App, database_url: str, db: psycopg.Connection) -> None:
    assert await _flushes(app, database_url, db, gather=0.5) == [3]


async def test_without_a_gather_window_the_first_outcome_is_written_alone(
        app: App, database_url: str, db: psycopg.Connection) -> None:
    """The window is what batches them: with none, the first outcome's flush starts at once
    and holds it alone (the others arrive while it runs)."""
    flushes = await _flushes(app, database_url, db, gather=0.0)
    assert flushes[0] == 1 and sum(flushes) == 3
