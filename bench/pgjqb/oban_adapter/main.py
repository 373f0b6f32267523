#!/usr/bin/env python3
"""Oban for Python (``oban`` on PyPI) adapter for the pgjqb harness, for the side-by-side run.

The harness's own ``oban-bench`` is Oban for Elixir; this is the Python package, written
like our other adapters: ``bench/pgjqb/contract.py`` for the contract, Oban's public API for
the rest: ``oban.schema.install`` (what ``oban install`` runs), a ``@worker`` class,
``Oban.enqueue_many`` (its documented bulk call), ``Oban.start`` / ``Oban.stop`` for one
queue of WORKER_COUNT, and a count of ``available`` rows of the queue for the depth (Oban
has no public depth call; the harness's other Python adapters read their tables too).

It runs under Oban's own virtualenv (Python >= 3.12, ``bench.oban_side.oban_python``).
Settings are Oban's defaults (the Basic engine of the open-source package, a pool of 10, the
stager every 1 s, pruning of completed jobs older than a day) except the lifeline's
``rescue_after`` of 15 s (default 300 s): the harness's Elixir Oban adapter rescues orphans
after 15 s too, so the crash cells can finish within their phases.
"""

from __future__ import annotations

import sys
from importlib.metadata import version
from pathlib import Path
from typing import Any

from oban import Oban, worker
from oban.schema import install
from psycopg_pool import AsyncConnectionPool

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))

from bench.pgjqb.contract import LongHorizon, run

QUEUE = "pgjqb_bench"
#: The running adapter, whose ``job_body`` the worker calls (Oban instantiates the worker).
BENCH: ObanPython | None = None


@worker(queue=QUEUE)
class BenchWorker:
    """The bench job: note the pickup latency, sleep JOB_WORK_MS, count it."""

    async def process(self, job: Any) -> None:
        assert BENCH is not None
        await BENCH.job_body(float(job.args["created_at"]))


class ObanPython(LongHorizon):
    """Oban: ``enqueue_many`` to insert, one ``Oban`` with ``queues={QUEUE: WORKER_COUNT}``."""

    system = "oban-python"
    event_tables = ["public.oban_jobs", "public.oban_producers",  # noqa: RUF012
                    "public.oban_leaders"]

    def __init__(self) -> None:
        global BENCH
        super().__init__()
        BENCH = self
        self.version = f"oban {version('oban')}"
        self.pool: Any = None
        self.oban: Any = None

    async def setup(self) -> None:
        """The pool, Oban's schema (``install``, idempotent), the instance (not started)."""
        self.pool = AsyncConnectionPool(self.url, min_size=1, max_size=10, open=False)
        await self.pool.open()
        try:
            await install(self.pool)
        except Exception as exc:
            # Two replicas may install at once: the second one's CREATE can collide with the
            # first's; the schema is there then, which starting Oban checks.
            self.log_error("oban install (another replica may have done it)", exc)
        self.oban = Oban(pool=self.pool, queues={QUEUE: self.worker_count},
                         lifeline={"rescue_after": 15.0}, shutdown_grace_period=3.0)

    async def insert(self, rows: list[dict[str, Any]]) -> None:
        """One ``enqueue_many`` call."""
        await self.oban.enqueue_many([BenchWorker.new(row) for row in rows])

    async def consume(self) -> None:
        """``start``: the producers run in the background until ``stop``."""
        await self.oban.start()

    async def stop_consumer(self) -> None:
        """``stop``: stop fetching, let running jobs finish (up to 3 s), flush the acks."""
        await self.oban.stop()

    async def depth(self) -> int:
        """Available jobs of the bench queue (Oban's state/queue index)."""
        async with self.pool.connection() as conn:
            cur = await conn.execute(
                "SELECT count(*) FROM oban_jobs WHERE state = 'available' AND queue = %s",
                (QUEUE,))
            row = await cur.fetchone()
        return int(row[0]) if row else 0


if __name__ == "__main__":
    run(ObanPython)
