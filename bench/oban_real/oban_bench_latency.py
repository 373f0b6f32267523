"""Enqueue commit -> body start on an idle Oban, one job at a time.

Runs only in the Oban virtualenv, beside a running ``oban start`` whose environment has
``BENCH_STAMP_DSN``: ``python -m oban_bench_latency --dsn URL --samples N`` enqueues one
``StampWorker`` job with ``Oban.enqueue`` (its own transaction, committed when the call
returns), notes ``time.time()`` then, waits until the job is completed, sleeps 20-40 ms (the
worker is idle again), and so on; three warm-up jobs first. Prints ``{"delays_ms": [...],
"enqueue_ms": [...]}``: the body's start minus the enqueue's return, and the enqueue call.
This is how ``bench.core.latency`` measures akadze.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import time
from typing import Any

import psycopg
from oban import Oban
from oban_bench_app import StampWorker
from psycopg_pool import AsyncConnectionPool


async def _wait_completed(conn: psycopg.AsyncConnection[Any], job_id: int,
                          timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while True:
        cur = await conn.execute("SELECT state::text FROM oban_jobs WHERE id = %s", (job_id,))
        row = await cur.fetchone()
        if row and row[0] == "completed":
            return
        if time.monotonic() > deadline:
            raise RuntimeError(f"job {job_id} did not complete (state {row})")
        await asyncio.sleep(0.005)


async def measure(dsn: str, samples: int) -> dict[str, list[float]]:
    """The delays and enqueue times of ``samples`` jobs, in milliseconds."""
    pool = AsyncConnectionPool(dsn, min_size=1, max_size=1, open=False)
    await pool.open()
    watch = await psycopg.AsyncConnection.connect(dsn, autocommit=True)
    try:
        oban = Oban(pool=pool)
        for _ in range(3):  # warm up: the worker's LISTEN and stamp connection, our pool
            job = await oban.enqueue(StampWorker.new({}))
            await _wait_completed(watch, job.id, timeout=60)
        sent: list[tuple[int, float, float]] = []
        for _ in range(samples):
            await asyncio.sleep(random.uniform(0.02, 0.04))
            before = time.time()
            job = await oban.enqueue(StampWorker.new({}))
            after = time.time()
            sent.append((job.id, before, after))
            await _wait_completed(watch, job.id)
        cur = await watch.execute("SELECT job_id, started FROM bench_stamps"
                                  " WHERE job_id = ANY(%s)", ([i for i, _, _ in sent],))
        started = dict(await cur.fetchall())
        return {"delays_ms": [(started[i] - after) * 1000 for i, _, after in sent],
                "enqueue_ms": [(after - before) * 1000 for _, before, after in sent]}
    finally:
        await watch.close()
        await pool.close()


def main() -> None:
    """Parse the arguments, measure, print the JSON line."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--dsn", required=True)
    parser.add_argument("--samples", type=int, required=True)
    options = parser.parse_args()
    print(json.dumps(asyncio.run(measure(options.dsn, options.samples))))


if __name__ == "__main__":
    main()
