"""An operator's ``LOCK TABLE akadze.jobs`` (or a long migration) while a worker runs (issue
20, item 5): the worker's statements give up on the lock after ``lock_timeout`` and are
retried, so none of them sits in the lock queue for long and at most one per step waits at
a time; the worker says so in one line, keeps heartbeating, and finishes every job once the
lock is released."""

from __future__ import annotations

import time
from collections.abc import Iterator

import psycopg
import pytest

from akadze_core import App
from tests.workers.conftest import SpawnWorker
from tests.workers.support import WORKER_APPLICATION_NAME, wait_until, with_application_name
from tests.workers.worker_app import build_app

pytestmark = pytest.mark.slow

LOCK_TIMEOUT = 0.5
LOCKED_FOR = 4.0
#: The steps of a worker that touch akadze.jobs and may each wait on its lock at once: the
#: claim loop, the completer, and the rescue, orphan check and prune services (the
#: schedules service runs nothing without schedules; the heartbeat updates akadze.workers).
STEPS_ON_JOBS = 5


@pytest.fixture
def app(database_url: str) -> Iterator[App]:
    """The harness's App, used here only to enqueue."""
    application = build_app(database_url)
    yield application
    application.close()


def _waiting(db: psycopg.Connection) -> list[tuple[int, float]]:
    """(pid, seconds waited) of the worker's backends waiting on a lock now."""
    return db.execute(
        "SELECT pid, extract(epoch FROM clock_timestamp() - query_start)::float8 "
        "FROM pg_stat_activity WHERE application_name = %s AND wait_event_type = 'Lock'",
        (WORKER_APPLICATION_NAME,)).fetchall()


def test_a_locked_jobs_table_is_waited_out_with_one_line_and_no_pile_up(
    app: App, database_url: str, runs_db: psycopg.Connection, spawn_worker: SpawnWorker
) -> None:
    ids = [app.tasks["sleep"].enqueue(seconds=0.5) for _ in range(12)]
    worker = spawn_worker(with_application_name(database_url), "--slots", "2",
                          "--lock-timeout", str(LOCK_TIMEOUT))
    wait_until(lambda: runs_db.execute("SELECT count(*) FROM runs").fetchone()[0] >= 2,
               what="the first runs to start")

    locker = psycopg.connect(database_url)  # not autocommit: the lock lasts until rollback
    observer = psycopg.connect(database_url, autocommit=True)
    samples: list[list[tuple[int, float]]] = []
    beats: list[float] = []
    try:
        locker.execute("LOCK TABLE akadze.jobs IN ACCESS EXCLUSIVE MODE")
        locked_at = time.monotonic()
        while time.monotonic() - locked_at < LOCKED_FOR:
            samples.append(_waiting(observer))
            # Seconds since the worker's last heartbeat, on the database clock.
            beats.append(observer.execute(
                "SELECT extract(epoch FROM clock_timestamp() - max(heartbeat_at))::float8 "
                "FROM akadze.workers").fetchone()[0])
            time.sleep(0.05)
        done_before = observer.execute("SELECT count(*) FROM runs").fetchone()[0]
    finally:
        locker.rollback()
        locker.close()

    wait_until(lambda: observer.execute(
        "SELECT count(*) FROM akadze.jobs WHERE id = ANY(%s) AND state = 'succeeded'",
        (ids,)).fetchone()[0] == len(ids), timeout=30, what="every job to succeed")
    observer.close()
    log = worker.log()
    assert worker.proc.poll() is None, log
    # The worker met the lock: its statements did wait on it...
    assert any(samples), "no statement of the worker ever waited on the lock"
    # ... never more than one per step at once, and none for much longer than lock_timeout
    # (without it, the claim and the outcome write would wait the whole 4 s).
    assert max(len(sample) for sample in samples) <= STEPS_ON_JOBS, samples
    longest = max(seconds for sample in samples for _, seconds in sample)
    assert longest < LOCK_TIMEOUT + 0.5, (longest, samples)
    # Heartbeats went on (they update akadze.workers, which is not locked).
    assert max(beats) < 1.0, beats
    # One line for the lock and one for its release, not one per retry.
    assert log.count("akadze.jobs is locked by another session (LOCK TABLE or a migration?)") \
        == 1, log
    assert log.count("the lock is released:") == 1, log
    assert "no claims until a heartbeat succeeds" not in log, log
    assert "writing" not in log or "outcomes failed" not in log, log
    # No run started while the table was locked beyond those already running.
    assert done_before <= 4, done_before
    # Each job ran exactly once.
    counts = runs_db.execute("SELECT job_id, count(*) FROM runs GROUP BY job_id").fetchall()
    assert sorted(job_id for job_id, _ in counts) == sorted(ids)
    assert all(count == 1 for _, count in counts), counts
