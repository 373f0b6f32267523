"""Test helpers: run a worker in-process until the database says we are done."""

from __future__ import annotations

import asyncio
import threading
import time
import uuid
from collections.abc import Callable
from typing import Any

import psycopg
from psycopg.rows import dict_row

from akadze_core import Worker
from akadze_core.model.task_ids import TaskIds
from akadze_core.store import lookup
from bench.procs import children


def job(db: psycopg.Connection, job_id: int) -> dict[str, Any]:
    """The job row as a dict."""
    with db.cursor(row_factory=dict_row) as cursor:
        row = cursor.execute("SELECT * FROM akadze.jobs WHERE id = %s", (job_id,)).fetchone()
    assert row is not None, f"job {job_id} is gone"
    return row


def job_of_task(db: psycopg.Connection, task_id: str) -> dict[str, Any]:
    """The row of the job a Celery task id names: its ``meta["task_id"]``, else the job
    without one whose derived id it is (``akadze_core.model.task_ids``)."""
    derived = TaskIds(lookup.task_id_key(db)).job_id(task_id)
    with db.cursor(row_factory=dict_row) as cursor:
        row = cursor.execute(
            "SELECT * FROM akadze.jobs WHERE meta->>'task_id' = %s"
            " OR (id = %s AND NOT meta ? 'task_id')", (task_id, derived)).fetchone()
    assert row is not None, f"no job has task id {task_id}"
    return row


def is_uuid4(text: object) -> bool:
    """Whether ``text`` is a uuid4 in its canonical text form (a Celery task id)."""
    if not isinstance(text, str):
        return False
    try:
        parsed = uuid.UUID(text)
    except ValueError:
        return False
    return parsed.version == 4 and parsed.variant == uuid.RFC_4122 and str(parsed) == text


def states(db: psycopg.Connection) -> dict[int, str]:
    """id -> state of every job."""
    return dict(db.execute("SELECT id, state FROM akadze.jobs ORDER BY id").fetchall())


async def run_worker_until(
    worker: Worker, done: Callable[[], bool], timeout: float = 20.0
) -> int:
    """Run ``worker`` until ``done()`` is true (checked every 20 ms), then stop it."""
    runner = asyncio.create_task(worker.run())
    deadline = time.monotonic() + timeout
    try:
        while not done():
            if runner.done():
                return runner.result()
            if time.monotonic() > deadline:
                raise AssertionError("timed out waiting for the worker")
            await asyncio.sleep(0.02)
    finally:
        if not runner.done():
            worker.request_stop()
    return await asyncio.wait_for(runner, 30)


def wait_for(predicate: Callable[[], bool], timeout: float = 20.0, interval: float = 0.05) -> None:
    """Block until ``predicate()`` is true."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError("timed out")
        time.sleep(interval)


def children_of(pid: int) -> set[int]:
    """The live child processes of ``pid`` (the benchmark's /proc reader)."""
    return set(children(pid))


def migrate_together(url: str, apply: Callable[[psycopg.Connection], Any],
                     count: int = 4) -> list[Any]:
    """Run ``apply`` on ``count`` connections to ``url`` released at once (a barrier), as
    several deploy steps migrating together; returns what each returned. Any exception in a
    thread fails the caller."""
    results: list[Any] = []
    errors: list[BaseException] = []
    barrier = threading.Barrier(count)

    def run() -> None:
        try:
            with psycopg.connect(url, autocommit=True) as connection:
                barrier.wait()
                results.append(apply(connection))
        except BaseException as exc:  # collected and raised below
            errors.append(exc)

    threads = [threading.Thread(target=run) for _ in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    return results
