"""``akadze worker --processes N``: the worker claims and writes outcomes, children run bodies.

Each test starts the real ``akadze`` command on its own database and breaks what it owns:
a child killed mid-body, a body past its timeout, a stop signal.
"""

from __future__ import annotations

import os
import re
import signal
import time
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path

import psycopg
import pytest

from akadze_core import App, request_cancel_sync
from tests.helpers import children_of, job
from tests.workers.support import WorkerProcess, wait_until

pytestmark = pytest.mark.slow

APP = "tests.workers.process_app:app"


@pytest.fixture
def app(database_url: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[App]:
    """The test module's App, pointed at this test's database (only used to enqueue)."""
    monkeypatch.setenv("AKADZE_DATABASE_URL", database_url)
    from tests.workers import process_app

    process_app.app.set_database_url(database_url)
    yield process_app.app
    process_app.app.close()


@pytest.fixture
def start(database_url: str, tmp_path: Path) -> Iterator[object]:
    started: list[WorkerProcess] = []

    def spawn(*args: str) -> WorkerProcess:
        process = WorkerProcess(database_url, tmp_path / f"worker-{len(started)}.log",
                                ["worker", APP, *args], module="akadze_core.cli.main")
        started.append(process)
        process.wait_log("processes ready to run bodies", 60)
        return process

    yield spawn
    for process in started:
        process.stop()


def finished(db: psycopg.Connection, *ids: int) -> bool:
    return all(job(db, job_id)["state"] in ("succeeded", "failed") for job_id in ids)


def test_bodies_run_in_the_children_at_most_n_at_once(app: App, db: psycopg.Connection,
                                                      start) -> None:
    worker = start("--processes", "2")
    ids = [app.tasks["whoami"].enqueue(pause=0.3) for _ in range(6)]
    wait_until(lambda: finished(db, *ids), what="the jobs to finish", timeout=30)
    assert all(job(db, job_id)["state"] == "succeeded" for job_id in ids)
    bodies = [job(db, job_id)["result"] for job_id in ids]
    pids = {int(pid) for pid, _, _ in bodies}
    assert worker.pid not in pids
    assert pids <= children_of(worker.pid)
    assert len(pids) == 2
    # Two at a time: no three bodies overlap.
    for _, started, _ in bodies:
        overlapping = sum(1 for _, s, e in bodies if s <= started < e)
        assert overlapping <= 2, bodies


def test_a_child_killed_mid_body_spends_the_attempt_and_is_replaced(
        app: App, db: psycopg.Connection, start) -> None:
    worker = start("--processes", "1")
    before = children_of(worker.pid)
    job_id = app.tasks["die_once"].enqueue()
    wait_until(lambda: finished(db, job_id), what="the job to finish", timeout=30)
    row = job(db, job_id)
    assert row["state"] == "succeeded", row
    assert row["run_count"] == 2 and row["attempt"] == 2, row
    [error] = row["errors"]
    assert error["type"] == "ProcessLost", error
    assert "SIGKILL" in error["message"], error
    assert row["result"] in children_of(worker.pid)
    assert row["result"] not in before
    # The parent says which attempt the lost process cost, and that another follows.
    assert re.search(rf"job {job_id} die_once failed attempt 1/3 in [\d.]+s: ProcessLost: the "
                     r"process running the job \(pid \d+\) was ended by SIGKILL before it "
                     r"answered \(retry in [\d.]+s\)$", worker.log(), re.MULTILINE), worker.log()


def test_a_body_past_its_timeout_ends_with_its_process(app: App, db: psycopg.Connection,
                                                       start) -> None:
    worker = start("--processes", "1")
    [first_child] = children_of(worker.pid)
    job_id = app.tasks["hang"].configure(max_attempts=1).enqueue()
    wait_until(lambda: finished(db, job_id), what="the job to fail", timeout=30)
    row = job(db, job_id)
    assert row["state"] == "failed", row
    assert row["errors"][0]["type"] == "JobTimeout", row
    said = (rf"job {job_id} hang failed for good on attempt 1/1 in [\d.]+s: JobTimeout: "
            r"the task ran longer than its timeout of [\d.]+s; its process \(pid \d+\) "
            r"was ended \(no attempts left\)$")
    # The line is logged once the outcome is written, which the row showed first.
    wait_until(lambda: re.search(said, worker.log(), re.MULTILINE) is not None,
               what="the worker to log the timeout", timeout=10)
    wait_until(lambda: not os.path.exists(f"/proc/{first_child}"),
               what="the hung child to be gone")
    after = app.tasks["whoami"].enqueue()
    wait_until(lambda: finished(db, after), what="the next job", timeout=30)
    assert job(db, after)["result"][0] != first_child


def test_complete_tx_in_a_child_is_the_outcome(app: App, db: psycopg.Connection,
                                               start) -> None:
    start("--processes", "1")
    job_id = app.tasks["in_tx"].enqueue()
    wait_until(lambda: finished(db, job_id), what="the job to finish", timeout=30)
    row = job(db, job_id)
    assert row["state"] == "succeeded" and row["run_count"] == 1, row


def test_a_body_in_a_child_sees_its_job_as_claimed(app: App, db: psycopg.Connection,
                                                   start) -> None:
    # The row reaches the child as the values of the fields it reads: the Job built there
    # has the claim's every field, its times (one shared by two jobs) included.
    ids = [app.tasks["its_job"].enqueue() for _ in range(2)]
    db.execute("UPDATE akadze.jobs SET scheduled_at = now() - interval '1 minute', "
               "expires_at = now() + interval '1 hour' WHERE id = %s", (ids[0],))
    start("--processes", "1")
    wait_until(lambda: finished(db, *ids), what="the jobs to finish", timeout=30)
    for job_id in ids:
        row = job(db, job_id)
        seen = row["result"]
        assert row["state"] == "succeeded", row
        for name in ("scheduled_at", "created_at", "started_at", "expires_at"):
            value = seen[name]
            assert (None if value is None else datetime.fromisoformat(value)) == row[name]
        assert (seen["id"], seen["task"], seen["queue"], seen["state"], seen["attempt"],
                seen["run_count"], seen["max_attempts"], seen["cancel_requested"],
                seen["claim_token"]) == (
            job_id, "its_job", row["queue"], "running", 1, 1, row["max_attempts"], False,
            row["claim_token"])
        assert seen["time_types"] == ["datetime"] * 3 + [
            "datetime" if row["expires_at"] else "NoneType"]
    assert job(db, ids[0])["expires_at"] is not None


def test_sigterm_stops_the_children_too(app: App, db: psycopg.Connection, start) -> None:
    worker = start("--processes", "2")
    children = children_of(worker.pid)
    assert len(children) == 2
    worker.signal(signal.SIGTERM)
    code, _ = worker.wait_exit(30)
    assert code == 0, worker.log()
    wait_until(lambda: not any(os.path.exists(f"/proc/{pid}") for pid in children),
               what="the children to exit")


def test_jobs_claimed_ahead_of_a_process_that_dies_run_elsewhere_unspent(
        app: App, db: psycopg.Connection, start) -> None:
    # Queued before the worker starts, so its first claim takes all four (--slots 4) while
    # its one process runs the first: the other three are held ahead of the process.
    with psycopg.connect(db.info.dsn) as connection:
        crash = app.tasks["maybe_die"].configure(
            max_attempts=1, priority=-1).using(session=connection).enqueue(die=True)
        behind = [app.tasks["whoami"].using(session=connection).enqueue() for _ in range(3)]
    start("--processes", "1", "--slots", "4")
    wait_until(lambda: finished(db, crash, *behind), what="the jobs to end", timeout=30)
    assert job(db, crash)["errors"][0]["type"] == "ProcessLost"
    claimed_at = {job(db, job_id)["started_at"] for job_id in (crash, *behind)}
    assert len(claimed_at) == 1, claimed_at  # one claim statement: three were held ahead
    for job_id in behind:  # claimed ahead, they wait for the replacement: no attempt spent
        row = job(db, job_id)
        assert (row["state"], row["run_count"], row["errors"]) == ("succeeded", 1, []), row


def test_short_runs_let_the_worker_claim_ahead_until_a_body_runs_long(
        app: App, db: psycopg.Connection, start) -> None:
    start("--processes", "2", "--slots", "2")
    warm = [app.tasks["whoami"].enqueue() for _ in range(30)]
    wait_until(lambda: finished(db, *warm), what="the short jobs to finish", timeout=30)
    # Thirty short runs in a row: the next claim takes many more than the two slots.
    with psycopg.connect(db.info.dsn) as connection:
        long = app.tasks["hang_2s"].configure(max_attempts=1, priority=-1).using(
            session=connection).enqueue()
        short = [app.tasks["maybe_die"].using(session=connection).enqueue()
                 for _ in range(10)]
    wait_until(lambda: finished(db, *short), what="the jobs held ahead to run", timeout=30)
    assert len({job(db, job_id)["started_at"] for job_id in (long, *short)}) == 1
    time.sleep(0.05)
    # It has been running past SHORT: no more claiming ahead, one job per free slot.
    with psycopg.connect(db.info.dsn) as connection:
        later = [app.tasks["maybe_die"].using(session=connection).enqueue()
                 for _ in range(5)]
    wait_until(lambda: finished(db, *later), what="the later jobs to run", timeout=30)
    wait_until(lambda: finished(db, long), what="the long job to time out", timeout=30)
    assert job(db, long)["errors"][0]["type"] == "JobTimeout"
    rows = [job(db, job_id) for job_id in later]
    assert max(row["finished_at"] for row in rows) < job(db, long)["finished_at"]
    assert len({row["started_at"] for row in rows}) == 5, rows
    # Its process ended with it: claiming ahead waits for a new streak of short runs.
    with psycopg.connect(db.info.dsn) as connection:
        after = [app.tasks["maybe_die"].using(session=connection).enqueue() for _ in range(4)]
    wait_until(lambda: finished(db, *after), what="the jobs after it to run", timeout=30)
    assert len({job(db, job_id)["started_at"] for job_id in after}) >= 2


@pytest.mark.parametrize("how", ["cancel", "expiry"])
def test_a_job_claimed_ahead_of_a_busy_process_ends_cancelled_without_running(
        app: App, db: psycopg.Connection, start, tmp_path: Path, how: str) -> None:
    # Seed 003: a job cancelled or expired before it starts ends cancelled without running,
    # also when the worker holds it claimed ahead (--slots 2, one process busy).
    start("--processes", "1", "--slots", "2")
    release, mark = tmp_path / "release", tmp_path / "ran"
    first = app.tasks["hold"].enqueue(path=str(release))
    wait_until(lambda: job(db, first)["state"] == "running", what="the first job to start")
    touch = app.tasks["touch"]
    if how == "expiry":
        now = db.execute("SELECT now() + interval '1 second'").fetchone()[0]
        touch = touch.configure(expires_at=now)
    second = touch.enqueue(path=str(mark))
    wait_until(lambda: job(db, second)["state"] != "queued", what="the claim ahead")
    assert job(db, second)["state"] == "running"  # claimed, waiting for the busy process
    if how == "cancel":
        assert request_cancel_sync(db, second) is True
    else:
        wait_until(lambda: db.execute("SELECT expires_at <= now() FROM akadze.jobs "
                                      "WHERE id = %s", (second,)).fetchone()[0],
                   what="the expiry")
    time.sleep(0.3)  # the worker hears of it while the process is still busy
    release.touch()
    wait_until(lambda: finished(db, first) and job(db, second)["state"] != "running",
               what="both jobs to end", timeout=30)
    row = job(db, second)
    assert not mark.exists(), "the job claimed ahead must not run"
    assert (row["state"], row["attempt"], row["errors"], row["result"]) == (
        "cancelled", 0, [], None), row
    assert job(db, first)["state"] == "succeeded"


def test_async_bodies_in_a_child_share_one_pool_of_its_app(app: App, db: psycopg.Connection,
                                                           start) -> None:
    """Async bodies in a child used to run on a fresh event loop each (``asyncio.run``), and
    the App opens an async pool per loop: every body left a pool and its connection open
    behind it (the fleet soak filled max_connections). One loop per child: one pool."""
    worker = start("--processes", "1")
    ids = app.tasks["looks_itself_up"].enqueue_many([{}] * 40)
    wait_until(lambda: finished(db, *ids), timeout=60, what="the async bodies to finish")
    assert {job(db, i)["state"] for i in ids} == {"succeeded"}
    assert {job(db, i)["result"] for i in ids} == {"running"}
    held = db.execute("SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
                      " AND pid <> pg_backend_pid()").fetchone()[0]
    # The worker's pool (min(1, 16) + 6 at most) and listener, the child's one pooled
    # connection, and the test app's own.
    assert held <= 12, held
    assert worker.proc.poll() is None


def test_children_that_cannot_load_the_app_stop_the_worker_with_one_line(
        database_url: str, tmp_path: Path) -> None:
    """Children that die before they are ready end the start with the pool's one-line error,
    not a traceback from the bookkeeping of a child already gone, and are not replaced."""
    process = WorkerProcess(database_url, tmp_path / "worker.log",
                            ["worker", APP, "--processes", "2"], module="akadze_core.cli.main",
                            env={"PROCESS_APP_FAILS_IN_CHILD": "1"})
    try:
        code = process.proc.wait(timeout=90)
    finally:
        process.stop()
    log = process.log()
    assert code != 0, log
    assert "before it was ready" in log, log
    assert "KeyError" not in log, log
    assert "replacing it" not in log, log
