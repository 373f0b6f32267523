"""Enqueue the no-ops an Oban drain will run.

Runs only in the Oban virtualenv: ``python -m oban_bench_enqueue --dsn URL --jobs N``
inserts N ``NoopWorker`` jobs with ``Oban.enqueue_many`` (Oban's documented bulk call) in
batches of ``--batch``, from a client-mode ``Oban`` (no queues: it only inserts), then
ANALYZEs the table as the akadze fill does, and prints ``{"enqueued": N, "seconds": S}``
(the inserts only) as JSON.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time

from oban import Oban
from oban_bench_app import NoopWorker
from psycopg_pool import AsyncConnectionPool


async def enqueue(dsn: str, jobs: int, batch: int) -> float:
    """Insert ``jobs`` no-ops; the seconds the inserts took."""
    pool = AsyncConnectionPool(dsn, min_size=1, max_size=1, open=False)
    await pool.open()
    try:
        oban = Oban(pool=pool)
        started = time.perf_counter()
        for first in range(0, jobs, batch):
            await oban.enqueue_many(NoopWorker.new({"n": n})
                                    for n in range(first, min(jobs, first + batch)))
        seconds = time.perf_counter() - started
        async with pool.connection() as conn:
            await conn.execute("ANALYZE oban_jobs")
        return seconds
    finally:
        await pool.close()


def main() -> None:
    """Parse the arguments, enqueue, print the JSON line."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--dsn", required=True)
    parser.add_argument("--jobs", type=int, required=True)
    parser.add_argument("--batch", type=int, default=1000)
    options = parser.parse_args()
    seconds = asyncio.run(enqueue(options.dsn, options.jobs, options.batch))
    print(json.dumps({"enqueued": options.jobs, "seconds": seconds}))


if __name__ == "__main__":
    main()
