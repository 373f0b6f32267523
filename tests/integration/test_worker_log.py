"""What an in-process worker logs about runs that failed, on real Postgres.

One line per failed attempt, naming the error's type and message and what happens next; the
message redacted, on one line and bounded; an unknown task said whatever the outcome level.
(tests/integration/test_cli.py checks the same lines in a real ``akadze worker`` process.)
"""

from __future__ import annotations

import asyncio
import logging
import re
from datetime import timedelta

import psycopg
import pytest
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from akadze_core import App, Cancel, Retry, current
from akadze_core.model.outcomes import SUMMARY_LIMIT
from tests.helpers import job, run_worker_until
from tests.integration.outcome_helpers import fast_worker, ran, run_until

PASSWORD = "Hunter2Secret"


def job_lines(caplog: pytest.LogCaptureFixture, job_id: int) -> list[logging.LogRecord]:
    return [record for record in caplog.records
            if record.name == "akadze.worker" and f"job {job_id} " in record.getMessage()]


def only_line(caplog: pytest.LogCaptureFixture, job_id: int) -> str:
    records = job_lines(caplog, job_id)
    assert len(records) == 1, [record.getMessage() for record in records]
    return records[0].getMessage()


async def test_the_message_is_one_redacted_bounded_line(
        database_url: str, db: psycopg.Connection, caplog: pytest.LogCaptureFixture) -> None:
    # The server trusts every login, so a URL with a password connects: the app must keep
    # that password out of the log even when a task's error quotes it.
    url = make_conninfo(**{**conninfo_to_dict(database_url), "password": PASSWORD})
    app = App(url)

    @app.task("leaky", max_attempts=1)
    async def leaky() -> None:
        raise ConnectionError(f"login refused for {PASSWORD}\nand postgresql://u:pw9@h/db "
                              + "x" * 5000)

    caplog.set_level(logging.INFO, logger="akadze.worker")
    job_id = int(await leaky.enqueue_async())
    try:
        await run_until(app, ran(db, job_id))
    finally:
        await app.close_async()
    line = only_line(caplog, job_id)
    assert line.startswith(f"job {job_id} leaky failed for good on attempt 1/1 in ")
    assert ": ConnectionError: login refused for *** and postgresql://u:***@h/db xxx" in line
    assert line.endswith("\u2026 (no attempts left)")
    assert PASSWORD not in line and "pw9" not in line and "\n" not in line
    assert len(line) < SUMMARY_LIMIT + 100
    assert len(job(db, job_id)["errors"][0]["message"]) > 5000  # the job keeps it whole


async def test_timeout_result_not_json_retry_budget_and_cancel_read_sensibly(
        app: App, db: psycopg.Connection, caplog: pytest.LogCaptureFixture) -> None:
    @app.task("slow", max_attempts=1, timeout=0.05)
    async def slow() -> None:
        await asyncio.sleep(5)

    @app.task("odd", max_attempts=1)
    async def odd() -> object:
        return {1, 2}

    @app.task("more", max_attempts=2, backoff=lambda attempt: timedelta(seconds=30))
    async def more() -> None:
        if current().attempt == 1:
            raise Retry(delay=60, max_attempts=5, message="vendor busy")

    @app.task("quit")
    async def quit_() -> None:
        raise Cancel("order withdrawn")

    caplog.set_level(logging.INFO, logger="akadze.worker")
    ids = {name: int(await task.enqueue_async())
           for name, task in (("slow", slow), ("odd", odd), ("more", more), ("quit", quit_))}
    await run_until(app, lambda: all(ran(db, job_id)() for job_id in ids.values()))
    assert "slow failed for good on attempt 1/1 in " in only_line(caplog, ids["slow"])
    assert only_line(caplog, ids["slow"]).endswith(
        ": JobTimeout: the task ran longer than its timeout of 0.05s (no attempts left)")
    assert only_line(caplog, ids["odd"]).endswith(
        ": ResultNotJson: the task returned a value that is not JSON: Object of type set is "
        "not JSON serializable (no attempts left)")
    # Retry(max_attempts=5) raised the budget of 2: the line says 5.
    assert f"job {ids['more']} more failed attempt 1/5 in " in only_line(caplog, ids["more"])
    assert only_line(caplog, ids["more"]).endswith(": Retry: vendor busy (retry in 60.0s)")
    assert f"job {ids['quit']} quit cancelled on attempt 1/3 in " in only_line(caplog, ids["quit"])
    assert only_line(caplog, ids["quit"]).endswith(": Cancel: order withdrawn")


async def test_an_unknown_task_is_a_warning_even_with_outcome_lines_off(
        app: App, db: psycopg.Connection, caplog: pytest.LogCaptureFixture) -> None:
    other = App(app.database_url)
    other.task("elsewhere.only")(lambda: None)
    job_id = int(await other.tasks["elsewhere.only"].enqueue_async())
    await other.close_async()
    caplog.set_level(logging.INFO, logger="akadze.worker")
    await run_until(app, ran(db, job_id), outcome_log_level=logging.DEBUG)
    records = job_lines(caplog, job_id)
    assert [(record.levelname, record.getMessage()) for record in records] == [
        ("WARNING", f"job {job_id} elsewhere.only failed: NotRegistered: no task "
                    "'elsewhere.only' in this worker (is the module that defines it imported "
                    "by the app?)")]


async def test_on_unregistered_replaces_the_warning(
        app: App, db: psycopg.Connection, caplog: pytest.LogCaptureFixture) -> None:
    other = App(app.database_url)
    other.task("elsewhere.hooked")(lambda: None)
    job_id = int(await other.tasks["elsewhere.hooked"].enqueue_async())
    await other.close_async()
    heard: list[tuple[int, str]] = []
    worker = fast_worker(app)
    worker.on_unregistered = lambda job_id, task: heard.append((job_id, task))
    caplog.set_level(logging.INFO, logger="akadze.worker")
    assert await run_worker_until(worker, ran(db, job_id)) == 0
    assert heard == [(job_id, "elsewhere.hooked")]
    assert job_lines(caplog, job_id) == []
    assert job(db, job_id)["state"] == "failed"


async def test_a_fast_run_logs_its_real_duration(
        database_url: str, db: psycopg.Connection, caplog: pytest.LogCaptureFixture) -> None:
    app = App(database_url)

    @app.task("quick")
    async def quick() -> int:
        return 1

    @app.task("short")
    async def short() -> None:
        await asyncio.sleep(0.05)

    caplog.set_level(logging.INFO, logger="akadze.worker")
    ids = {"quick": int(await quick.enqueue_async()), "short": int(await short.enqueue_async())}
    try:
        await run_until(app, lambda: all(ran(db, job_id)() for job_id in ids.values()))
    finally:
        await app.close_async()
    took = {}
    for name, job_id in ids.items():
        found = re.search(r" succeeded in (\d+\.\d{6})s \(", only_line(caplog, job_id))
        assert found, only_line(caplog, job_id)
        took[name] = float(found.group(1))
    # Measured, not rounded away: a body that returns at once still takes some microseconds.
    # (Not compared with the other: on a loaded host the quick one may wait longer.)
    assert took["quick"] > 0 and took["short"] >= 0.05
