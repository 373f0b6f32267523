"""Failover to a promoted replica (issue 20, item 3).

A primary and a streaming replica (pg_basebackup, both private clusters); a worker process
and a producer in the test process run on one multi-host URL with
``target_session_attrs=read-write``. The primary is stopped and the replica promoted while
they run: the worker (same process, same worker id) and the App reconnect to the new primary
on their own, every job whose enqueue returned an id is on the new primary and succeeds,
jobs that were running at the stop finish under the same worker, and nothing runs twice.

The stop is ``pg_ctl stop -m fast``: a clean shutdown sends the connected standby all the WAL
up to the shutdown checkpoint, and waits for it to be flushed there, before the server
exits, so an asynchronous replica loses nothing acknowledged. A crash (``-m immediate``, a
host lost) can lose the last commits the replica had not received yet; see the README's
Guarantees.
"""

from __future__ import annotations

import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from akadze_core import App
from akadze_core.migrations import migrate
from tests.workers.support import (
    RUNS_TABLE,
    PrivateCluster,
    WorkerProcess,
    wait_until,
    with_application_name,
)
from tests.workers.worker_app import build_app

pytestmark = pytest.mark.slow

#: Long enough to ride out the failover (stop, a second with no primary, promotion, the
#: pool's reconnect backoff): a worker whose heartbeat fails for longer exits 1 by design.
HEARTBEAT_TTL = 10.0
#: Seconds with no writable server between the primary's stop and the promotion.
NO_PRIMARY = 1.0


def connect(cluster: PrivateCluster) -> psycopg.Connection:
    """A fresh autocommit connection of the test's own, to that server only."""
    return psycopg.connect(cluster.url(password=False), autocommit=True)


def caught_up(primary: PrivateCluster) -> bool:
    """The standby streams and has replayed everything the primary wrote so far."""
    with connect(primary) as connection:
        row = connection.execute(
            "SELECT state, replay_lsn >= pg_current_wal_lsn() FROM pg_stat_replication"
        ).fetchone()
    return row == ("streaming", True)


@pytest.fixture
def pair() -> Iterator[tuple[PrivateCluster, PrivateCluster]]:
    """A migrated primary with a runs table, and a streaming replica of it (caught up)."""
    clusters: list[PrivateCluster] = []
    try:
        try:
            primary = PrivateCluster()
            clusters.append(primary)
            primary.start()
            with connect(primary) as connection:
                migrate(connection)
                connection.execute(RUNS_TABLE)
            replica = PrivateCluster(replica_of=primary)
            clusters.append(replica)
            replica.start()
        except (RuntimeError, OSError, subprocess.SubprocessError) as exc:
            pytest.skip(f"cannot create a primary and a replica: {exc}")
        with connect(replica) as connection:
            assert connection.execute("SELECT pg_is_in_recovery()").fetchone() == (True,)
        wait_until(lambda: caught_up(primary), what="the replica to catch up")
        yield primary, replica
    finally:
        for cluster in clusters:
            cluster.destroy()


def multi_host_url(primary: PrivateCluster, replica: PrivateCluster) -> str:
    """Both servers, the writable one chosen at each connect (libpq's multi-host URL)."""
    return (f"postgresql://postgres@127.0.0.1:{primary.port},127.0.0.1:{replica.port}"
            "/postgres?target_session_attrs=read-write")


class Producer(threading.Thread):
    """Enqueues ``quick`` jobs back to back until stopped; keeps every id returned and
    every error raised (with the time it was raised)."""

    def __init__(self, app: App) -> None:
        super().__init__(name="producer", daemon=True)
        self.app = app
        self.ids: list[int] = []
        self.errors: list[BaseException] = []
        self.done = threading.Event()

    def run(self) -> None:
        quick = self.app.tasks["quick"]
        while not self.done.is_set():
            try:
                self.ids.append(quick.enqueue())
            except Exception as exc:  # noted; the producer goes on, as a service would
                self.errors.append(exc)
                time.sleep(0.05)
            time.sleep(0.005)

    def stop(self) -> None:
        self.done.set()
        self.join(30)
        assert not self.is_alive()


def running_started(primary: PrivateCluster, ids: list[int]) -> bool:
    with connect(primary) as connection:
        (started,), = connection.execute(
            "SELECT count(DISTINCT job_id) FROM runs WHERE job_id = ANY(%s)", (ids,))
    return started == len(ids)


def job_states(cluster: PrivateCluster) -> dict[int, str]:
    with connect(cluster) as connection:
        return dict(connection.execute("SELECT id, state FROM akadze.jobs").fetchall())


