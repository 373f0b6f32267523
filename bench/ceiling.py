"""The raw SQL ceiling of a drain, and the core worker's drains against it.

The ceiling is what the worker's own two batch statements can do with nothing else around
them: one Python process (asyncio and psycopg, like the worker) claims the backlog with
``akadze_core.store.database.claim_jobs`` exactly as the worker's producer calls it (the
default queue, ``LIMIT`` = the slots, a registered worker id, the claim floors, the worker's
default lock bound) and writes the no-op's success of the claimed rows with ``complete_many``
exactly as the completer does (one ``akadze.complete_jobs`` per write, of every outcome
waiting, up to the completer's batch). Two connections, like the worker's claim loop and
completer, running at once: claims go on while fewer outcomes wait than the worker's
backpressure bound (``pending_outcomes_limit``), each write takes what accumulated during
the last. No task body, no executor, no log line per job.

Beside it, ``akadze worker bench.apps.core_app:app --slots 64`` drains the same backlog of
async no-ops (``bench.core.core_drain``). Every run, ceiling or drain, gets a database of its
own, cloned from one migrated template and dropped afterwards, and the two take turns
(ceiling, ``DRAINS_PER_CEILING`` drains, ceiling, ...) so that a change of load hits both
alike. Both figures are read the same way: succeeded jobs over the window from the first
claim to the last outcome written, on the database clock (``db.drain_window``).
"""

from __future__ import annotations

import asyncio
import os
import socket
import statistics
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg
from psycopg import sql

from akadze_core.model.dsn import prepare_threshold
from akadze_core.model.outcomes import Outcome, succeeded
from akadze_core.store import database
from akadze_core.store.floors import Floors
from akadze_core.worker.config import DEFAULTS, seconds

from . import db
from .apps.core_app import NOOP
from .core import core_drain
from .drain import DrainError, DrainResult
from .report import Row, rate, times, verdict

#: The worker's ``--slots`` beside the ceiling, and the ceiling's claim size.
SLOTS = 64
DRAINS = 16
DRAINS_PER_CEILING = 4
#: The core drain's median of the drains over the ceiling's median of its runs.
CEILING_TARGET = 0.9
#: The slowest drain over the drains' median.
SPREAD_TARGET = 0.6
QUEUE = "default"
#: The completer's largest write (``Completer(max_batch=...)``'s default).
MAX_BATCH = 1000


@dataclass
class CeilingResult:
    """The ceiling's runs and the drains between them (jobs/s), in the order they ran."""

    jobs: int
    slots: int
    ceilings: list[float] = field(default_factory=list)
    drains: list[DrainResult] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)

    @property
    def ceiling(self) -> float | None:
        """The median of the ceiling's runs."""
        return statistics.median(self.ceilings) if self.ceilings else None

    @property
    def drain(self) -> float | None:
        """The median of the drains."""
        return statistics.median(d.rate for d in self.drains) if self.drains else None

    @property
    def slowest(self) -> float | None:
        """The slowest drain."""
        return min(d.rate for d in self.drains) if self.drains else None


# --- the ceiling ---------------------------------------------------------------------------

async def _register(connection: psycopg.AsyncConnection, slots: int) -> int:
    """A worker row for the claims to name, as the worker's lease registers one."""
    row = await database.fetch_one_async(
        connection, "worker_register", name="bench-ceiling", hostname=socket.gethostname(),
        pid=os.getpid(), queues=[QUEUE], heartbeat_ttl=seconds(DEFAULTS.heartbeat_ttl),
        slots=[slots])
    assert row is not None
    return int(row["id"])


def _outcomes(rows: list[dict[str, Any]]) -> list[Outcome]:
    """What the executor makes of a no-op's return (``None``) for each claimed row."""
    return [succeeded(row["id"], row["run_count"], row["attempt"], None, None,
                      claim_token=row["claim_token"]) for row in rows]


async def _ceiling(url: str, slots: int) -> None:
    """Claim and complete every queued job of ``url`` with the worker's claim loop and
    completer reduced to their statements: claims of ``slots`` while fewer outcomes than the
    worker's backpressure bound wait, and each write takes every outcome waiting (at most the
    completer's batch), so the claims and the writes overlap and batch as in the worker."""
    config = DEFAULTS.replace(slots=slots)
    bound, most_pending = config.lock_timeout_seconds(), config.pending_outcomes_limit()
    # The worker's connections: autocommit, statements prepared as its app prepares them.
    kwargs: dict[str, Any] = {"autocommit": True, "prepare_threshold": prepare_threshold()}
    async with await psycopg.AsyncConnection.connect(url, **kwargs) as claims, \
            await psycopg.AsyncConnection.connect(url, **kwargs) as writes:
        worker_id = await _register(claims, slots)
        floors = Floors()
        floors.set_listening(True)  # the worker's LISTEN is up through a drain
        pending: list[Outcome] = []
        arrived, room = asyncio.Event(), asyncio.Event()
        drained = False

        async def claim_loop() -> None:
            nonlocal drained
            while True:
                while len(pending) >= most_pending:
                    room.clear()
                    await room.wait()
                with database.lock_timeout(bound):
                    rows = await database.claim_jobs(claims, QUEUE, slots, worker_id, False,
                                                     floors=floors)
                if not rows:
                    break
                pending.extend(_outcomes(rows))
                arrived.set()
            drained = True
            arrived.set()

        async def write_loop() -> None:
            while pending or not drained:
                if not pending:
                    arrived.clear()
                    await arrived.wait()
                    continue
                batch = pending[:MAX_BATCH]
                with database.lock_timeout(bound):
                    await database.complete_many(writes, batch)
                del pending[:len(batch)]
                room.set()

        await asyncio.gather(claim_loop(), write_loop())


