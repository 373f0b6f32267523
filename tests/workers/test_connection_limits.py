"""A server whose ``max_connections`` others have used up: a starting
worker says so in a clear line and backs off (no tight loop, no crash), then starts and runs
jobs once connections are free; a running worker whose pool cannot grow goes on with the
connections it has; ``max_connections=`` bounds what a worker opens."""

from __future__ import annotations

import re
import time
from collections.abc import Iterator

import psycopg
import pytest

from tests.workers.conftest import SpawnWorker
from tests.workers.support import (
    RUNS_TABLE,
    WORKER_APPLICATION_NAME,
    PrivateCluster,
    runs,
    started_cluster,
    wait_until,
    with_application_name,
)
from tests.workers.worker_app import build_app

pytestmark = pytest.mark.slow

#: Small enough to fill; no slots kept for superusers, so the test's superuser fills them all.
MAX_CONNECTIONS = 12
NO_FREE = "the server has no free connections (too many clients already"


class SmallCluster(PrivateCluster):
    """A private cluster with room for only ``MAX_CONNECTIONS`` connections."""

    def _options(self) -> str:
        return (super()._options() + f" -c max_connections={MAX_CONNECTIONS}"
                " -c superuser_reserved_connections=0")


@pytest.fixture
def small_cluster() -> Iterator[SmallCluster]:
    """A started ``SmallCluster`` with the schema and the runs table."""
    with started_cluster(SmallCluster, RUNS_TABLE) as server:
        yield server


def fill(url: str) -> list[psycopg.Connection]:
    """Open connections until the server refuses with 53300 too_many_connections."""
    held: list[psycopg.Connection] = []
    while True:
        try:
            held.append(psycopg.connect(url, autocommit=True))
        except psycopg.OperationalError as exc:
            assert "too many clients already" in str(exc), exc
            return held
        assert len(held) <= MAX_CONNECTIONS, "the server never refused"


def release(held: list[psycopg.Connection], keep: int = 0) -> None:
    """Close all but ``keep`` of ``held``."""
    while len(held) > keep:
        held.pop().close()


def test_a_worker_started_on_a_full_server_backs_off_then_runs_jobs(
    small_cluster: SmallCluster, spawn_worker: SpawnWorker
) -> None:
    url = small_cluster.url()
    app = build_app(url)
    job_id = app.tasks["quick"].enqueue()
    app.close()
    held = fill(url)
    try:
        worker = spawn_worker(with_application_name(url), "--heartbeat-interval", "1",
                              "--heartbeat-ttl", "10")
        worker.wait_log(NO_FREE)
        time.sleep(4)
        log = worker.log()
        retries = log.count(NO_FREE)
        # Backoff, not a tight loop: 0.1 s doubling up to the heartbeat interval (1 s).
        assert 3 <= retries <= 12, log
        assert re.search(r"too many clients already: max_connections is reached\); "
                         r"retrying in \d+\.\ds$", log, re.MULTILINE), log
        assert "Traceback" not in log and worker.proc.poll() is None, log
    finally:
        release(held, keep=1)
    worker.wait_started(timeout=15)
    with held[0] as db:
        db.execute(RUNS_TABLE)
        wait_until(lambda: len(runs(db, job_id)) == 1, what="the job to run")
        wait_until(lambda: db.execute("SELECT state FROM akadze.jobs WHERE id = %s",
                                      (job_id,)).fetchone()[0] == "succeeded",
                   what="the job to succeed")
    assert worker.proc.poll() is None, worker.log()


def _worker_backends(db: psycopg.Connection) -> int:
    return db.execute("SELECT count(*) FROM pg_stat_activity WHERE application_name = %s",
                      (WORKER_APPLICATION_NAME,)).fetchone()[0]


def test_a_running_worker_whose_pool_cannot_grow_goes_on_with_what_it_has(
    small_cluster: SmallCluster, spawn_worker: SpawnWorker
) -> None:
    url = small_cluster.url()
    worker = spawn_worker(with_application_name(url), "--slots", "4",
                          "--max-connections", "4")
    worker.wait_started()
    app = build_app(url)
    observer = psycopg.connect(url, autocommit=True)
    peak = 0

    def all_succeeded(ids: list[int]) -> bool:
        nonlocal peak
        peak = max(peak, _worker_backends(observer))
        return observer.execute("SELECT count(*) FROM akadze.jobs WHERE id = ANY(%s) AND "
                                "state = 'succeeded'", (ids,)).fetchone()[0] == len(ids)

    try:
        # The budget: whatever the load, the worker holds at most 4 connections.
        ids = [app.tasks["nap"].enqueue(seconds=0.2) for _ in range(24)]
        wait_until(lambda: all_succeeded(ids), timeout=30, what="the first jobs")
        assert 2 <= peak <= 4, peak
        # The server full: the app keeps its one pooled connection, the worker what it has.
        held = fill(url)
        try:
            ids = [app.tasks["nap"].enqueue(seconds=0.2) for _ in range(24)]
            wait_until(lambda: all_succeeded(ids), timeout=30,
                       what="the jobs enqueued while the server was full")
        finally:
            release(held)
        log = worker.log()
        assert worker.proc.poll() is None and "Traceback" not in log, log
        assert peak <= 4, peak
    finally:
        observer.close()
        app.close()
