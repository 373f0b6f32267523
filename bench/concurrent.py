"""Concurrent single enqueues: N client processes each calling ``.delay()`` (one transaction
per job) for a fixed time, beside the same N clients each doing the bare INSERT of the row
``.delay()`` writes (no NOTIFY). Many web processes calling ``.delay()`` at once look like
this: each commit waits for its WAL flush, and commits that notify also queue on the
cluster-wide lock Postgres takes for NOTIFY at commit."""

from __future__ import annotations

import multiprocessing
import statistics
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

import psycopg

from . import db
from .enqueue import _bare_insert, _delay_row

#: The client counts measured, in this order.
CLIENTS = (1, 4, 8)


@dataclass
class ConcurrentEnqueueResult:
    """Total jobs per second per client count, ``.delay()`` and the bare INSERT (medians of
    the rounds, the two sides taking turns)."""

    seconds: float
    rounds: int
    delay: dict[int, float] = field(default_factory=dict)
    bare: dict[int, float] = field(default_factory=dict)
    #: Insert notices heard per job of the ``.delay()`` turns (all of them together).
    notices: dict[int, float] = field(default_factory=dict)


def concurrent_enqueue(url: str, *, clients: tuple[int, ...] = CLIENTS, seconds: float = 1.0,
                       rounds: int = 4) -> ConcurrentEnqueueResult:
    """For each count of clients, ``rounds`` turns of ``.delay()`` and of the bare INSERT
    (their order swapped every round), each turn ``seconds`` long; the clients are
    processes with a connection each, started and warmed up once per count, and every
    turn starts on a barrier. The figures are the medians of the turns."""
    result = ConcurrentEnqueueResult(seconds=seconds, rounds=rounds)
    context = multiprocessing.get_context("spawn")
    turns = [side for n in range(rounds)
             for side in (("delay", "bare") if n % 2 == 0 else ("bare", "delay"))]
    for count in clients:
        db.reset(url)
        rates, jobs, notices = _run(context, url, turns, count, seconds)
        for side, target in (("delay", result.delay), ("bare", result.bare)):
            mine = [rate for turn, rate in zip(turns, rates, strict=True) if turn == side]
            target[count] = statistics.median(mine)
        result.notices[count] = notices / max(jobs, 1)
    db.reset(url)
    return result


def _run(context: Any, url: str, turns: list[str], count: int,
         seconds: float) -> tuple[list[float], int, int]:
    """Total jobs per second of each turn, ``count`` clients; and the jobs of the
    ``.delay()`` turns with the insert notices heard during them."""
    ready = context.Barrier(count + 1)
    done = context.Queue()
    workers = [context.Process(target=_client, args=(url, turns, seconds, ready, done))
               for _ in range(count)]
    for worker in workers:
        worker.start()
    rates = []
    jobs = notices = 0
    try:
        with psycopg.connect(url, autocommit=True) as listener:
            listener.execute("LISTEN akadze_jobs")
            for turn in turns:
                for _ in listener.notifies(timeout=0.2):  # the warm-up's, the last turn's
                    pass
                ready.wait(timeout=120)
                calls = [done.get(timeout=60 + seconds) for _ in workers]
                rates.append(sum(n for n, _ in calls) / max(spent for _, spent in calls))
                if turn == "delay":
                    jobs += sum(n for n, _ in calls)
                    notices += sum(1 for _ in listener.notifies(timeout=0.2))
    finally:
        for worker in workers:
            worker.join(timeout=10)
            if worker.is_alive():
                worker.kill()
    return rates, jobs, notices


def _client(url: str, turns: list[str], seconds: float, ready: Any, done: Any) -> None:
    """One client process: warm up, then for each turn wait for the others and enqueue
    until its time is up."""
    from .apps.celery_app import NOOP, make_app

    celery = make_app(url)
    task = celery.tasks[NOOP]
    with psycopg.connect(url, autocommit=True) as bare:
        queue, attempts, head, with_id = _delay_row(bare, task.delay(0).job_id)

        def bare_call(i: int) -> None:
            meta = f'{head}"task_id": "{uuid.uuid4()}"}}' if with_id else head
            _bare_insert(bare, i, {"args": [i], "kwargs": {}}, meta, queue, attempts)

        sides = {"delay": task.delay, "bare": bare_call}
        for call in sides.values():
            for i in range(20):
                call(i)
        for turn in turns:
            call = sides[turn]
            ready.wait(timeout=120)
            calls = 0
            started = time.perf_counter()
            end = started + seconds
            while True:
                for i in range(10):
                    call(i)
                calls += 10
                now = time.perf_counter()
                if now >= end:
                    break
            done.put((calls, now - started))
    celery.close()
