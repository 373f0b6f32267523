"""``python -m bench.suspects``: the hot path's suspects of bench/PROFILE.md, each measured by
itself, the two sides interleaved in small blocks in one process (on a busy host a load
change then hits both alike; whole drains moved 4x between runs there).

- ``convert``: psycopg's conversion of the claim's text with its comment lines (as sent
  before they were left in the .sql file) and without: past 4,096 characters psycopg
  does not cache it.
- ``lock``: ``claim_jobs(limit=4)`` with the worker's lock bound (passed to
  ``akadze.claim_jobs``, which sets it before its statement locks anything; it was a
  ``set_config`` before the claim, in a pipeline) and without; wall and client CPU per
  claim.
- ``task-id``: claim + outcome write of ``.delay()``-shaped rows with their uuid4
  ``meta.task_id`` (an entry in ``jobs_meta_task_id_idx`` per row version) and without;
  the backend's CPU per job.

Each in a database of its own (``akadze_bench_suspects_*``), dropped afterwards.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import statistics
import time
from collections.abc import Sequence
from importlib import resources

import psycopg
from psycopg import _queries
from psycopg.adapt import Transformer

from akadze_core.model.outcomes import SUCCESS, Outcome
from akadze_core.store import database
from akadze_core.store.floors import Floors
from akadze_core.store.migrations import migrate
from akadze_core.store.queries import query

from . import db, procs
from .ab import prepare


def _fresh(admin: str, tag: str) -> str:
    name = f"akadze_bench_suspects_{tag}_{os.getpid()}"
    db.drop(admin, name)
    with psycopg.connect(admin, autocommit=True) as connection:
        connection.execute(psycopg.sql.SQL("CREATE DATABASE {}").format(
            psycopg.sql.Identifier(name)))
    return name


def _worker(url: str) -> int:
    with psycopg.connect(url, autocommit=True) as connection:
        row = connection.execute(
            "INSERT INTO akadze.workers (name, hostname, pid, queues, heartbeat_ttl)"
            " VALUES ('suspects', 'here', 1, '{default,celery,plain}', '1 hour')"
            " RETURNING id").fetchone()
    assert row is not None
    return int(row[0])


def convert(admin: str, blocks: int) -> str:
    """Microseconds per conversion of the claim's text, with and without its comments."""
    text = resources.files("akadze_core").joinpath("sql/queries.sql").read_text("utf-8")
    commented = re.split(r"^-- name: job_claim\s*$", text, flags=re.M)[1]
    commented = re.split(r"^-- name: ", commented, flags=re.M)[0].strip()
    params = {"lock_timeout": None, "queue": "default", "limit": 4, "worker_id": 1,
              "floor_priority": [],
              "floor_at": [], "floor_id": []}
    with psycopg.connect(admin) as connection:
        transformer = Transformer(connection)
        times: dict[str, list[float]] = {"with comments": [], "sent today": []}
        for block in range(blocks):
            sides = list(times) if block % 2 == 0 else list(times)[::-1]
            for side in sides:
                sql = commented if side == "with comments" else query("job_claim")
                start = time.perf_counter()
                for _ in range(200):
                    _queries.PostgresQuery(transformer).convert(sql, params)
                times[side].append((time.perf_counter() - start) / 200)
    sizes = {"with comments": len(commented), "sent today": len(query("job_claim"))}
    return "; ".join(f"{side} ({sizes[side]} chars): {statistics.median(values) * 1e6:.0f} us"
                     for side, values in times.items())