def ceiling_run(url: str, jobs: int, slots: int = SLOTS) -> float:
    """Fill ``jobs`` no-ops into ``url`` and drain them with the bare statements; jobs/s."""
    db.reset(url)
    db.fill(url, jobs, task=NOOP, queue=QUEUE)
    asyncio.run(_ceiling(url, slots))
    with psycopg.connect(url, autocommit=True) as connection:
        window = db.drain_window(connection)
    first, last = window["first_start"], window["last_finish"]
    if window["succeeded"] != jobs or first is None or last is None or last <= first:
        raise DrainError(f"the ceiling run finished {window['succeeded']} of {jobs} jobs")
    return float(window["succeeded"] / (last - first))


# --- the workload --------------------------------------------------------------------------

@contextmanager
def _fresh(admin: str, template: str, name: str) -> Iterator[str]:
    """A database ``name`` cloned from ``template``, dropped when the block ends."""
    db.drop(admin, name)
    with psycopg.connect(admin, autocommit=True) as connection:
        connection.execute(sql.SQL("CREATE DATABASE {} TEMPLATE {}").format(
            sql.Identifier(db.checked_name(name)), sql.Identifier(template)))
    try:
        yield db.url_for(admin, name)
    finally:
        db.drop(admin, name)


def ceiling_workload(admin: str, database: str, jobs: int, *, run_dir: Path,
                     slots: int = SLOTS, drains: int = DRAINS,
                     per_ceiling: int = DRAINS_PER_CEILING) -> CeilingResult:
    """Ceiling runs and ``drains`` core drains of ``jobs`` no-ops, taking turns (a ceiling,
    ``per_ceiling`` drains, ..., a ceiling), each in a fresh database ``<database>_ceiling_*``.
    A failed run is noted and the others go on."""
    result = CeilingResult(jobs=jobs, slots=slots)
    template = db.checked_name(f"{database}_ceiling_tpl")
    db.recreate(admin, template)  # migrated once; every run clones it
    count = 0

    def attempt(call: Callable[[str], None]) -> None:
        nonlocal count
        count += 1
        try:
            with _fresh(admin, template, f"{database}_ceiling_{count}") as url:
                call(url)
        except Exception as exc:
            result.failures.append(f"{type(exc).__name__}: {exc}")

    def ceiling(url: str) -> None:
        result.ceilings.append(ceiling_run(url, jobs, slots))
        print(f"[ceiling] raw SQL: {result.ceilings[-1]:,.0f} jobs/s", flush=True)

    def drain(url: str) -> None:
        turn = len(result.drains) + 1
        result.drains.append(core_drain(url, jobs, slots=slots, run_dir=run_dir,
                                        label=f"ceiling-drain-{turn:02d}"))
        print(f"[ceiling] worker drain {turn}: {result.drains[-1].rate:,.0f} jobs/s",
              flush=True)

    try:
        for turn in range(drains):
            if turn % per_ceiling == 0:
                attempt(ceiling)
            attempt(drain)
        attempt(ceiling)
    finally:
        db.drop(admin, template)
    return result


# --- the table's rows ----------------------------------------------------------------------

def rows(value: Any, jobs: int) -> list[Row]:
    """The two judged rows: the drains' median against the ceiling, and their spread."""
    if value is None:
        return []
    runs = -(-DRAINS // DRAINS_PER_CEILING) + 1
    label = (f"core `akadze worker --slots {SLOTS}` vs the raw SQL ceiling (`claim_jobs` "
             f"LIMIT {SLOTS} + batched `complete_jobs`, no worker): medians of {DRAINS} drains "
             f"and {runs} runs of {jobs:,} async no-ops, taking turns")
    spread = f"core `--slots {SLOTS}`: the slowest of the {DRAINS} drains / their median"
    reason = getattr(value, "reason", None)
    if reason is not None:
        return [Row(label, str(reason), target="≥ 90 %"),
                Row(spread, str(reason), target=f"≥ {SPREAD_TARGET:g}x")]
    assert isinstance(value, CeilingResult)
    failed = f"; {len(value.failures)} runs failed: {value.failures[0]}" if value.failures \
        else ""
    ours, ceiling, slowest = value.drain, value.ceiling, value.slowest
    row = Row(label, f"{rate(ours)} ({len(value.drains)} drains{failed})",
              f"ceiling: {rate(ceiling)} (" + ", ".join(
                  f"{figure:,.0f}" for figure in value.ceilings) + ")",
              target=f"≥ {CEILING_TARGET:.0%}".replace("%", " %"))
    if ours is not None and ceiling is not None:
        row.ratio = f"{ours / ceiling:.0%}"
        row.verdict = verdict(ours / ceiling >= CEILING_TARGET and not value.failures)
    found = [row]
    row = Row(spread, rate(slowest), f"median: {rate(ours)}",
              target=f"≥ {SPREAD_TARGET:g}x")
    if ours is not None and slowest is not None:
        row.ratio = times(slowest / ours)
        row.verdict = verdict(slowest / ours >= SPREAD_TARGET and not value.failures)
    found.append(row)
    return found
