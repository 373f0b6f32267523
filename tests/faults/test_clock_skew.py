"""Workers whose clock is off by ten minutes.

SPEC: "Only the database clock (now() / clock_timestamp()) decides time; never the worker's
clock." The worker processes run with ``AKADZE_FAKE_CLOCK_OFFSET`` (tests/faults/fake_clock.py:
time.time and datetime.now shifted, monotonic untouched, as on a host whose clock drifted).
A job due in five minutes does not run early, a job expiring in five minutes is not cancelled
early, and a worker that is still heartbeating is never judged dead by a skewed one.
"""

from __future__ import annotations

import re
import signal
import time
from datetime import timedelta

import psycopg
import pytest

from akadze_core import App
from tests.faults.conftest import SpawnWorker
from tests.faults.fake_clock import ENV_VAR
from tests.faults.support import error_types, job, wait_until
from tests.workers.support import WorkerProcess, db_now, runs

pytestmark = pytest.mark.slow

TTL = 1.5
FAST = ("--heartbeat-interval", "0.2", "--heartbeat-ttl", str(TTL), "--poll-interval", "0.1")
TEN_MINUTES = 600.0


def skewed(spawn_worker: SpawnWorker, url: str, offset: float, *args: str) -> WorkerProcess:
    """A worker whose wall clock is ``offset`` seconds off; checks that it really is."""
    worker = spawn_worker(url, *FAST, *args, env={ENV_VAR: str(offset)})
    worker.wait_log("fake clock offset")
    match = re.search(r"\(epoch (\d+\.\d+)\)", worker.log())
    assert match, worker.log()
    assert abs(float(match[1]) - time.time() - offset) < 30, worker.log()
    worker.wait_started()
    return worker


@pytest.mark.parametrize("offset", [TEN_MINUTES, -TEN_MINUTES], ids=["ahead", "behind"])
def test_a_skewed_worker_runs_nothing_early_and_expires_nothing_early(
    app: App, database_url: str, runs_db: psycopg.Connection, spawn_worker: SpawnWorker,
    offset: float,
) -> None:
    later = app.tasks["quick"].configure(delay=timedelta(minutes=5)).enqueue()
    expires = db_now(runs_db) + timedelta(minutes=5)
    expiring = app.tasks["quick"].configure(expires_at=expires).enqueue()
    worker = skewed(spawn_worker, database_url, offset, "--slots", "2")

    wait_until(lambda: job(runs_db, expiring)["state"] == "succeeded",
               what="the job that expires in five minutes to run")
    # Many claim rounds later (each canary needs one), the future job is still waiting.
    for _ in range(3):
        canary = app.tasks["quick"].enqueue()
        wait_until(lambda c=canary: job(runs_db, c)["state"] == "succeeded", what="a canary")
    row = job(runs_db, later)
    assert (row["state"], row["run_count"], row["attempt"]) == ("queued", 0, 0), row
    assert runs(runs_db, later) == []
    assert job(runs_db, expiring)["result"] == "ok"
    worker.signal(signal.SIGTERM)
    assert worker.wait_exit()[0] == 0, worker.log()


def test_a_skewed_worker_never_rescues_a_live_workers_job(
    app: App, database_url: str, runs_db: psycopg.Connection, spawn_worker: SpawnWorker
) -> None:
    """The owner's clock is ten minutes behind, the watcher's ten minutes ahead: twenty
    minutes apart, far more than the 1 s TTL. The owner's job runs three TTLs and is never
    rescued."""
    job_id = app.tasks["sleep"].enqueue(seconds=3 * TTL)
    owner = skewed(spawn_worker, database_url, -TEN_MINUTES)
    wait_until(lambda: len(runs(runs_db, job_id)) == 1, what="the job to start")
    watcher = skewed(spawn_worker, database_url, TEN_MINUTES, "--slots", "2")

    wait_until(lambda: job(runs_db, job_id)["state"] == "succeeded", timeout=20,
               what="the long job to succeed")
    row = job(runs_db, job_id)
    assert (row["run_count"], row["attempt"], error_types(row)) == (1, 1, []), row
    assert [pid for _, pid in runs(runs_db, job_id)] == [owner.pid]
    assert "rescued" not in watcher.log() and "declared dead" not in owner.log()
    assert runs_db.execute("SELECT count(*) FROM akadze.workers").fetchone() == (2,)
    for worker in (owner, watcher):
        worker.signal(signal.SIGTERM)
        assert worker.wait_exit()[0] == 0, worker.log()