def lock(admin: str, blocks: int) -> str:
    """Per claim of 4 jobs: wall (median block) and client CPU, with and without the bound."""
    name = _fresh(admin, "lock")
    url = db.url_for(admin, name)
    try:
        with psycopg.connect(url, autocommit=True) as connection:
            migrate(connection)
        worker_id = _worker(url)
        db.fill(url, blocks * 2 * 20 * 4 + 100, task="bench.noop")

        async def run() -> dict[str, tuple[list[float], float]]:
            connection = await psycopg.AsyncConnection.connect(url, autocommit=True)
            found: dict[str, tuple[list[float], float]] = {"plain": ([], 0.0),
                                                            "lock bound": ([], 0.0)}
            floors = Floors()  # as a worker claims: never over the rows claimed before
            try:
                for block in range(blocks):
                    for side in (("plain", "lock bound") if block % 2 == 0
                                 else ("lock bound", "plain")):
                        cpu, wall = time.process_time(), time.perf_counter()
                        for _ in range(20):
                            if side == "plain":
                                await database.claim_jobs(connection, "default", 4, worker_id,
                                                          False, floors=floors)
                            else:
                                with database.lock_timeout(2.0):
                                    await database.claim_jobs(connection, "default", 4,
                                                              worker_id, False, floors=floors)
                        walls, spent = found[side]
                        walls.append((time.perf_counter() - wall) / 20)
                        found[side] = (walls, spent + time.process_time() - cpu)
            finally:
                await connection.close()
            return found

        found = asyncio.run(run())
    finally:
        db.drop(admin, name)
    return "; ".join(f"{side}: wall {statistics.median(walls) * 1e6:.0f} us, client CPU "
                     f"{spent / (blocks * 20) * 1e6:.0f} us per claim"
                     for side, (walls, spent) in found.items())


def task_id(admin: str, blocks: int) -> str:
    """Backend CPU per job of claim + outcome write, rows with and without meta.task_id."""
    name = _fresh(admin, "taskid")
    url = db.url_for(admin, name)
    per_side = blocks * 10 * 8
    try:
        prepare(url, "compat", 2 * per_side + 100)
        with psycopg.connect(url, autocommit=True) as connection:
            # Half the rows in a queue of their own, the same meta less the task id.
            connection.execute("UPDATE akadze.jobs SET queue = 'plain',"
                               " meta = meta - 'task_id' WHERE id % 2 = 0")
            connection.execute("VACUUM FULL akadze.jobs")
            connection.execute("ANALYZE akadze.jobs")
        worker_id = _worker(url)

        async def run() -> dict[str, list[float]]:
            connection = await psycopg.AsyncConnection.connect(url, autocommit=True)
            # The commit's WAL flush is the same on both sides: left out of the figure.
            await connection.execute("SET synchronous_commit = off")
            cursor = await connection.execute("SELECT pg_backend_pid()")
            pid = (await cursor.fetchone() or (0,))[0]
            floors = {queue: Floors() for queue in ("celery", "plain")}
            found: dict[str, list[float]] = {"with task id": [0.0, 0.0],
                                             "without": [0.0, 0.0]}
            try:
                for block in range(blocks):
                    for side in (list(found) if block % 2 == 0 else list(found)[::-1]):
                        queue = "celery" if side == "with task id" else "plain"
                        cpu = procs.cpu_seconds(pid) or 0.0
                        for _ in range(10):
                            rows = await database.claim_jobs(connection, queue, 8, worker_id,
                                                             False, floors=floors[queue])
                            await database.complete_many(connection, [
                                Outcome(row["id"], row["run_count"], SUCCESS, result="null")
                                for row in rows])
                            found[side][1] += len(rows)
                        found[side][0] += (procs.cpu_seconds(pid) or 0.0) - cpu
            finally:
                await connection.close()
            return found

        found = asyncio.run(run())
    finally:
        db.drop(admin, name)
    return "; ".join(f"{side}: backend CPU {spent / max(jobs, 1) * 1e6:.0f} us per job"
                     for side, (spent, jobs) in found.items())


SUSPECTS = {"convert": convert, "lock": lock, "task-id": task_id}


def main(argv: Sequence[str] | None = None) -> None:
    """Measure the suspects named (all by default) and print one line each."""
    parser = argparse.ArgumentParser(prog="python -m bench.suspects", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("names", nargs="*", help=f"any of {', '.join(SUSPECTS)} (all)")
    parser.add_argument("--blocks", type=int, default=60, help="interleaved blocks (60)")
    parser.add_argument("--admin-url")
    options = parser.parse_args(argv)
    unknown = set(options.names) - set(SUSPECTS)
    if unknown:
        parser.error(f"unknown suspects: {', '.join(sorted(unknown))}")
    admin = db.admin_url(options.admin_url)
    for name in options.names or list(SUSPECTS):
        print(f"{name}: {SUSPECTS[name](admin, options.blocks)}", flush=True)


if __name__ == "__main__":
    main()
