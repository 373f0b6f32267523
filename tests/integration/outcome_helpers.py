"""Helpers for the outcome, cancel and complete_tx tests: a fast in-process worker, and
predicates that read the job row (only the database decides what happened)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

import psycopg

from akadze_core import App, Worker
from tests.helpers import job, run_worker_until

#: Short intervals so a test sees its outcome in a fraction of a second.
FAST: dict[str, Any] = {
    "poll_interval": 0.05, "heartbeat_interval": 0.2, "heartbeat_ttl": 2, "shutdown_timeout": 1,
}


def fast_worker(app: App, **options: Any) -> Worker:
    """A worker with the FAST intervals (``options`` override them)."""
    return Worker(app, **{**FAST, **options})


async def run_until(app: App, done: Callable[[], bool], timeout: float = 30.0,
                    **options: Any) -> None:
    """Run a fast worker until ``done()``; it must stop cleanly. ``timeout`` only bounds a
    hung test: ``done()`` is polled, so a quiet machine passes in a fraction of it, and a
    loaded one (the suite beside other work) is not failed for being slow. A test that
    asserts a duration measures it itself."""
    assert await run_worker_until(fast_worker(app, **options), done, timeout) == 0


def ran(db: psycopg.Connection, job_id: int, runs: int = 1) -> Callable[[], bool]:
    """True once the job was claimed ``runs`` times and its last run's outcome is written."""

    def check() -> bool:
        row = job(db, job_id)
        return row["run_count"] >= runs and row["state"] != "running"

    return check


def hurried(db: psycopg.Connection, job_id: int, *final: str) -> Callable[[], bool]:
    """True once the job is in one of the ``final`` states; meanwhile a retry scheduled in the
    future is made due at once, so a test does not wait out the backoff."""

    def check() -> bool:
        row = job(db, job_id)
        if row["state"] in final:
            return True
        if row["state"] == "queued" and row["run_count"] > 0:
            db.execute("UPDATE akadze.jobs SET scheduled_at = now() "
                       "WHERE id = %s AND state = 'queued'", (job_id,))
        return False

    return check


def retry_delay(db: psycopg.Connection, job_id: int) -> float:
    """Seconds from the last error entry's time to scheduled_at.

    Both come from now() of the same outcome statement, so this is exactly the delay the
    database applied, on the database clock.
    """
    row = db.execute(
        "SELECT extract(epoch FROM scheduled_at - (errors -> -1 ->> 'at')::timestamptz)::float8 "
        "FROM akadze.jobs WHERE id = %s", (job_id,)).fetchone()
    assert row is not None and row[0] is not None, "the job has no error entry"
    return float(row[0])


def seconds_until_due(db: psycopg.Connection, job_id: int) -> float:
    """scheduled_at - now(), on the database clock."""
    row = db.execute("SELECT extract(epoch FROM scheduled_at - now())::float8 "
                     "FROM akadze.jobs WHERE id = %s", (job_id,)).fetchone()
    assert row is not None
    return float(row[0])


async def wait_until(predicate: Callable[[], bool], timeout: float = 5.0,
                     what: str = "condition") -> None:
    """Poll ``predicate`` every 20 ms without blocking the event loop in between."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.02)


async def wait_event(event: asyncio.Event, timeout: float = 5.0, what: str = "event") -> None:
    """Wait for ``event`` with a clear failure instead of a hang."""
    try:
        await asyncio.wait_for(event.wait(), timeout)
    except asyncio.TimeoutError:
        raise AssertionError(f"timed out waiting for {what}") from None


@asynccontextmanager
async def running(worker: Worker) -> AsyncIterator[Worker]:
    """Run ``worker`` in the background for the block; stop it (and check it stopped cleanly)
    on the way out."""
    runner = asyncio.create_task(worker.run())
    try:
        yield worker
    finally:
        if not runner.done():
            worker.request_stop()
    assert await asyncio.wait_for(runner, 15) == 0
