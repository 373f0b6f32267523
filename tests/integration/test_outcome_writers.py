"""Outcome writers: a framework's own record of outcomes, written in their transaction."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

import psycopg
import pytest

from akadze_core import App
from akadze_core.model.outcomes import succeeded
from akadze_core.worker.completer import Completer, store_outcome_sync
from tests.helpers import job
from tests.integration.lease_support import claim, fake_worker


class LogWriter:
    """Copies each written job's state into ``outcome_log``; ``fail`` makes its statement
    violate a constraint (so the transaction must roll the outcome back too)."""

    def __init__(self, fail: bool = False) -> None:
        self.fail = fail
        self.seen: list[list[int]] = []

    @property
    def select(self) -> str:
        return "SELECT id, state FROM akadze.jobs WHERE id = ANY(%(ids)s) ORDER BY id"

    def statement(self, rows: list[dict[str, Any]]) -> tuple[str, dict[str, Any]] | None:
        self.seen.append([row["id"] for row in rows])
        return ("INSERT INTO outcome_log (job_id, state) "
                "SELECT unnest(%(ids)s::bigint[]), unnest(%(states)s::text[])",
                {"ids": [row["id"] for row in rows],
                 "states": [None if self.fail else row["state"] for row in rows]})


@pytest.fixture
def outcome_log(db: psycopg.Connection) -> psycopg.Connection:
    db.execute("CREATE TABLE outcome_log (job_id bigint, state text NOT NULL)")
    return db


def _logged(db: psycopg.Connection) -> list[tuple[int, str]]:
    return db.execute("SELECT job_id, state FROM outcome_log ORDER BY job_id").fetchall()


async def test_the_completer_runs_writers_in_each_flush(
        app: App, database_url: str, outcome_log: psycopg.Connection) -> None:
    @app.task("writers.noop")
    async def noop() -> None: ...

    ids = [noop.enqueue() for _ in range(3)]
    rows = await claim(database_url, fake_worker(outcome_log), 3)

    @contextlib.asynccontextmanager
    async def connection() -> AsyncIterator[psycopg.AsyncConnection]:
        async with await psycopg.AsyncConnection.connect(database_url,
                                                         autocommit=True) as opened:
            yield opened

    writer = LogWriter()
    completer = Completer(connection, lambda batch, rows: None, gather=0.3,
                          writers=[writer])
    runner = asyncio.create_task(completer.run())
    for row in rows:
        completer.submit(succeeded(row["id"], row["run_count"], row["attempt"], None, None,
                                   claim_token=row["claim_token"]))
    assert await completer.close(timeout=10)
    await runner
    assert _logged(outcome_log) == [(job_id, "succeeded") for job_id in sorted(ids)]
    assert sorted(seen for flush in writer.seen for seen in flush) == sorted(ids)


def test_a_writer_that_fails_rolls_the_outcome_back_with_it(
        app: App, database_url: str, outcome_log: psycopg.Connection) -> None:
    """One transaction: the writer's statement fails, so the outcome is not written either
    (and the error is raised, as a lost connection's would be: the worker writes again)."""

    @app.task("writers.noop")
    async def noop() -> None: ...

    job_id = noop.enqueue()
    [row] = asyncio.run(claim(database_url, fake_worker(outcome_log), 1))
    outcome = succeeded(row["id"], row["run_count"], row["attempt"], None, None,
                        claim_token=row["claim_token"])
    app.outcome_writers.append(LogWriter(fail=True))
    with pytest.raises(psycopg.errors.NotNullViolation):
        store_outcome_sync(app, outcome)
    assert job(outcome_log, job_id)["state"] == "running"
    assert _logged(outcome_log) == []

    app.outcome_writers[:] = [LogWriter()]
    assert store_outcome_sync(app, outcome) is True
    assert job(outcome_log, job_id)["state"] == "succeeded"
    assert _logged(outcome_log) == [(job_id, "succeeded")]


def test_without_writers_the_outcome_is_written_alone(
        app: App, database_url: str, outcome_log: psycopg.Connection) -> None:
    @app.task("writers.noop")
    async def noop() -> None: ...

    job_id = noop.enqueue()
    [row] = asyncio.run(claim(database_url, fake_worker(outcome_log), 1))
    assert app.outcome_writers == []
    assert store_outcome_sync(app, succeeded(row["id"], row["run_count"], row["attempt"],
                                             None, None, claim_token=row["claim_token"]))
    assert job(outcome_log, job_id)["state"] == "succeeded"
    assert _logged(outcome_log) == []
