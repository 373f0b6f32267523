"""Lease and rescue between real worker processes (seed 000, "Аренда").

A worker killed mid-job stops heartbeating; a live worker returns its job to the queue after
the TTL, spending the attempt, and runs it again. A worker that keeps heartbeating is never
rescued, however long its job runs.
"""

from __future__ import annotations

import re
import signal
from collections.abc import Iterator
from datetime import datetime, timedelta

import psycopg
import pytest

from akadze_core import App
from tests.helpers import job
from tests.workers.conftest import SpawnWorker
from tests.workers.support import runs, wait_until
from tests.workers.worker_app import build_app

pytestmark = pytest.mark.slow

HEARTBEAT = ("--heartbeat-interval", "0.2", "--heartbeat-ttl", "1.5")
TTL = 1.5


@pytest.fixture
def app(database_url: str) -> Iterator[App]:
    """The harness's App, used here only to enqueue."""
    application = build_app(database_url)
    yield application
    application.close()


def worker_ids(db: psycopg.Connection) -> set[int]:
    """The ids of the registered workers."""
    return {row[0] for row in db.execute("SELECT id FROM akadze.workers").fetchall()}


def test_sigkill_mid_job_is_rescued_after_the_ttl_and_run_again(
    app: App, database_url: str, runs_db: psycopg.Connection, spawn_worker: SpawnWorker
) -> None:
    job_id = app.tasks["sleep"].enqueue(seconds=2.0)
    doomed = spawn_worker(database_url, *HEARTBEAT)
    wait_until(lambda: len(runs(runs_db, job_id)) == 1, what="the first run to start")
    (doomed_worker,) = worker_ids(runs_db)
    assert job(runs_db, job_id)["worker_id"] == doomed_worker
    doomed.signal(signal.SIGKILL)
    assert doomed.wait_exit()[0] == -signal.SIGKILL
    # Started after the kill: a start that takes longer than the 2 s run under load must
    # not let that run end (and the job succeed) before the worker dies.
    rescuer = spawn_worker(database_url, *HEARTBEAT)
    rescuer.wait_started()
    (last_beat,) = runs_db.execute("SELECT heartbeat_at FROM akadze.workers WHERE id = %s",
                                   (doomed_worker,)).fetchone()

    wait_until(lambda: job(runs_db, job_id)["state"] == "succeeded", timeout=20,
               what="the rescued job to succeed")
    row = job(runs_db, job_id)
    assert row["run_count"] == 2 and row["attempt"] == 2, row
    assert row["result"] == {"slept": 2.0}
    (lost,) = row["errors"]
    assert lost["type"] == "WorkerLost" and lost["attempt"] == 1, lost
    assert lost["worker_id"] == doomed_worker
    # Rescued only once the dead worker's last heartbeat was older than the TTL: never early.
    rescued_at = datetime.fromisoformat(lost["at"])
    assert rescued_at - last_beat >= timedelta(seconds=TTL), (rescued_at, last_beat)
    assert [pid for _, pid in runs(runs_db, job_id)] == [doomed.pid, rescuer.pid]
    assert [count for count, _ in runs(runs_db, job_id)] == [1, 2]
    assert doomed_worker not in worker_ids(runs_db)
    # What it lost and what happens next.
    assert re.search(rf"rescued job {job_id} from a dead worker: now queued \(sleep attempt 1/3 "
                     r"lost: WorkerLost: its worker stopped heartbeating; retry in [\d.]+s\)$",
                     rescuer.log(), re.MULTILINE), rescuer.log()


def test_a_heartbeating_worker_is_never_rescued(
    app: App, database_url: str, runs_db: psycopg.Connection, spawn_worker: SpawnWorker
) -> None:
    job_id = app.tasks["sleep"].enqueue(seconds=3 * TTL)
    owner = spawn_worker(database_url, *HEARTBEAT)
    wait_until(lambda: len(runs(runs_db, job_id)) == 1, what="the job to start")
    watcher = spawn_worker(database_url, *HEARTBEAT, "--slots", "2")
    watcher.wait_started()

    wait_until(lambda: job(runs_db, job_id)["state"] == "succeeded", timeout=20,
               what="the long job to succeed")
    row = job(runs_db, job_id)
    assert row["errors"] == [] and row["run_count"] == 1 and row["attempt"] == 1, row
    assert [pid for _, pid in runs(runs_db, job_id)] == [owner.pid]
    assert len(worker_ids(runs_db)) == 2  # both alive: neither judged the other dead
    assert "rescued" not in watcher.log() and "rescued" not in owner.log()
    for process in (owner, watcher):
        process.signal(signal.SIGTERM)
        assert process.wait_exit()[0] == 0
    assert worker_ids(runs_db) == set()
