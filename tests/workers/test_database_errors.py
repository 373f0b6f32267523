"""Database errors under a real worker process (seed 000, "Ошибки базы", behaviour of 0.6.0).

The server is a private cluster the test restarts, stops and starts. Transient errors are
logged and retried: the worker stays up and nothing is lost or run twice. Heartbeats failing
for longer than the TTL stop the worker with exit code 1. A database without the schema stops
it at once with one line saying to run ``akadze migrate``. The DSN password never shows.
"""

from __future__ import annotations

import signal
import time
from collections.abc import Iterator

import psycopg
import pytest

from akadze_core import App
from tests.helpers import job
from tests.workers.conftest import SpawnWorker
from tests.workers.support import (
    WORKER_APPLICATION_NAME,
    PrivateCluster,
    WorkerProcess,
    free_port,
    runs,
    wait_until,
    with_application_name,
)
from tests.workers.worker_app import build_app

pytestmark = pytest.mark.slow


@pytest.fixture
def worker_url(cluster: PrivateCluster) -> str:
    """The private cluster's URL, with a password and the worker's application_name."""
    return with_application_name(cluster.url())


@pytest.fixture
def app(cluster: PrivateCluster) -> Iterator[App]:
    """The harness's App on the private cluster, used here only to enqueue."""
    application = build_app(cluster.url())
    yield application
    application.close()


def connect(cluster: PrivateCluster) -> psycopg.Connection:
    """A fresh autocommit connection for assertions (the server may have restarted)."""
    return psycopg.connect(cluster.url(password=False), autocommit=True)


def state(cluster: PrivateCluster, job_id: int) -> str:
    """The job's state, read on a fresh connection."""
    with connect(cluster) as db:
        return str(job(db, job_id)["state"])


def assert_no_password(worker: WorkerProcess) -> None:
    """The DSN password appears nowhere in what the worker printed."""
    assert PrivateCluster.PASSWORD not in worker.log()


def stop_cleanly(worker: WorkerProcess) -> None:
    """SIGTERM the worker and expect a clean exit."""
    worker.signal(signal.SIGTERM)
    code, _ = worker.wait_exit()
    assert code == 0, worker.log()


def test_server_restart_mid_job(
    cluster: PrivateCluster, app: App, worker_url: str, spawn_worker: SpawnWorker
) -> None:
    job_id = app.tasks["sleep"].enqueue(seconds=3.0)
    worker = spawn_worker(worker_url, "--heartbeat-interval", "0.2", "--heartbeat-ttl", "3")
    with connect(cluster) as db:
        wait_until(lambda: len(runs(db, job_id)) == 1, what="the job to start")
    restarted = time.monotonic()
    cluster.restart()
    worker.wait_log("WARNING akadze.worker")  # it noticed, said so, and carries on

    app.close()  # the enqueuing pool's connections died with the server
    with connect(cluster) as db:
        wait_until(lambda: job(db, job_id)["state"] == "succeeded", timeout=20,
                   what="the job to succeed after the restart")
        row = job(db, job_id)
        assert row["result"] == {"slept": 3.0}
        assert row["run_count"] == 1 and row["attempt"] == 1 and row["errors"] == [], row
        assert len(runs(db, job_id)) == 1  # ran exactly once
        later = app.tasks["quick"].enqueue()
        wait_until(lambda: job(db, later)["state"] == "succeeded", timeout=15,
                   what="a job enqueued after the restart to succeed")
        assert len(runs(db, later)) == 1
    assert worker.proc.poll() is None, worker.log()
    print(f"recovered {time.monotonic() - restarted:.2f}s after the restart began")
    stop_cleanly(worker)
    assert_no_password(worker)


def test_server_down_longer_than_ttl_stops_the_worker_with_code_1(
    cluster: PrivateCluster, app: App, worker_url: str, spawn_worker: SpawnWorker
) -> None:
    ttl = 1.5
    # Long enough to outlast the ~TTL it takes the worker to give up, short enough to re-run.
    job_id = app.tasks["sleep"].enqueue(seconds=5.0)
    worker = spawn_worker(worker_url, "--heartbeat-interval", "0.2", "--heartbeat-ttl",
                          str(ttl))
    with connect(cluster) as db:
        wait_until(lambda: len(runs(db, job_id)) == 1, what="the job to start")
        (worker_id,) = db.execute("SELECT id FROM akadze.workers").fetchone()
    cluster.stop()
    stopped = time.monotonic()

    code, ended = worker.wait_exit(timeout=30)
    took = ended - stopped
    assert code == 1, worker.log()
    assert "no heartbeat for longer than heartbeat_ttl" in worker.log()
    # The operator's line, the worker's last: why it exits, and that a supervisor brings it
    # back (the harness prints a line of its own after it).
    last = [line for line in worker.log().splitlines() if "akadze.worker" in line][-1]
    assert "exiting with status 1: the database was unreachable for longer than " \
           f"heartbeat_ttl ({ttl:g}s)" in last, worker.log()
    assert "run it under a supervisor that restarts it" in last
    assert ttl <= took < ttl + 4, (took, worker.log())
    assert_no_password(worker)

    # The database is still down, so the job could not be handed back: it stays running
    # under the dead worker's row, and a live worker rescues it (spending the attempt).
    cluster.start()
    with connect(cluster) as db:
        row = job(db, job_id)
        assert row["state"] == "running" and row["worker_id"] == worker_id, row
        rescuer = spawn_worker(worker_url, "--heartbeat-interval", "0.2", "--heartbeat-ttl",
                               str(ttl))
        wait_until(lambda: job(db, job_id)["state"] == "succeeded", timeout=30,
                   what="the abandoned job to be rescued and succeed")
        row = job(db, job_id)
        assert [error["type"] for error in row["errors"]] == ["WorkerLost"], row
        assert row["run_count"] == 2 and row["attempt"] == 2, row
        assert [pid for _, pid in runs(db, job_id)] == [worker.pid, rescuer.pid]
    stop_cleanly(rescuer)