def test_workers_and_the_app_fail_over_to_the_promoted_replica_and_lose_nothing(
    pair: tuple[PrivateCluster, PrivateCluster], tmp_path: Path
) -> None:
    primary, replica = pair
    url = multi_host_url(primary, replica)
    worker = WorkerProcess(with_application_name(url), tmp_path / "worker.log",
                           ["--slots", "8", "--heartbeat-ttl", str(HEARTBEAT_TTL)])
    app = build_app(url)
    producer = Producer(app)
    try:
        worker.wait_started()
        with connect(primary) as connection:
            (worker_id,), = connection.execute("SELECT id FROM akadze.workers")
        producer.start()
        wait_until(lambda: len(producer.ids) >= 50, what="jobs before the failover")
        # Jobs running on the old primary when it stops: their outcome is written on the
        # new one, by the same worker.
        sleep = app.tasks["sleep"]
        long_ids = [sleep.enqueue(seconds=1.5) for _ in range(3)]
        wait_until(lambda: running_started(primary, long_ids), what="the long jobs to start")
        wait_until(lambda: caught_up(primary), what="the replica to catch up")
        before = len(producer.ids)

        primary.stop("fast")
        stopped = time.monotonic()
        time.sleep(NO_PRIMARY)  # nobody can write: the replica is read-only until promoted
        replica.promote()
        promoted = time.monotonic()

        wait_until(lambda: len(producer.ids) >= before + 50, timeout=30,
                   what="jobs enqueued after the promotion")
        producer.stop()
        ids = producer.ids
        wait_until(lambda: all(job_states(replica).get(job_id) == "succeeded"
                               for job_id in [*ids, *long_ids]),
                   timeout=30, what="every acknowledged job to succeed on the new primary")

        assert worker.proc.poll() is None, worker.log()  # no restart, no exit 1
        with connect(replica) as connection:
            states = dict(connection.execute("SELECT id, state FROM akadze.jobs").fetchall())
            runs: dict[int, list[tuple[int, int]]] = {}
            for job_id, run_count, pid in connection.execute(
                    "SELECT job_id, run_count, pid FROM runs ORDER BY started"):
                runs.setdefault(job_id, []).append((run_count, pid))
            workers = connection.execute("SELECT id FROM akadze.workers").fetchall()
    finally:
        producer.done.set()
        app.close()
        worker.stop()
    log = worker.log()
    # Every acknowledged enqueue reached the replica (a clean stop loses nothing) ...
    missing = [job_id for job_id in [*ids, *long_ids] if job_id not in states]
    assert missing == []
    # ... and each of its jobs ran exactly once, by this worker process. A task whose own
    # connection (the runs insert) failed in the gap spent an attempt before it recorded
    # anything, so its one recorded run may be a later run_count; the jobs that were
    # running at the stop finished in their first run, not rescued and run again.
    twice = {job_id: runs.get(job_id) for job_id in [*ids, *long_ids]
             if [pid for _, pid in runs.get(job_id, [])] != [worker.pid]}
    assert twice == {}
    assert [runs[job_id] for job_id in long_ids] == [[(1, worker.pid)]] * len(long_ids)
    assert "rescued" not in log and "declared dead" not in log, log
    assert workers == [(worker_id,)]  # the same worker row, still heartbeating
    # Enqueues during the gap waited for the new primary; one in flight at the stop may
    # raise ConnectionLost (its outcome unknown), nothing else.
    unexpected = [error for error in producer.errors
                  if type(error).__name__ != "ConnectionLost"]
    assert unexpected == [], unexpected
    assert promoted - stopped < HEARTBEAT_TTL
    report: dict[str, Any] = {"jobs": len(ids) + len(long_ids),
                              "errors": [repr(error) for error in producer.errors]}
    print(report)


def test_a_worker_on_a_read_only_server_stops_with_one_line_naming_target_session_attrs(
    pair: tuple[PrivateCluster, PrivateCluster], tmp_path: Path
) -> None:
    """Both hosts but no ``target_session_attrs``: with the primary down, libpq settles on
    the standby, whose first write (the worker's registration) is refused with 25006. That
    no wait fixes (the server may be a standby for good): one line saying what to set."""
    primary, replica = pair
    primary.stop("fast")
    url = (f"postgresql://postgres@127.0.0.1:{primary.port},127.0.0.1:{replica.port}"
           "/postgres")
    worker = WorkerProcess(url, tmp_path / "worker.log", [])
    try:
        code, _ = worker.wait_exit(timeout=30)
    finally:
        worker.stop()
    assert code == 1, worker.log()
    last = worker.log().strip().splitlines()[-2]  # before worker_app's own exit line
    assert last.startswith("akadze: error: the server is read-only"), worker.log()
    assert "target_session_attrs=read-write" in last
    app = build_app(url)
    try:
        with pytest.raises(psycopg.errors.ReadOnlySqlTransaction):  # an enqueue: 25006 too
            app.tasks["quick"].enqueue()
    finally:
        app.close()
