"""Claim latency as the backlog grows: ``akadze_core.store.database.claim_jobs`` timed alone.

Each scenario gets its own database (``<bench database>_claim_<scenario>``), its backlog
generated in SQL and ANALYZEd, and a registered worker row. Then the scenarios take turns,
``ROUND`` claims each, until every one made ``claims`` claims of ``limit`` jobs: a change of
machine load during the run hits every scenario alike. Claims run on one autocommit
connection per scenario and commit like a worker's (the backlog's head fills with claimed
rows as in a drain); the first ``WARM_UP`` claims of each are not counted.
"""

from __future__ import annotations

import asyncio
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import psycopg

from akadze_core.store import database

from . import db
from .apps.core_app import NOOP

QUEUE = "claims"
WARM_UP = 10
ROUND = 25


@dataclass(frozen=True)
class Scenario:
    """A backlog: ``backlog`` due jobs plus ``future`` due in a day, in one queue, behind
    ``finished`` jobs that were queued and have just succeeded (not vacuumed yet, as in the
    middle of a long drain).

    ``setup``, if given, is called with the scenario's database URL before anything is
    filled: a history made some other way (bench.hotpath drains one with a real worker).
    """

    name: str
    backlog: int
    future: int = 0
    finished: int = 0
    setup: Callable[[str], None] | None = field(default=None, compare=False)


@dataclass
class ClaimResult:
    """Milliseconds per ``claim_jobs`` call."""

    backlog: int
    future: int
    finished: int
    claims: int
    limit: int
    p50: float
    p99: float
    mean: float


def claim_latency(admin: str, base_name: str, scenarios: list[Scenario], *,
                  claims: int = 300, limit: int = 10) -> dict[str, ClaimResult]:
    """Time ``claims`` claims in each scenario, interleaved; results by scenario name."""
    urls = {}
    try:
        for scenario in scenarios:
            url = db.recreate(admin, f"{base_name}_claim_{scenario.name}")
            urls[scenario.name] = url
            if scenario.setup is not None:
                scenario.setup(url)
            db.fill(url, scenario.finished + scenario.backlog, task=NOOP, queue=QUEUE)
            if scenario.finished:
                _finish_first(url, scenario.finished)
            if scenario.future:
                db.fill(url, scenario.future, task=NOOP, queue=QUEUE, delay_seconds=86_400)
        times = asyncio.run(_interleaved(urls, claims, limit))
    finally:
        for name in urls:
            db.drop(admin, f"{base_name}_claim_{name}")
    results = {}
    for scenario in scenarios:
        spent = sorted(times[scenario.name])
        results[scenario.name] = ClaimResult(
            backlog=scenario.backlog, future=scenario.future, finished=scenario.finished,
            claims=len(spent), limit=limit,
            p50=spent[len(spent) // 2], p99=spent[min(len(spent) - 1, int(len(spent) * 0.99))],
            mean=sum(spent) / len(spent))
    return results


def _finish_first(url: str, count: int) -> None:
    """Mark the first ``count`` jobs succeeded, leaving their dead versions (and the dead
    entries at the head of the claim index) for a VACUUM that has not run yet."""
    with psycopg.connect(url, autocommit=True) as connection:
        connection.execute("SET synchronous_commit = off")
        connection.execute(
            "UPDATE akadze.jobs SET state = 'succeeded', attempt = 1, run_count = 1,"
            " started_at = now(), finished_at = now() WHERE id <= %s", (count,))
        connection.execute("ANALYZE akadze.jobs")


async def _interleaved(urls: dict[str, str], claims: int, limit: int) -> dict[str, list[float]]:
    connections = {name: await psycopg.AsyncConnection.connect(url, autocommit=True)
                   for name, url in urls.items()}
    try:
        workers = {name: await _register(connection)
                   for name, connection in connections.items()}
        times: dict[str, list[float]] = {name: [] for name in urls}
        for name, connection in connections.items():
            for _ in range(WARM_UP):
                await _claim(connection, workers[name], limit)
        while any(len(spent) < claims for spent in times.values()):
            for name, connection in connections.items():
                for _ in range(min(ROUND, claims - len(times[name]))):
                    times[name].append(await _claim(connection, workers[name], limit))
        return times
    finally:
        for connection in connections.values():
            await connection.close()


async def _register(connection: psycopg.AsyncConnection) -> int:
    row = await database.fetch_one_async(
        connection, "worker_register", name="bench-claims", hostname=socket.gethostname(),
        pid=0, queues=[QUEUE], heartbeat_ttl=3600, slots=None)
    assert row is not None
    return int(row["id"])


async def _claim(connection: psycopg.AsyncConnection, worker_id: int, limit: int) -> float:
    started = time.perf_counter()
    rows = await database.claim_jobs(connection, QUEUE, limit, worker_id, False)
    elapsed = (time.perf_counter() - started) * 1000
    if len(rows) != limit:
        raise RuntimeError(f"claimed {len(rows)} jobs, expected {limit}")
    return elapsed
