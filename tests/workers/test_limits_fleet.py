"""Rate limits and per-key concurrency across real worker processes: judged by the
database's own timestamps (started_at, finished_at), never more starts than the limit in any
window and never more runs of a key at once than its max; and a SIGKILLed worker's slot is
given back by the rescue."""

from __future__ import annotations

import signal
from datetime import datetime, timedelta

import psycopg
import pytest

from akadze_core import App
from tests.workers.conftest import SpawnWorker
from tests.workers.support import wait_until
from tests.workers.worker_app import build_app

pytestmark = pytest.mark.slow


def most_in_any_window(starts: list[datetime], period: timedelta) -> int:
    """The most of ``starts`` in any half-open window [t, t + period): it is reached by a
    window starting at one of them."""
    starts = sorted(starts)
    best, low = 0, 0
    for high, moment in enumerate(starts):
        while starts[low] <= moment - period:
            low += 1
        best = max(best, high - low + 1)
    return best


def most_at_once(spans: list[tuple[datetime, datetime]]) -> int:
    """The most of ``spans`` (start, end) open at one instant."""
    events = sorted([(start, 1) for start, _ in spans] + [(end, -1) for _, end in spans],
                    key=lambda event: (event[0], event[1]))
    best = current = 0
    for _, step in events:
        current += step
        best = max(best, current)
    return best


def finished(db: psycopg.Connection, total: int) -> bool:
    row = db.execute("SELECT count(*) FROM akadze.jobs WHERE state = 'succeeded'").fetchone()
    return bool(row and row[0] == total)


def test_four_workers_never_start_more_than_the_rate_in_any_window(
    runs_db: psycopg.Connection, database_url: str, spawn_worker: SpawnWorker
) -> None:
    app: App = build_app(database_url)
    app.tasks["quick"].enqueue_many([{}] * 60)
    app.set_rate_limit("10/s", task="quick")
    workers = [spawn_worker(database_url, "--slots", "4") for _ in range(4)]
    wait_until(lambda: finished(runs_db, 60), 60, "60 quick jobs")
    starts = [row[0] for row in runs_db.execute("SELECT started_at FROM akadze.jobs")]
    assert most_in_any_window(starts, timedelta(seconds=1)) <= 10
    # The limit bound: 60 starts at 10 in any second span at least 5 seconds.
    assert max(starts) - min(starts) >= timedelta(seconds=5)
    # No job spent an attempt waiting.
    assert runs_db.execute("SELECT max(attempt) FROM akadze.jobs").fetchone() == (1,)
    assert all(worker.proc.poll() is None for worker in workers)
    app.close()


def test_a_key_never_runs_more_than_its_max_across_workers(
    runs_db: psycopg.Connection, database_url: str, spawn_worker: SpawnWorker
) -> None:
    app: App = build_app(database_url)
    sleep = app.tasks["sleep"]
    for _ in range(10):
        sleep.configure(concurrency_key="tenant-a", max_concurrency=2).enqueue(seconds=0.2)
    for _ in range(4):
        sleep.configure(concurrency_key="tenant-b").enqueue(seconds=0.2)
    for _ in range(3):
        spawn_worker(database_url, "--slots", "4")
    wait_until(lambda: finished(runs_db, 14), 60, "14 keyed jobs")
    for key, most in (("tenant-a", 2), ("tenant-b", 1)):
        spans = runs_db.execute("SELECT started_at, finished_at FROM akadze.jobs"
                                " WHERE meta ->> 'concurrency_key' = %s", [key]).fetchall()
        assert most_at_once(spans) == most, key


def test_a_sigkilled_workers_key_slot_is_freed_by_the_rescue(
    runs_db: psycopg.Connection, database_url: str, spawn_worker: SpawnWorker
) -> None:
    app: App = build_app(database_url)
    for _ in range(3):
        app.tasks["sleep"].configure(concurrency_key="only-one").enqueue(seconds=60)
    running = ("SELECT count(*), max(worker_id) FROM akadze.jobs"
               " WHERE state = 'running' AND meta ->> 'concurrency_key' = 'only-one'")
    first = spawn_worker(database_url, "--slots", "3")
    wait_until(lambda: runs_db.execute(running).fetchone()[0] == 1, 60, "a first run")
    killed_id = runs_db.execute(running).fetchone()[1]
    first.proc.send_signal(signal.SIGKILL)
    spawn_worker(database_url, "--slots", "3")

    def taken_over() -> bool:
        count, worker_id = runs_db.execute(running).fetchone()
        assert count <= 1
        return bool(count == 1 and worker_id != killed_id)

    wait_until(taken_over, 60, "the key's slot taken by the second worker")
    assert runs_db.execute(running).fetchone()[0] == 1
