"""Citus mode under load and failure: claimers racing over thousands of jobs spread across
shards, and a worker process killed mid-job whose run another worker rescues."""

from __future__ import annotations

import signal
import threading
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from akadze_core import App, Task
from akadze_core.store.queries import query
from tests.helpers import job
from tests.workers.support import RUNS_TABLE, WorkerProcess, runs, wait_until

JOBS = 4000
CLAIMERS = 6


@pytest.fixture
def four_lanes(citus_db: psycopg.Connection) -> Iterator[None]:
    """One queue's jobs spread over four shards (akadze migrate --citus --lanes 4)."""
    citus_db.execute("UPDATE akadze.citus_settings SET lanes = 4")
    yield
    citus_db.execute("UPDATE akadze.citus_settings SET lanes = 1")


def test_concurrent_claims_never_take_a_job_twice(citus_app: App, citus_db: psycopg.Connection,
                                                  citus_url: str, four_lanes: None) -> None:
    @citus_app.task("bulk")
    async def bulk(n: int) -> None: ...

    for start in range(0, JOBS, 1000):
        bulk.enqueue_many([{"n": n} for n in range(start, start + 1000)])
    shards = citus_db.execute("SELECT count(DISTINCT shard) FROM akadze.jobs").fetchone()
    assert shards is not None and shards[0] >= 2
    claimed: list[list[int]] = [[] for _ in range(CLAIMERS)]
    failures: list[BaseException] = []

    def claimer(index: int) -> None:
        try:
            with psycopg.connect(citus_url, autocommit=True) as connection:
                while True:
                    rows = connection.execute(query("job_claim"), {
                        "lock_timeout": None, "queue": "default", "limit": 25,
                        "worker_id": index + 1, "floor_priority": [], "floor_at": [],
                        "floor_id": []}).fetchall()
                    if not rows:
                        return
                    claimed[index].extend(row[0] for row in rows)
        except BaseException as error:  # reported by the test thread
            failures.append(error)

    threads = [threading.Thread(target=claimer, args=(i,)) for i in range(CLAIMERS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(240)
    assert not failures, failures
    every = [job_id for ids in claimed for job_id in ids]
    duplicates = [job_id for job_id, times in Counter(every).items() if times > 1]
    assert duplicates == []
    assert len(every) == JOBS
    assert sum(1 for ids in claimed if ids) >= 2  # the claimers really raced
    left = citus_db.execute("SELECT count(*) FROM akadze.jobs WHERE state <> 'running'")
    assert left.fetchone() == (0,)


def test_sigkill_mid_job_is_rescued_and_run_again(citus_app: App, citus_db: psycopg.Connection,
                                                  citus_url: str, tmp_path: Path) -> None:
    citus_db.execute(RUNS_TABLE)
    citus_db.execute("TRUNCATE runs")
    job_id = sleep_task(citus_app).enqueue(seconds=2.0)
    heartbeat = ["--heartbeat-interval", "0.2", "--heartbeat-ttl", "1.5"]
    doomed = WorkerProcess(citus_url, tmp_path / "doomed.log", heartbeat,
                           module="tests.citus.worker_app")
    rescuer: WorkerProcess | None = None
    try:
        wait_until(lambda: len(runs(citus_db, job_id)) == 1, timeout=60,
                   what="the first run to start")
        doomed_worker = job(citus_db, job_id)["worker_id"]
        doomed.signal(signal.SIGKILL)
        assert doomed.wait_exit()[0] == -signal.SIGKILL
        rescuer = WorkerProcess(citus_url, tmp_path / "rescuer.log", heartbeat,
                                module="tests.citus.worker_app")
        wait_until(lambda: job(citus_db, job_id)["state"] == "succeeded", timeout=60,
                   what="the rescued job to succeed")
        row = job(citus_db, job_id)
        assert (row["run_count"], row["attempt"]) == (2, 2), row
        assert row["result"] == {"slept": 2.0}
        (lost,) = row["errors"]
        assert (lost["type"], lost["attempt"], lost["worker_id"]) == (
            "WorkerLost", 1, doomed_worker)
        assert [pid for _, pid in runs(citus_db, job_id)] == [doomed.pid, rescuer.pid]
    finally:
        doomed.stop()
        if rescuer is not None:
            rescuer.stop()
        citus_db.execute("DROP TABLE IF EXISTS runs")


def sleep_task(app: App) -> Task:
    """The worker app's "sleep" task, declared here for enqueueing (its body runs there)."""

    @app.task("sleep")
    async def sleep(seconds: float) -> dict[str, float]:
        return {"slept": seconds}

    return sleep
