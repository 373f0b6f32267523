"""A real HA failover: Patroni 3.0 over etcd 3.4, three Postgres 15 nodes, all started by the
test on free loopback ports (tests/faults/patroni_support.py) and stopped by pid.

Two ``akadze worker`` processes and a producer thread run on one multi-host DSN
(``target_session_attrs=read-write``) through a planned switchover (Patroni's REST API) and
then a crash of the new leader (SIGKILL of its Patroni and its postmaster). With
``synchronous_mode: true`` a commit is acknowledged only once the synchronous standby has it,
and only that standby may be promoted, so nothing acknowledged is lost: every job whose
enqueue returned an id ends succeeded, every body runs once (``ha_runs``), and the outcome
each job kept is its own claim's (the run's claim token, returned by the body, equals the
token on the row). Skips with one line where patroni or etcd are missing.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from akadze_core import App
from akadze_core.store.migrations import migrate
from tests.faults.ha_app import HA_RUNS_TABLE
from tests.faults.patroni_support import PatroniCluster, missing
from tests.workers.support import PROJECT_ROOT, wait_until

pytestmark = pytest.mark.slow

#: Longer than the crash's failover (the leader key's TTL, 10 s, and a promotion): a worker
#: rides it out instead of being declared dead and rescued (which would run bodies again).
HEARTBEAT_TTL = 60


@pytest.fixture
def patroni() -> Iterator[PatroniCluster]:
    reason = missing()
    if reason is not None:
        pytest.skip(f"no Patroni cluster here: {reason}")
    cluster = PatroniCluster(synchronous=True)
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.destroy()


def connect(dsn: str, timeout: float = 30.0) -> psycopg.Connection:
    """A connection to the writable node, retried while there is none."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            return psycopg.connect(dsn, autocommit=True)
        except psycopg.OperationalError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)


def ha_app(dsn: str) -> App:
    """The cluster's database migrated, with the table the workers record runs in, and an
    App whose ``ha_record`` is the producer's handle (tests.faults.ha_app runs it)."""
    with connect(dsn) as connection:
        migrate(connection)
        connection.execute(HA_RUNS_TABLE)
    app = App(dsn)

    @app.task("ha_record")
    def ha_record() -> None:
        raise AssertionError("runs in the worker processes only")

    return app


class Worker:
    """One ``akadze worker tests.faults.ha_app:app`` subprocess, its output in a file."""

    def __init__(self, dsn: str, log: Path) -> None:
        self.log_path = log
        env = {**os.environ, "AKADZE_DATABASE_URL": dsn, "PYTHONUNBUFFERED": "1"}
        script = Path(sys.executable).with_name("akadze")
        command = [str(script)] if script.exists() else [sys.executable, "-m", "akadze_core.cli"]
        with open(log, "wb") as output:
            self.proc = subprocess.Popen(
                [*command, "--database-url", dsn, "worker", "tests.faults.ha_app:app",
                 "--slots", "4", "--heartbeat-interval", "1",
                 "--heartbeat-ttl", str(HEARTBEAT_TTL)],
                cwd=PROJECT_ROOT, env=env, stdin=subprocess.DEVNULL, stdout=output,
                stderr=subprocess.STDOUT)

    def log(self) -> str:
        return self.log_path.read_text("utf-8", errors="replace")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.send_signal(signal.SIGKILL)
                self.proc.wait(5)


class Producer(threading.Thread):
    """Enqueues ``ha_record`` jobs back to back until stopped; keeps every id returned and
    every error raised (an enqueue in flight at a failover may fail: its job is not counted
    as acknowledged, though it may exist)."""

    def __init__(self, app: App) -> None:
        super().__init__(name="producer", daemon=True)
        self.app = app
        self.ids: list[int] = []
        self.errors: list[BaseException] = []
        self.done = threading.Event()

    def run(self) -> None:
        task = self.app.tasks["ha_record"]
        while not self.done.is_set():
            try:
                self.ids.append(task.enqueue())
            except Exception as exc:
                self.errors.append(exc)
                time.sleep(0.05)
            time.sleep(0.01)

    def more(self, count: int, what: str) -> None:
        """Wait until ``count`` more enqueues returned an id."""
        target = len(self.ids) + count
        wait_until(lambda: len(self.ids) >= target, timeout=45, what=what)


def test_switchover_and_leader_crash_under_load_lose_nothing_and_run_nothing_twice(
    patroni: PatroniCluster, tmp_path: Path
) -> None:
    dsn = patroni.dsn()
    app = ha_app(dsn)
    workers = [Worker(dsn, tmp_path / f"worker{i}.log") for i in range(2)]
    producer = Producer(app)
    try:
        producer.start()
        producer.more(100, "jobs before the switchover")
        old, new = patroni.switchover()
        producer.more(100, "jobs after the switchover")
        patroni.wait_healthy()
        patroni.crash(new)
        crashed = time.monotonic()
        patroni.wait_leader_other_than(new)
        failover = time.monotonic() - crashed
        producer.more(100, "jobs after the crash")
        producer.done.set()
        producer.join(30)
        acknowledged = list(producer.ids)

        def settled() -> bool:
            with connect(dsn) as connection:
                (left,), = connection.execute(
                    "SELECT count(*) FROM akadze.jobs WHERE state <> 'succeeded'").fetchall()
            return left == 0
        wait_until(settled, timeout=60, what="every job to succeed")
        alive = [worker.proc.poll() is None for worker in workers]
        with connect(dsn) as connection:
            jobs = {row[0]: row[1:] for row in connection.execute(
                "SELECT id, state, result::bigint, claim_token, run_count,"
                " jsonb_path_query_array(errors, '$[*].type') FROM akadze.jobs")}
            runs: dict[int, list[tuple[int, int]]] = {}
            for job_id, run_count, token in connection.execute(
                    "SELECT job_id, run_count, claim_token FROM ha_runs"):
                runs.setdefault(job_id, []).append((run_count, token))
    finally:
        producer.done.set()
        for worker in workers:
            worker.stop()
        app.close()
    logs = "\n".join(worker.log()[-3000:] for worker in workers)
    assert old != new
    assert alive == [True, True], logs  # both rode out both failovers
    # 0 jobs lost: every acknowledged enqueue is there and succeeded (and so is every job an
    # enqueue that raised may have committed).
    assert [job_id for job_id in acknowledged if job_id not in jobs] == []
    assert {state for state, *_ in jobs.values()} == {"succeeded"}
    # No job ran twice, none was rescued, and each kept its own run's outcome: the token the
    # body returned is the one its claim wrote on the row.
    assert {job_id: found for job_id, found in runs.items() if len(found) != 1} == {}
    assert sorted(runs) == sorted(jobs)
    assert [job_id for job_id, (_, _, _, _, errors) in jobs.items() if errors] == []
    wrong = {job_id: (result, token, runs[job_id])
             for job_id, (_, result, token, run_count, _) in jobs.items()
             if result != token or runs[job_id] != [(run_count, token)]}
    assert wrong == {}
    assert failover < 45, failover