def test_database_down_at_start_is_retried_until_it_comes_up(
    cluster: PrivateCluster, worker_url: str, spawn_worker: SpawnWorker
) -> None:
    cluster.stop()
    worker = spawn_worker(worker_url, "--heartbeat-interval", "0.5", "--heartbeat-ttl", "3")
    worker.wait_log("cannot reach the database")
    time.sleep(2.5)
    assert worker.proc.poll() is None, worker.log()
    retries = worker.log().count("cannot reach the database")
    # Retried with backoff: a few warnings, not a hot loop.
    assert 2 <= retries <= 15, worker.log()
    assert "WARNING" in worker.log()
    assert ") started: queues" not in worker.log()

    cluster.start()
    worker.wait_started()
    app = build_app(cluster.url())
    try:
        job_id = app.tasks["quick"].enqueue()
        with connect(cluster) as db:
            wait_until(lambda: job(db, job_id)["state"] == "succeeded", timeout=15,
                       what="the job to succeed once the database is up")
    finally:
        app.close()
    stop_cleanly(worker)
    assert_no_password(worker)


def test_sigterm_while_waiting_for_the_database_exits_at_once(
    spawn_worker: SpawnWorker,
) -> None:
    nowhere = f"postgresql://postgres:{PrivateCluster.PASSWORD}@127.0.0.1:{free_port()}/postgres"
    worker = spawn_worker(nowhere, "--heartbeat-interval", "2", "--heartbeat-ttl", "10")
    worker.wait_log("cannot reach the database")
    sent = worker.signal(signal.SIGTERM)
    code, ended = worker.wait_exit(timeout=10)
    assert code == 0, worker.log()
    assert ended - sent < 1.5, worker.log()
    assert_no_password(worker)


def test_connections_killed_while_jobs_run(
    cluster: PrivateCluster, app: App, worker_url: str, spawn_worker: SpawnWorker
) -> None:
    ids = app.tasks["sleep"].enqueue_many([{"seconds": 0.4}] * 12)
    worker = spawn_worker(worker_url, "--slots", "3", "--heartbeat-interval", "0.2",
                          "--heartbeat-ttl", "3")
    with connect(cluster) as db:
        wait_until(lambda: db.execute("SELECT count(*) FROM runs").fetchone()[0] >= 1,
                   what="the first job to start")
        kills = []
        for _ in range(5):
            kills.append(db.execute(
                "SELECT count(*) FILTER (WHERE pg_terminate_backend(pid)) FROM pg_stat_activity"
                " WHERE application_name = %s AND pid <> pg_backend_pid()",
                (WORKER_APPLICATION_NAME,)).fetchone()[0])
            time.sleep(0.3)
        # The worker had connections open each time round, and lost them.
        assert kills[0] >= 1 and sum(kills) >= 5, kills
        wait_until(lambda: all(job(db, i)["state"] == "succeeded" for i in ids), timeout=30,
                   what="every job to succeed")
        for job_id in ids:
            row = job(db, job_id)
            assert row["attempt"] == 1 and row["errors"] == [], row
            assert len(runs(db, job_id)) == 1, runs(db, job_id)
    assert worker.proc.poll() is None, worker.log()
    stop_cleanly(worker)
    assert_no_password(worker)


def test_a_claim_whose_answer_was_lost_is_handed_back(
    cluster: PrivateCluster, app: App, worker_url: str, spawn_worker: SpawnWorker
) -> None:
    """A claim can commit and its answer die with the connection: the job is then running
    under a live worker that does not know it. After the connection error the worker hands
    such jobs back (unspent) instead of leaving them stuck while it keeps heartbeating."""
    worker = spawn_worker(worker_url, "--heartbeat-interval", "0.2", "--heartbeat-ttl", "3")
    worker.wait_started()
    job_id = app.tasks["quick"].enqueue()
    with connect(cluster) as db:
        wait_until(lambda: job(db, job_id)["state"] == "succeeded", what="a first job")
        (worker_id,) = db.execute("SELECT id FROM akadze.workers").fetchone()
        orphan = app.tasks["quick"].configure(delay=3600).enqueue()
        # What the claim query would have committed, had its answer been lost.
        db.execute("UPDATE akadze.jobs SET state = 'running', worker_id = %s,"
                   " run_count = run_count + 1, attempt = attempt + 1, started_at = now(),"
                   " scheduled_at = now() WHERE id = %s", (worker_id, orphan))
        killed = db.execute(
            "SELECT count(*) FILTER (WHERE pg_terminate_backend(pid)) FROM pg_stat_activity"
            " WHERE application_name = %s", (WORKER_APPLICATION_NAME,)).fetchone()[0]
        assert killed >= 1
        wait_until(lambda: job(db, orphan)["state"] == "succeeded", timeout=15,
                   what="the orphaned job to be handed back and run")
        row = job(db, orphan)
        assert row["run_count"] == 2 and row["attempt"] == 1 and row["errors"] == [], row
        assert runs(db, orphan) == [(2, worker.pid)]
    stop_cleanly(worker)


def test_missing_schema_exits_at_once_saying_to_migrate(
    empty_database_url: str, spawn_worker: SpawnWorker
) -> None:
    worker = spawn_worker(empty_database_url)
    code, ended = worker.wait_exit(timeout=15)
    assert code != 0
    assert ended - worker.started < 10
    lines = [line for line in worker.log().splitlines() if "akadze migrate" in line]
    assert len(lines) == 1, worker.log()
    assert lines[0].startswith("akadze: error: "), lines
