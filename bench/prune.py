"""What pruning finished jobs costs: the prune service's DELETE over 1,000,000 finished rows.

In a database of its own (``akadze_bench_prune``, dropped at the end): ``--jobs`` succeeded
jobs finished two days ago (past the default one-day retention) beside 10,000 queued ones,
VACUUM ANALYZE, then ``akadze_core.store.database.prune_jobs`` (the statement the worker's
prune service runs) with the worker's batch (``--batch``, 1,000) until nothing is left.
Printed: the whole prune (seconds, rows a second), one prune step (the service's ten batches:
median and worst), the table's size before, after, and after the VACUUM that the deleted
rows then need (and that VACUUM's time). For comparison, the time of ``DROP TABLE`` of a copy
of the same rows: what retention by dropping a partition would cost, which akadze does not
do. ``python -m bench.prune [--jobs N]``.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import statistics
import time
from datetime import UTC, datetime

import psycopg

from akadze_core.store import database

from . import db

DAY = 86_400.0


def _size(connection: psycopg.Connection) -> str:
    (size,), = connection.execute(
        "SELECT pg_size_pretty(pg_total_relation_size('akadze.jobs'))").fetchall()
    return str(size)


def _timed(connection: psycopg.Connection, statement: str) -> float:
    started = time.perf_counter()
    connection.execute(statement)
    return time.perf_counter() - started


def _fill(url: str, jobs: int) -> None:
    with psycopg.connect(url, autocommit=True) as connection:
        connection.execute("SET synchronous_commit = off")
        connection.execute(
            "INSERT INTO akadze.jobs (task, queue, args, state, scheduled_at, attempt,"
            "                         run_count, result, created_at, started_at, finished_at)"
            " SELECT 'tasks.t' || (g %% 40), 'default', jsonb_build_object('n', g),"
            "        'succeeded', t, 1, 1, jsonb_build_object('ok', g), t,"
            "        t + interval '1 second', t + interval '2 seconds'"
            " FROM generate_series(1, %(jobs)s) AS g,"
            "      LATERAL (SELECT now() - interval '2 days' - g * interval '1 ms') AS s(t)",
            {"jobs": jobs})
        connection.execute(
            "INSERT INTO akadze.jobs (task, queue, args)"
            " SELECT 'tasks.t1', 'default', jsonb_build_object('n', g)"
            " FROM generate_series(1, 10000) AS g")
        connection.execute("VACUUM ANALYZE akadze.jobs")


async def _prune(url: str, batch: int) -> tuple[int, float, list[float]]:
    """Prune until nothing is left; (rows, seconds, seconds of each ten-batch step)."""
    total, steps = 0, []
    started = time.perf_counter()
    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as connection:
        while True:
            step_started, pruned = time.perf_counter(), 0
            for _ in range(10):  # the prune service's step
                count = await database.prune_jobs(
                    connection, finished_retention=DAY, failed_retention=7 * DAY,
                    limit=batch)
                pruned += count
                if count < batch:
                    break
            steps.append(time.perf_counter() - step_started)
            total += pruned
            if pruned < 10 * batch:
                break
    return total, time.perf_counter() - started, steps


def main() -> None:
    """Fill, prune, print."""
    parser = argparse.ArgumentParser(prog="python -m bench.prune",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=1_000_000)
    parser.add_argument("--batch", type=int, default=1000)
    parser.add_argument("--admin-url", default=None)
    args = parser.parse_args()
    admin = db.admin_url(args.admin_url)
    url = db.recreate(admin, f"{db.NAME_PREFIX}_prune")
    try:
        _fill(url, args.jobs)
        with psycopg.connect(url, autocommit=True) as connection:
            before = _size(connection)
            connection.execute("CREATE TABLE bench_prune_copy AS SELECT * FROM akadze.jobs"
                               " WHERE state = 'succeeded'")
            connection.execute("CHECKPOINT")
            dropped = _timed(connection, "DROP TABLE bench_prune_copy")
        rows, seconds, steps = asyncio.run(_prune(url, args.batch))
        with psycopg.connect(url, autocommit=True) as connection:
            after = _size(connection)
            vacuum = _timed(connection, "VACUUM akadze.jobs")
            vacuumed = _size(connection)
        print(f"{datetime.now(UTC):%Y-%m-%d %H:%M} UTC, {platform.node()}, "
              f"{os.cpu_count()} cores, Postgres on loopback")
        print(f"prune of {rows:,} finished rows, batch {args.batch:,}: {seconds:.1f} s "
              f"({rows / seconds:,.0f} rows/s); a step of ten batches: median "
              f"{statistics.median(steps[:-1] or steps) * 1000:.0f} ms, worst "
              f"{max(steps) * 1000:.0f} ms")
        print(f"akadze.jobs: {before} before, {after} after the prune, "
              f"{vacuumed} after VACUUM ({vacuum:.1f} s)")
        print(f"for comparison, DROP TABLE of a copy of the same rows: "
              f"{dropped * 1000:.0f} ms")
    finally:
        db.drop(admin, f"{db.NAME_PREFIX}_prune")


if __name__ == "__main__":
    main()
