"""Graceful stop of a real worker process (seed 000, "Остановка").

SIGTERM: no new claims, running jobs get up to shutdown_timeout, whatever is left goes back to
queued without spending its attempt, the worker row is deleted, exit code 0. A second SIGTERM
stops at once. A sync task's thread is not killed, but the process still exits.
"""

from __future__ import annotations

import signal
from collections.abc import Iterator

import psycopg
import pytest

from akadze_core import App
from tests.helpers import job
from tests.workers.conftest import SpawnWorker
from tests.workers.support import db_now, runs, wait_until
from tests.workers.worker_app import build_app

pytestmark = pytest.mark.slow


@pytest.fixture
def app(database_url: str) -> Iterator[App]:
    """The harness's App, used here only to enqueue."""
    application = build_app(database_url)
    yield application
    application.close()


def workers(db: psycopg.Connection) -> int:
    """How many worker rows exist."""
    return db.execute("SELECT count(*) FROM akadze.workers").fetchone()[0]


def assert_returned_unspent(db: psycopg.Connection, job_id: int, run_count: int = 1) -> None:
    """The job is back in the queue, attempt given back, its run still counted."""
    row = job(db, job_id)
    assert row["state"] == "queued", row
    assert row["attempt"] == 0, row
    assert row["run_count"] == run_count, row
    assert row["worker_id"] is None, row
    assert row["errors"] == [], row


def test_sigterm_waits_then_returns_unfinished_jobs_unspent(
    app: App, database_url: str, runs_db: psycopg.Connection, spawn_worker: SpawnWorker
) -> None:
    shutdown_timeout = 2.0
    short = app.tasks["sleep"].enqueue(seconds=1.0)
    long = app.tasks["sleep"].enqueue(seconds=60)
    worker = spawn_worker(database_url, "--slots", "2",
                          "--shutdown-timeout", str(shutdown_timeout))
    wait_until(lambda: len(runs(runs_db, short)) == 1 and len(runs(runs_db, long)) == 1,
               what="both jobs to start")
    assert workers(runs_db) == 1
    sent_at_db = db_now(runs_db)
    sent = worker.signal(signal.SIGTERM)

    code, ended = worker.wait_exit()
    took = ended - sent
    assert code == 0, worker.log()
    # It waited for the long job (about shutdown_timeout), and not much longer.
    assert shutdown_timeout - 0.1 <= took < shutdown_timeout + 3, (took, worker.log())

    finished = job(runs_db, short)
    assert finished["state"] == "succeeded", worker.log()
    assert finished["result"] == {"slept": 1.0}
    assert finished["finished_at"] > sent_at_db  # it really finished during the wait
    assert finished["attempt"] == 1

    assert_returned_unspent(runs_db, long)
    assert len(runs(runs_db, long)) == 1
    assert workers(runs_db) == 0
    assert "returned 1 unfinished jobs" in worker.log()


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT], ids=["TERM", "INT"])
def test_second_stop_signal_stops_at_once(
    app: App, database_url: str, runs_db: psycopg.Connection, spawn_worker: SpawnWorker,
    signum: int,
) -> None:
    long = app.tasks["sleep"].enqueue(seconds=60)
    worker = spawn_worker(database_url, "--shutdown-timeout", "20")
    wait_until(lambda: len(runs(runs_db, long)) == 1, what="the job to start")
    worker.signal(signum)
    worker.wait_log("stopping: no new claims")
    sent = worker.signal(signum)

    code, ended = worker.wait_exit()
    assert code == 0, worker.log()
    assert ended - sent < 3, (ended - sent, worker.log())
    assert "second stop request" in worker.log()
    assert_returned_unspent(runs_db, long)
    assert workers(runs_db) == 0


def test_sync_task_thread_is_left_running_but_the_process_exits(
    app: App, database_url: str, runs_db: psycopg.Connection, spawn_worker: SpawnWorker
) -> None:
    shutdown_timeout = 1.0
    blocked = app.tasks["sleep_sync"].enqueue(seconds=60)
    worker = spawn_worker(database_url, "--shutdown-timeout", str(shutdown_timeout))
    wait_until(lambda: len(runs(runs_db, blocked)) == 1, what="the sync job to start")
    sent = worker.signal(signal.SIGTERM)

    code, ended = worker.wait_exit()
    assert code == 0, worker.log()
    assert shutdown_timeout - 0.1 <= ended - sent < shutdown_timeout + 3, worker.log()
    # The thread was still inside the task body when the process left: not killed, not waited.
    assert f"sync tasks still running: [{blocked}]" in worker.log()
    assert_returned_unspent(runs_db, blocked)
    assert workers(runs_db) == 0


def test_worker_keeps_heartbeating_while_it_drains(
    app: App, database_url: str, runs_db: psycopg.Connection, spawn_worker: SpawnWorker
) -> None:
    """A shutdown_timeout longer than the TTL must not let another worker rescue (and run
    again) a job that is still finishing on the stopping worker."""
    job_id = app.tasks["sleep"].enqueue(seconds=3.5)
    stopping = spawn_worker(database_url, "--heartbeat-interval", "0.2", "--heartbeat-ttl",
                            "1.0", "--shutdown-timeout", "6")
    wait_until(lambda: len(runs(runs_db, job_id)) == 1, what="the job to start")
    other = spawn_worker(database_url, "--heartbeat-interval", "0.2", "--heartbeat-ttl", "1.0")
    other.wait_started()
    stopping.signal(signal.SIGTERM)

    code, _ = stopping.wait_exit()
    assert code == 0, stopping.log()
    row = job(runs_db, job_id)
    assert row["state"] == "succeeded", (row, stopping.log(), other.log())
    assert row["errors"] == [] and row["run_count"] == 1 and row["attempt"] == 1, row
    assert len(runs(runs_db, job_id)) == 1
    assert "rescued job" not in other.log()
