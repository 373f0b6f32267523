"""The workflow tasks of the fault harness (``fault_app`` registers them): chain steps, chord
members and bodies, errbacks and the model test's nodes.

Every task records its start in ``runs(job_id, run_count, pid)`` on the worker's own pool
before doing anything else, so a test can tell from the database which jobs ever ran, how
often, and in which worker process. A chord body writes its effect to ``wf_bodies`` in the
transaction that completes it (``complete_tx``): a body run killed midway leaves no effect,
so the effect's row count is the number of times the body *really* ran.
"""

from __future__ import annotations

import asyncio
import os
from datetime import timedelta
from typing import Any

import psycopg

from akadze_core import App, Cancel, Fail, current

#: The table a chord body writes its effect to, with the job's success (``complete_tx``).
#: The primary key refuses a second effect for the same chord.
BODIES_TABLE = """
CREATE TABLE IF NOT EXISTS wf_bodies (
    tag       text        PRIMARY KEY,
    job_id    bigint      NOT NULL,
    run_count integer     NOT NULL,
    vals      jsonb       NOT NULL,
    at        timestamptz NOT NULL DEFAULT clock_timestamp()
)
"""

#: Quick retries: a test should not wait out the default backoff curve.
QUICK_RETRY = timedelta(seconds=0.1)


def register_workflow_tasks(app: App) -> None:
    """Add the workflow tasks to ``app``."""

    async def record() -> None:
        context = current()

        async def insert(connection: psycopg.AsyncConnection) -> None:
            await connection.execute(
                "INSERT INTO runs (job_id, run_count, pid) VALUES (%s, %s, %s)",
                (context.id, context.run_count, os.getpid()))

        await app.run_pooled_async(insert)

    @app.task("wf_step", max_attempts=10, backoff=lambda attempt: QUICK_RETRY)
    async def wf_step(x: int, add: int = 1, seconds: float = 0.0, flaky: bool = False,
                      fail: bool = False) -> int:
        """``x + add`` after ``seconds``; ``flaky``: the first attempt raises (retried);
        ``fail``: fails for good (``Fail``)."""
        await record()
        if fail:
            raise Fail(f"step {x} told to fail")
        if flaky and current().attempt == 1:
            raise ValueError("first attempt fails")
        await asyncio.sleep(seconds)
        return x + add

    @app.task("wf_body", max_attempts=10, backoff=lambda attempt: QUICK_RETRY)
    async def wf_body(values: list[int], tag: str, seconds: float = 0.0) -> None:
        """A chord body: sleeps ``seconds`` on its first run only (long enough to be killed
        in), then writes ``values`` to ``wf_bodies`` with the job's success."""
        await record()
        context = current()
        if context.run_count == 1:
            await asyncio.sleep(seconds)
        async with context.complete_tx() as connection:
            await connection.execute(
                "INSERT INTO wf_bodies (tag, job_id, run_count, vals) VALUES (%s, %s, %s, %s)",
                (tag, context.id, context.run_count, psycopg.types.json.Jsonb(values)))

    @app.task("wf_errback", max_attempts=10, backoff=lambda attempt: QUICK_RETRY)
    async def wf_errback(tag: str, error: dict[str, Any] | None = None) -> dict[str, Any]:
        """An errback: returns its tag and the type of the error it was given (if any)."""
        await record()
        return {"tag": tag, "type": None if error is None else error.get("type")}

    @app.task("wf_node", max_attempts=2, backoff=lambda attempt: QUICK_RETRY)
    async def wf_node(name: str, mode: str = "ok", seconds: float = 0.0,
                      inputs: Any = None) -> dict[str, Any] | None:
        """A node of the model test. Returns its name and the names of the results it was
        given (one, a list, or none; a null result counts as no name). ``mode``: ok; flaky
        (the first attempt raises); exhaust (every attempt raises: failed once max_attempts
        is spent); fail (``Fail``); cancel (``Cancel``); tx (succeeds through
        ``complete_tx``, which stores a null result)."""
        await record()
        context = current()
        attempt = context.attempt
        if mode == "tx":
            async with context.complete_tx() as connection:
                await connection.execute("SELECT 1")
            return None
        if mode == "fail":
            raise Fail(f"{name} fails")
        if mode == "cancel":
            raise Cancel(f"{name} cancels itself")
        if mode == "exhaust" or (mode == "flaky" and attempt == 1):
            raise ValueError(f"{name} attempt {attempt} fails")
        await asyncio.sleep(seconds)
        if isinstance(inputs, list):
            got: Any = [value["name"] if isinstance(value, dict) else None
                        for value in inputs]
        elif isinstance(inputs, dict):
            got = inputs["name"]
        else:
            got = None
        return {"name": name, "got": got}
