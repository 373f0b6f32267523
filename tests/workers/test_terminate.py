"""``akadze jobs cancel --terminate``: the process pool ends the process running the body.

Each test starts the real ``akadze worker --processes`` command on its own database and
terminates a body blocked in ``time.sleep(60)`` through the real CLI.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from akadze_core import App, request_cancel_sync
from tests.helpers import children_of, job
from tests.workers.support import PROJECT_ROOT, WorkerProcess, wait_until

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
        if "--processes" in args:
            process.wait_log("processes ready to run bodies", 60)
        process.wait_started(60)
        return process

    yield spawn
    for process in started:
        process.stop()


def cli(database_url: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "akadze_core.cli", *args], cwd=PROJECT_ROOT,
                          env={**os.environ, "AKADZE_DATABASE_URL": database_url},
                          capture_output=True, text=True, timeout=60)


def body_pid(path: Path) -> int:
    wait_until(lambda: path.exists() and path.read_text() != "", what="the body to start",
               timeout=30)
    return int(path.read_text())


def ended(db: psycopg.Connection, job_id: int) -> bool:
    return job(db, job_id)["state"] in ("succeeded", "failed", "cancelled")


def test_terminate_ends_the_process_and_cancels_the_job_unspent(
        app: App, db: psycopg.Connection, database_url: str, start, tmp_path: Path) -> None:
    worker = start("--processes", "1")
    mark = tmp_path / "pid"
    job_id = app.tasks["stuck"].configure(max_attempts=1).enqueue(path=str(mark))
    pid = body_pid(mark)
    asked = time.monotonic()
    done = cli(database_url, "jobs", "cancel", str(job_id), "--terminate")
    assert done.returncode == 0, done.stderr
    assert "sends SIGTERM to the process running it" in done.stdout
    wait_until(lambda: ended(db, job_id), what="the job to end", timeout=30)
    assert time.monotonic() - asked < 20  # not the body's 60 s
    row = job(db, job_id)
    assert row["state"] == "cancelled", row
    assert row["cancel_signal"] == 15
    assert row["attempt"] == 0  # given back: the job was cancelled, not failed
    assert row["errors"][-1]["type"] == "Terminated", row["errors"]
    assert "was ended by SIGTERM" in row["errors"][-1]["message"]
    wait_until(lambda: not os.path.exists(f"/proc/{pid}"), what="the child to be gone")
    # The child was replaced: the next job runs in a new process.
    after = app.tasks["whoami"].enqueue()
    wait_until(lambda: ended(db, after), what="the next job", timeout=30)
    assert job(db, after)["state"] == "succeeded"
    assert job(db, after)["result"][0] != pid
    assert int(job(db, after)["result"][0]) in children_of(worker.pid)
    assert f"job {job_id}: terminate requested, sending SIGTERM to process {pid}" in worker.log()


def test_terminate_with_sigkill_by_number(app: App, db: psycopg.Connection,
                                          database_url: str, start, tmp_path: Path) -> None:
    start("--processes", "1")
    mark = tmp_path / "pid"
    job_id = app.tasks["stuck"].enqueue(path=str(mark))
    body_pid(mark)
    done = cli(database_url, "jobs", "cancel", str(job_id), "--terminate", "--signal", "9")
    assert done.returncode == 0, done.stderr
    wait_until(lambda: ended(db, job_id), what="the job to end", timeout=30)
    row = job(db, job_id)
    assert row["state"] == "cancelled" and row["attempt"] == 0, row
    assert "was ended by SIGKILL" in row["errors"][-1]["message"]


def test_a_body_that_survives_the_signal_decides_its_outcome(
        app: App, db: psycopg.Connection, database_url: str, start, tmp_path: Path) -> None:
    start("--processes", "1")
    returns, raises = tmp_path / "returns", tmp_path / "raises"
    first = app.tasks["shrugs_off_sigterm"].enqueue(path=str(returns))
    returned_in = body_pid(returns)
    assert cli(database_url, "jobs", "cancel", str(first), "--terminate").returncode == 0
    wait_until(lambda: ended(db, first), what="the first job to end", timeout=30)
    assert job(db, first)["state"] == "succeeded"  # returned a value: it wins (seed 003)
    assert job(db, first)["result"] == "finished anyway"
    second = app.tasks["shrugs_off_sigterm"].enqueue(path=str(raises), then="raise")
    assert body_pid(raises) == returned_in  # the same process: it was not replaced
    assert cli(database_url, "jobs", "cancel", str(second), "--terminate").returncode == 0
    wait_until(lambda: ended(db, second), what="the second job to end", timeout=30)
    row = job(db, second)
    assert row["state"] == "cancelled" and row["attempt"] == 0, row
    assert row["errors"][-1]["type"] == "RuntimeError"


def test_terminate_on_a_threads_worker_is_a_cancel_request(
        app: App, db: psycopg.Connection, database_url: str, start, tmp_path: Path) -> None:
    worker = start()
    mark = tmp_path / "pid"
    job_id = app.tasks["stuck"].enqueue(path=str(mark))
    assert body_pid(mark) == worker.pid  # a thread of the worker process itself
    assert cli(database_url, "jobs", "cancel", str(job_id), "--terminate").returncode == 0
    worker.wait_log(f"job {job_id}: terminate requested, but this worker runs bodies in "
                    "threads, which cannot be stopped")
    time.sleep(0.5)
    assert job(db, job_id)["state"] == "running"  # no signal reached it
    assert worker.proc.poll() is None


def test_a_bad_signal_is_refused(database_url: str) -> None:
    done = cli(database_url, "jobs", "cancel", "1", "--terminate", "--signal", "SIGNOPE")
    assert done.returncode == 2
    assert "unknown signal name 'SIGNOPE'" in done.stderr


@pytest.mark.parametrize("pause", [1.0, 0.0])
def test_a_job_sent_behind_a_running_one_is_terminated_as_it_starts(
        app: App, db: psycopg.Connection, start, pause: float) -> None:
    # Short runs let the pool send jobs into a busy process's pipe (DEPTH): a terminate
    # request for one of those reaches its process as it starts, as Celery terminates a
    # task at its acceptance; the job behind it was never started and runs elsewhere.
    worker = start("--processes", "1", "--slots", "4", "--log-level", "debug")
    for _ in range(6):  # one at a time: whoami becomes a short task
        warm = app.tasks["whoami"].enqueue()
        wait_until(lambda warm=warm: ended(db, warm), what="a warm-up job", timeout=30)
    with psycopg.connect(db.info.dsn) as connection:
        head = app.tasks["whoami"].configure(priority=-1).using(session=connection).enqueue(
            pause=2.0)
        # Still classed short (its task's last runs were): with a pause the signal lands
        # in its sleep; without, it may end before the signal lands.
        doomed = app.tasks["whoami"].using(session=connection).enqueue(pause=pause)
        after = app.tasks["whoami"].using(session=connection).enqueue()
    wait_until(lambda: job(db, after)["state"] == "running", what="the claim", timeout=30)
    worker.wait_log(f"job {doomed} sent to process")  # into the pipe, behind the head
    assert request_cancel_sync(db, doomed, terminate=True) is True
    wait_until(lambda: all(ended(db, job_id) for job_id in (head, doomed, after)),
               what="the three jobs to end", timeout=30)
    assert job(db, head)["state"] == "succeeded"
    row = job(db, doomed)
    if pause or row["state"] != "succeeded":
        assert (row["state"], row["attempt"], [e["type"] for e in row["errors"]]) == (
            "cancelled", 0, ["Terminated"]), row
    # Either way the job behind it is not the signal's victim: it runs once, unspent.
    row = job(db, after)
    assert (row["state"], row["run_count"], row["attempt"], row["errors"]) == (
        "succeeded", 1, 1, []), row
    if pause:
        assert row["result"][0] != job(db, head)["result"][0]  # the replacement ran it


def test_a_missed_terminate_notification_is_found_by_the_heartbeat(
        app: App, db: psycopg.Connection, start, tmp_path: Path) -> None:
    # The request written without its NOTIFY (as if the LISTEN connection was down when it
    # came): the worker's heartbeat check finds it.
    start("--processes", "1", "--heartbeat-interval", "0.5")
    mark = tmp_path / "pid"
    job_id = app.tasks["stuck"].enqueue(path=str(mark))
    pid = body_pid(mark)
    db.execute("UPDATE akadze.jobs SET cancel_requested = true, cancel_signal = 15 "
               "WHERE id = %s", (job_id,))
    wait_until(lambda: ended(db, job_id), what="the job to end", timeout=20)
    row = job(db, job_id)
    assert (row["state"], row["attempt"], row["errors"][-1]["type"]) == (
        "cancelled", 0, "Terminated"), row
    wait_until(lambda: gone(pid), what="the child to be gone")


def gone(pid: int) -> bool:
    return not os.path.exists(f"/proc/{pid}")
