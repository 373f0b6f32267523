"""The figures of docs/how-to/citus.md: ``python -m tests.citus.measure [jobs]``.

Starts a coordinator and two workers (as the tests do), migrates in Citus mode, and times on
the same machine, for Citus mode and for one server (a database on 127.0.0.1:5432):
enqueue_many, one enqueue per call, and a worker draining the jobs (no-op bodies).
"""

from __future__ import annotations

import asyncio
import sys
import time
import uuid
from typing import Any

import psycopg

from akadze_core import App, Worker
from akadze_core.store.migrations import migrate
from akadze_core.store.queries import use_dialect
from tests.citus.cluster import CitusCluster, citus_bin

SINGLE_SERVER = "postgresql://postgres@127.0.0.1:5432/postgres"


def count(url: str, state: str) -> int:
    with psycopg.connect(url) as connection:
        row = connection.execute("SELECT count(*) FROM akadze.jobs WHERE state = %s",
                                 (state,)).fetchone()
    return int(row[0]) if row else 0


async def measure(url: str, citus: bool, jobs: int) -> dict[str, float]:
    app = App(url, citus=citus)

    @app.task("noop")
    async def noop(n: int) -> None: ...

    started = time.perf_counter()
    for first in range(0, jobs, 1000):
        noop.enqueue_many([{"n": n} for n in range(first, min(first + 1000, jobs))])
    bulk = jobs / (time.perf_counter() - started)
    singles = 500
    started = time.perf_counter()
    for n in range(singles):
        noop.enqueue(n=n)
    single = singles / (time.perf_counter() - started)
    worker = Worker(app, slots=20, poll_interval=0.1)
    runner = asyncio.create_task(worker.run())
    started = time.perf_counter()
    while count(url, "succeeded") < jobs + singles:
        await asyncio.sleep(0.1)
    drain = (jobs + singles) / (time.perf_counter() - started)
    worker.request_stop()
    await asyncio.wait_for(runner, 60)
    await app.close_async()
    return {"enqueue_many": bulk, "enqueue": single, "drain": drain}


def report(name: str, figures: dict[str, Any]) -> None:
    print(f"{name:<24} enqueue_many {figures['enqueue_many']:8,.0f} jobs/s   "
          f"enqueue {figures['enqueue']:6,.0f} jobs/s   drain {figures['drain']:6,.0f} jobs/s")


def main() -> None:
    jobs = int(sys.argv[1]) if len(sys.argv) > 1 else 5000
    bin_dir, reason = citus_bin()
    if bin_dir is None:
        sys.exit(reason)
    name = f"akadze_measure_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(SINGLE_SERVER, autocommit=True) as admin:
        admin.execute(f'CREATE DATABASE "{name}"')
    single_url = SINGLE_SERVER.rsplit("/", 1)[0] + "/" + name
    try:
        with psycopg.connect(single_url, autocommit=True) as connection:
            migrate(connection)
        report("one server", asyncio.run(measure(single_url, False, jobs)))
    finally:
        with psycopg.connect(SINGLE_SERVER, autocommit=True) as admin:
            admin.execute(f'DROP DATABASE "{name}" WITH (FORCE)')
    with CitusCluster(bin_dir) as cluster:
        with psycopg.connect(cluster.url(), autocommit=True) as connection:
            migrate(connection, citus=True)
        report("citus, 2 worker nodes", asyncio.run(measure(cluster.url(), True, jobs)))
        use_dialect("postgres")


if __name__ == "__main__":
    main()
