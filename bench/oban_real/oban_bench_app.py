"""The no-op worker of the Oban drain: Oban's documented ``@worker`` class.

Oban stores the worker's import path in each row (``oban_bench_app.NoopWorker``) and the
``oban start`` process imports it from there, so this module is on the worker's PYTHONPATH.
"""

from __future__ import annotations

import os
import time
from typing import Any

import psycopg
from oban import worker

QUEUE = "bench"
#: Where ``StampWorker`` writes the time its body started (the latency workload).
STAMPS = "bench_stamps"
_stamp_connection: psycopg.AsyncConnection[Any] | None = None


@worker(queue=QUEUE)
class NoopWorker:
    """Does nothing: the drain measures the queue, not the job."""

    async def process(self, job: Any) -> None:
        return None


@worker(queue=QUEUE)
class StampWorker:
    """Notes ``time.time()`` at its start in ``bench_stamps`` (job id, seconds): worker,
    client and Postgres share one host and so one clock. The write comes after the clock is
    read, so it is not in the figure."""

    async def process(self, job: Any) -> None:
        started = time.time()
        global _stamp_connection
        if _stamp_connection is None:
            _stamp_connection = await psycopg.AsyncConnection.connect(
                os.environ["BENCH_STAMP_DSN"], autocommit=True)
        await _stamp_connection.execute(
            "INSERT INTO bench_stamps (job_id, started) VALUES (%s, %s)", (job.id, started))
