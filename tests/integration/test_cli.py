"""The ``akadze`` command line on a real Postgres.

The quick commands run in-process through click's CliRunner; ``akadze worker`` runs as a real
subprocess (``python -m akadze_core.cli``) because it installs signal handlers and leaves
with ``os._exit``.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import psycopg
import pytest
from click.testing import CliRunner, Result
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from akadze_core import App
from akadze_core.cli.main import cli
from akadze_core.model.dsn import redact
from tests.helpers import job, wait_for

PROJECT_ROOT = Path(__file__).resolve().parents[2]
APP_MODULE = "tests.integration.cli_app"
PASSWORD = "s3cretPW"
DEAD_URL = f"postgresql://postgres:{PASSWORD}@127.0.0.1:1/x"
LOG_LINE = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} [A-Z]+ [\w.]+: ")
FAST = ["--poll-interval", "0.1", "--heartbeat-interval", "0.5", "--heartbeat-ttl", "5"]


def run(*args: str, url: str | None = None) -> Result:
    """``akadze ARGS`` in-process, with AKADZE_DATABASE_URL set to ``url``."""
    return CliRunner().invoke(cli, list(args), env={"AKADZE_DATABASE_URL": url})


def one_error_line(result: Result) -> str:
    """The single stderr line of a failed command (asserts there is exactly one)."""
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("akadze: error: "), lines[0]
    assert "Traceback" not in result.output
    return lines[0]


def with_password(url: str, password: str = PASSWORD, **changes: Any) -> str:
    """``url`` with a password (and other connection parameters) set."""
    return make_conninfo(**{**conninfo_to_dict(url), "password": password, **changes})


@pytest.fixture
def enqueue(database_url: str) -> Iterator[Any]:
    """``enqueue(task, queue="default", **args)`` -> job id, through a real App."""
    app = App(database_url)

    def enqueue_job(task: str, queue: str = "default", **args: Any) -> int:
        if task not in app.tasks:
            app.task(task)(lambda **kwargs: None)
        return int(app.tasks[task].configure(queue=queue).enqueue(**args))

    yield enqueue_job
    app.close()


# --- migrate -------------------------------------------------------------------------------------

def test_migrate_applies_the_schema_and_is_idempotent(empty_database_url: str) -> None:
    first = run("migrate", url=empty_database_url)
    assert first.exit_code == 0, first.output
    assert "applied migrations 1" in first.stdout
    with psycopg.connect(empty_database_url) as connection:
        assert connection.execute("SELECT count(*) FROM akadze.jobs").fetchone() == (0,)

    # Which database is named, without the password (trust authentication ignores it).
    with_password = make_conninfo(empty_database_url, password="Migr8-pw")
    second = run("migrate", url=with_password)
    assert second.exit_code == 0, second.output
    assert second.stdout.endswith(f" in {redact(with_password)}: nothing to do\n")
    assert "Migr8-pw" not in second.output
    assert run("jobs", "list", url=empty_database_url).exit_code == 0


def test_migrate_says_it_re_applied_a_changed_functions_file(database_url: str) -> None:
    with psycopg.connect(database_url, autocommit=True) as connection:
        connection.execute("UPDATE akadze.repeatable_migrations SET checksum = 'older'")
    result = run("migrate", url=database_url)
    assert result.exit_code == 0, result.output
    assert result.stdout.startswith("re-applied functions.sql: schema at version"), result.stdout
    assert "nothing to do" in run("migrate", url=database_url).stdout


def test_database_url_option_beats_the_environment(
        database_url: str, empty_database_url: str) -> None:
    result = CliRunner().invoke(cli, ["--database-url", empty_database_url, "migrate"],
                                env={"AKADZE_DATABASE_URL": database_url})
    assert result.exit_code == 0, result.output
    assert "applied migrations" in result.stdout  # the template database had the schema


# --- jobs ----------------------------------------------------------------------------------------

def test_jobs_list(database_url: str, enqueue: Any) -> None:
    first = enqueue("mail.send", to="ada")
    second = enqueue("mail.send", queue="bulk", to="bob")
    third = enqueue("report.build", year=2024)

    result = run("jobs", "list", "--json", url=database_url)
    assert result.exit_code == 0, result.output
    listed = json.loads(result.stdout)
    assert [item["id"] for item in listed] == [third, second, first]  # newest first
    assert listed[1]["task"] == "mail.send"
    assert listed[1]["queue"] == "bulk"
    assert listed[1]["args"] == {"to": "bob"}
    assert listed[1]["state"] == "queued"

    def ids(*args: str) -> list[int]:
        filtered = run("jobs", "list", "--json", *args, url=database_url)
        assert filtered.exit_code == 0, filtered.output
        return [item["id"] for item in json.loads(filtered.stdout)]

    assert ids("--task", "mail.send") == [second, first]
    assert ids("--queue", "bulk") == [second]
    assert ids("--limit", "1") == [third]
    assert ids("--state", "running") == []

    human = run("jobs", "list", url=database_url)
    assert human.exit_code == 0, human.output
    header, *rows = human.stdout.splitlines()
    assert header.split() == ["ID", "QUEUE", "TASK", "STATE", "ATTEMPT", "SCHEDULED_AT",
                              "FINISHED_AT"]
    assert [row.split()[:5] for row in rows] == [
        [str(third), "default", "report.build", "queued", "0/3"],
        [str(second), "bulk", "mail.send", "queued", "0/3"],
        [str(first), "default", "mail.send", "queued", "0/3"],
    ]
    # Aligned: every row's STATE column starts where the header's does.
    column = header.index("STATE")
    assert all(row[column:].startswith("queued") for row in rows)

    bad = run("jobs", "list", "--state", "sleeping", url=database_url)
    assert bad.exit_code == 2
    assert "--state" in one_error_line(bad)


def test_jobs_show(database_url: str, db: psycopg.Connection, enqueue: Any) -> None:
    job_id = enqueue("mail.send", to="ada", body="hi")
    db.execute("UPDATE akadze.jobs SET state = 'failed', attempt = 3, finished_at = now(),"
               " errors = '[{\"attempt\": 3, \"type\": \"ValueError\", \"message\": \"boom\","
               " \"traceback\": \"Traceback...\\nValueError: boom\"}]' WHERE id = %s",
               (job_id,))

    result = run("jobs", "show", str(job_id), "--json", url=database_url)
    assert result.exit_code == 0, result.output
    shown = json.loads(result.stdout)
    expected = {"id": job_id, "task": "mail.send", "queue": "default", "state": "failed",
                "attempt": 3, "max_attempts": 3, "run_count": 0,
                "args": {"to": "ada", "body": "hi"}, "result": None, "expires_at": None,
                "cancel_requested": False}
    assert {name: shown[name] for name in expected} == expected
    assert shown["errors"][0]["message"] == "boom"
    row = job(db, job_id)
    assert datetime.fromisoformat(shown["scheduled_at"]) == row["scheduled_at"]
    assert datetime.fromisoformat(shown["finished_at"]) == row["finished_at"]

    human = run("jobs", "show", str(job_id), url=database_url)
    assert human.exit_code == 0, human.output
    assert re.search(r"^state\s+failed$", human.stdout, re.MULTILINE)
    assert re.search(r'^args\s+\{"to": "ada", "body": "hi"\}$', human.stdout, re.MULTILINE)
    assert "attempt 3" in human.stdout and "ValueError: boom" in human.stdout

    missing = run("jobs", "show", str(job_id + 1000), url=database_url)
    assert missing.exit_code == 1
    assert one_error_line(missing) == f"akadze: error: job {job_id + 1000} not found"


def test_jobs_cancel(database_url: str, db: psycopg.Connection, enqueue: Any) -> None:
    queued = enqueue("mail.send", to="ada")
    result = run("jobs", "cancel", str(queued), url=database_url)
    assert result.exit_code == 0, result.output
    assert job(db, queued)["state"] == "cancelled"
    assert job(db, queued)["cancel_requested"] is True

    running = enqueue("mail.send", to="bob")
    db.execute("UPDATE akadze.jobs SET state = 'running', attempt = 1, run_count = 1"
               " WHERE id = %s", (running,))
    result = run("jobs", "cancel", str(running), url=database_url)
    assert result.exit_code == 0, result.output
    assert "cancel requested" in result.stdout
    assert (job(db, running)["state"], job(db, running)["cancel_requested"]) == ("running", True)

    # Finished (cancelled just now) and unknown jobs are not active.
    for job_id in (queued, queued + 1000):
        again = run("jobs", "cancel", str(job_id), url=database_url)
        assert again.exit_code == 1
        assert "job is not active" in one_error_line(again)
    assert job(db, queued)["state"] == "cancelled"


def test_jobs_requeue(database_url: str, db: psycopg.Connection, enqueue: Any) -> None:
    job_id = enqueue("mail.send", to="ada")
    not_failed = run("jobs", "requeue", str(job_id), url=database_url)
    assert not_failed.exit_code == 1
    assert "only failed jobs can be requeued" in one_error_line(not_failed)
    assert job(db, job_id)["state"] == "queued"

    db.execute("UPDATE akadze.jobs SET state = 'failed', attempt = 3, finished_at = now(),"
               " errors = '[{\"attempt\": 3, \"message\": \"boom\"}]' WHERE id = %s", (job_id,))
    result = run("jobs", "requeue", str(job_id), url=database_url)
    assert result.exit_code == 0, result.output
    row = job(db, job_id)
    assert (row["state"], row["attempt"], row["max_attempts"]) == ("queued", 3, 4)
    assert row["errors"][0]["message"] == "boom"
    assert row["args"] == {"to": "ada"}


def test_stats(database_url: str, db: psycopg.Connection, enqueue: Any) -> None:
    empty = run("stats", "--json", url=database_url)
    assert empty.exit_code == 0, empty.output
    assert json.loads(empty.stdout) == {}

    for _ in range(3):
        enqueue("mail.send")
    failed = enqueue("mail.send")
    db.execute("UPDATE akadze.jobs SET state = 'failed' WHERE id = %s", (failed,))
    enqueue("report.build", queue="reports")

    result = run("stats", "--json", url=database_url)
    assert result.exit_code == 0, result.output
    zero = {"waiting": 0, "queued": 0, "running": 0, "succeeded": 0, "failed": 0,
            "cancelled": 0}
    assert json.loads(result.stdout) == {
        "default": {**zero, "queued": 3, "failed": 1},
        "reports": {**zero, "queued": 1},
    }

    human = run("stats", url=database_url)
    assert human.exit_code == 0, human.output
    assert [line.split() for line in human.stdout.splitlines()] == [
        ["QUEUE", "WAITING", "QUEUED", "RUNNING", "SUCCEEDED", "FAILED", "CANCELLED", "TOTAL"],
        ["default", "0", "3", "0", "0", "1", "0", "4"],
        ["reports", "0", "1", "0", "0", "0", "0", "1"],
    ]


# --- errors: one line, no secrets ------------------------------------------------------------

COMMANDS = [("migrate",), ("jobs", "list"), ("jobs", "show", "1"), ("jobs", "cancel", "1"),
            ("jobs", "requeue", "1"), ("stats",)]


@pytest.mark.parametrize("command", COMMANDS, ids=" ".join)
def test_unreachable_server_is_one_line_without_the_password(command: tuple[str, ...]) -> None:
    for result in (run(*command, url=DEAD_URL),
                   CliRunner().invoke(cli, ["--database-url", DEAD_URL, *command])):
        assert result.exit_code == 1
        line = one_error_line(result)
        assert "cannot connect to Postgres" in line and "port 1" in line
        assert PASSWORD not in result.output


def test_server_errors_never_print_the_password(database_url: str) -> None:
    # Trust auth accepts any password, so a "wrong" one succeeds: still never printed.
    accepted = run("stats", url=with_password(database_url))
    assert accepted.exit_code == 0, accepted.output
    assert PASSWORD not in accepted.output

    # The server rejects this one, and its message is printed scrubbed.
    missing_db = with_password(database_url, dbname=f"no_such_db_{PASSWORD}")
    result = run("jobs", "list", url=missing_db)
    assert result.exit_code == 1
    line = one_error_line(result)
    assert "does not exist" in line
    assert PASSWORD not in result.output

    malformed = run("stats", url=f"postgresql://postgres:{PASSWORD}@127.0.0.1:notaport/x")
    assert malformed.exit_code == 1
    one_error_line(malformed)
    assert PASSWORD not in malformed.output


@pytest.mark.parametrize("command", [("jobs", "list"), ("stats",), ("jobs", "cancel", "1")],
                         ids=" ".join)
def test_schema_missing_tells_to_migrate(empty_database_url: str,
                                         command: tuple[str, ...]) -> None:
    result = run(*command, url=empty_database_url)
    assert result.exit_code == 1
    assert "run `akadze migrate`" in one_error_line(result)


# --- worker: loading the app ---------------------------------------------------------------------

@pytest.mark.parametrize(("spec", "message"), [
    ("no_such_module_xyz:app", "cannot import module 'no_such_module_xyz'"),
    (f"{APP_MODULE}:missing", f"module '{APP_MODULE}' has no attribute 'missing'"),
    (f"{APP_MODULE}:not_an_app", "is not an akadze_core.App (it is a dict)"),
    ("tests.integration", "has no attribute 'app' that is an akadze_core.App"),
    (":app", "expected MODULE:APP"),
])
def test_worker_app_that_cannot_be_loaded(database_url: str, spec: str, message: str) -> None:
    result = run("worker", spec, url=database_url)
    assert result.exit_code == 1
    assert message in one_error_line(result)


def test_worker_rejects_inconsistent_options(database_url: str) -> None:
    result = run("worker", f"{APP_MODULE}:app", "--heartbeat-interval", "5",
                 "--heartbeat-ttl", "2", url=database_url)
    assert result.exit_code == 2
    assert "heartbeat_ttl must be longer than heartbeat_interval" in one_error_line(result)


# --- worker: the real process --------------------------------------------------------------------

class WorkerProcess:
    """``python -m akadze_core.cli [--database-url ...] worker ...`` with stdout and stderr
    in files (pipes could fill up and block it)."""

    def __init__(self, tmp_path: Path, args: list[str], env: dict[str, str]) -> None:
        self.stdout_path = tmp_path / "worker.out"
        self.stderr_path = tmp_path / "worker.err"
        with open(self.stdout_path, "wb") as out, open(self.stderr_path, "wb") as err:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "akadze_core.cli", *args], cwd=PROJECT_ROOT,
                env={**os.environ, "PYTHONUNBUFFERED": "1", **env},
                stdin=subprocess.DEVNULL, stdout=out, stderr=err)

    @property
    def stderr(self) -> str:
        """What the process logged so far."""
        return self.stderr_path.read_text("utf-8", errors="replace")

    @property
    def output(self) -> str:
        """stdout and stderr."""
        return self.stdout_path.read_text("utf-8", errors="replace") + self.stderr

    def wait_log(self, pattern: str, timeout: float = 15.0) -> None:
        """Wait until a stderr line matches ``pattern`` (fails early if the process died)."""
        def seen() -> bool:
            assert self.proc.poll() is None or re.search(pattern, self.stderr, re.MULTILINE), \
                f"worker exited with {self.proc.returncode}:\n{self.output}"
            return re.search(pattern, self.stderr, re.MULTILINE) is not None
        wait_for(seen, timeout)

    def wait(self, timeout: float = 20.0) -> int:
        """The exit code."""
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"the worker did not exit:\n{self.output}") from None

    def stop(self) -> None:
        """Kill it if it is still running."""
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)


@pytest.fixture
def spawn(tmp_path: Path) -> Iterator[Any]:
    """``spawn(*args, env=...)`` starts an ``akadze`` subprocess, killed at teardown."""
    started: list[WorkerProcess] = []

    def start(*args: str, env: dict[str, str]) -> WorkerProcess:
        folder = tmp_path / str(len(started))
        folder.mkdir()
        process = WorkerProcess(folder, list(args), env)
        started.append(process)
        return process

    yield start
    for process in started:
        process.stop()


def test_worker_runs_jobs_logs_outcomes_and_exits_0_on_sigterm(
        database_url: str, db: psycopg.Connection, enqueue: Any, spawn: Any,
        tmp_path: Path) -> None:
    added = enqueue("cli.add", a=2, b=3)
    refused = enqueue("cli.refuse", reason="no thanks")
    health = tmp_path / "healthy"
    worker = spawn("worker", f"{APP_MODULE}:app", "--slots", "2", "--health-file", str(health),
                   *FAST, env={"AKADZE_DATABASE_URL": database_url})

    worker.wait_log(rf"INFO akadze\.worker: job {added} cli\.add succeeded")
    worker.wait_log(rf"INFO akadze\.worker: job {refused} cli\.refuse failed")
    assert job(db, added)["result"] == 5
    assert job(db, refused)["state"] == "failed"
    late = enqueue("cli.add", a=1, b=1)  # picked up by the running worker too
    worker.wait_log(rf"INFO akadze\.worker: job {late} cli\.add succeeded")
    assert health.exists()

    worker.proc.send_signal(signal.SIGTERM)
    assert worker.wait() == 0, worker.output
    assert not health.exists()
    lines = worker.stderr.splitlines()
    assert all(LOG_LINE.match(line) for line in lines), worker.stderr
    for job_id in (added, refused, late):
        # One line per outcome.
        assert len([line for line in lines if f" job {job_id} " in line]) == 1, worker.stderr
    assert db.execute("SELECT count(*) FROM akadze.workers").fetchone() == (0,)


def test_worker_module_alone_and_database_url_overrides_the_app(
        database_url: str, db: psycopg.Connection, enqueue: Any, spawn: Any) -> None:
    job_id = enqueue("cli.add", queue="numbers", a=20, b=22)
    chatty = enqueue("cli.chatty", queue="other")
    # The module builds its App with a dead URL; the command line must win over it.
    worker = spawn("--database-url", with_password(database_url), "worker", APP_MODULE,
                   "--queue", "other,numbers", *FAST, env={"CLI_TEST_APP_URL": DEAD_URL})
    worker.wait_log(rf"job {job_id} cli\.add succeeded")
    worker.wait_log(rf"job {chatty} cli\.chatty succeeded")
    assert job(db, job_id)["result"] == 42
    # The task logged the URL with its password; the worker's log handler scrubbed it.
    assert re.search(r"INFO tests\.cli_app: connected to .*\*\*\*", worker.stderr), worker.stderr
    worker.proc.send_signal(signal.SIGINT)
    assert worker.wait() == 0, worker.output
    assert "queues other,numbers" in worker.stderr
    assert PASSWORD not in worker.output


def test_worker_exits_although_a_sync_task_thread_is_still_running(
        database_url: str, db: psycopg.Connection, enqueue: Any, spawn: Any) -> None:
    job_id = enqueue("cli.block", seconds=120)
    worker = spawn("worker", f"{APP_MODULE}:app", "--shutdown-timeout", "0.2", *FAST,
                   env={"AKADZE_DATABASE_URL": database_url})
    wait_for(lambda: job(db, job_id)["state"] == "running")
    worker.proc.send_signal(signal.SIGTERM)
    started = time.monotonic()
    assert worker.wait(timeout=20) == 0, worker.output
    assert time.monotonic() - started < 15  # not the task's 120 s
    row = job(db, job_id)
    assert (row["state"], row["attempt"]) == ("queued", 0)  # returned unspent


def test_worker_on_a_database_without_the_schema(empty_database_url: str, spawn: Any) -> None:
    worker = spawn("worker", f"{APP_MODULE}:app", *FAST,
                   env={"AKADZE_DATABASE_URL": empty_database_url})
    assert worker.wait() == 1, worker.output
    errors = [line for line in worker.output.splitlines() if "error" in line.lower()]
    assert len(errors) == 1, worker.output
    assert errors[0].startswith("akadze: error: ") and "run `akadze migrate`" in errors[0]
    assert "Traceback" not in worker.output


def test_worker_fatal_connection_error_is_one_line_without_the_password(
        database_url: str, spawn: Any) -> None:
    url = with_password(database_url, dbname=f"no_such_db_{PASSWORD}")
    worker = spawn("--database-url", url, "worker", f"{APP_MODULE}:app", *FAST, env={})
    assert worker.wait() == 1, worker.output
    errors = [line for line in worker.output.splitlines() if line.startswith("akadze: error:")]
    assert len(errors) == 1 and "does not exist" in errors[0], worker.output
    assert PASSWORD not in worker.output
    assert "Traceback" not in worker.output


@pytest.mark.slow
def test_worker_exits_1_when_the_heartbeat_is_lost_past_the_ttl(
        database_url: str, admin_url: str, spawn: Any) -> None:
    name = conninfo_to_dict(database_url)["dbname"]
    worker = spawn("worker", f"{APP_MODULE}:app", "--poll-interval", "0.1",
                   "--heartbeat-interval", "0.2", "--heartbeat-ttl", "1",
                   env={"AKADZE_DATABASE_URL": database_url})
    worker.wait_log(r"akadze\.worker: worker .* started")
    with psycopg.connect(admin_url, autocommit=True) as admin:
        # Refuse new connections and cut the current ones: every heartbeat now fails.
        admin.execute(sql.SQL("ALTER DATABASE {} ALLOW_CONNECTIONS false").format(
            sql.Identifier(name)))
        try:
            admin.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
                          " WHERE datname = %s", (name,))
            assert worker.wait(timeout=60) == 1, worker.output
        finally:
            admin.execute(sql.SQL("ALTER DATABASE {} ALLOW_CONNECTIONS true").format(
                sql.Identifier(name)))
    assert "no heartbeat for longer than heartbeat_ttl" in worker.stderr


@pytest.mark.slow
def test_without_any_url_the_embedded_postgres_serves(tmp_path: Path, spawn: Any) -> None:
    env = {key: value for key, value in os.environ.items() if key != "AKADZE_DATABASE_URL"}
    env["AKADZE_HOME"] = str(tmp_path / "embedded")
    # `migrate` creates the database (`stats` would refuse: it only reads).
    migrated = subprocess.run([sys.executable, "-m", "akadze_core.cli", "migrate"],
                              cwd=tmp_path, env=env, capture_output=True, text=True,
                              timeout=120)
    assert migrated.returncode == 0, migrated.stderr
    # The embedded one is migrated when it is made; migrate names it.
    assert migrated.stdout.startswith("schema already at version"), migrated.stdout
    assert f" in the embedded Postgres in {tmp_path / 'embedded' / 'pgdata'}: nothing to do" \
        in migrated.stdout
    # Said once, in one log line.
    assert migrated.stderr.count("using the embedded Postgres") == 1, migrated.stderr
    postmaster = tmp_path / "embedded" / "pgdata" / "postmaster.pid"
    assert not postmaster.exists()  # stopped when the command exited

    # The worker's os._exit still runs the atexit handlers: the server stops with it.
    worker = spawn("worker", f"{APP_MODULE}:app", *FAST,
                   env={"AKADZE_DATABASE_URL": "", "AKADZE_HOME": env["AKADZE_HOME"]})
    try:
        worker.wait_log(r"akadze\.worker: worker .* started", timeout=60)
        assert postmaster.exists()
        worker.proc.send_signal(signal.SIGTERM)
        assert worker.wait() == 0, worker.output
        assert not postmaster.exists()
    finally:
        if postmaster.exists():  # failed: do not leave the test's server running
            worker.stop()
            os.kill(int(postmaster.read_text().split()[0]), signal.SIGTERM)


# --- one wording for a missing schema; bare `akadze` -------------------------------------------

SCHEMA_LINE = ("akadze: error: the akadze schema is not applied to this database: run "
               "`akadze migrate`")


@pytest.mark.parametrize("args", [
    ("jobs", "list"), ("jobs", "show", "1"), ("jobs", "cancel", "1"), ("jobs", "requeue", "1"),
    ("stats",), ("schedules", f"{APP_MODULE}:app"),
])
def test_every_command_words_a_missing_schema_alike(empty_database_url: str,
                                                    args: tuple[str, ...]) -> None:
    result = run(*args, url=empty_database_url)
    assert result.exit_code == 1
    assert one_error_line(result) == SCHEMA_LINE  # no SQL text, no relation name


def test_a_worker_that_never_started_does_not_say_it_stopped(empty_database_url: str,
                                                             spawn: Any) -> None:
    worker = spawn("worker", f"{APP_MODULE}:app", *FAST,
                   env={"AKADZE_DATABASE_URL": empty_database_url})
    assert worker.wait() == 1, worker.output
    assert worker.output.strip().splitlines()[-1] == SCHEMA_LINE, worker.output
    assert "stopped" not in worker.output and " started" not in worker.output


def test_bare_akadze_prints_its_help_like_akadze_help() -> None:
    bare = subprocess.run([sys.executable, "-m", "akadze_core.cli"], cwd=PROJECT_ROOT,
                          capture_output=True, text=True, timeout=60)
    asked = subprocess.run([sys.executable, "-m", "akadze_core.cli", "--help"],
                           cwd=PROJECT_ROOT, capture_output=True, text=True, timeout=60)
    assert bare.returncode == 0 and bare.stderr == ""
    assert bare.stdout == asked.stdout
    assert bare.stdout.startswith("Usage: akadze ") and len(bare.stdout.splitlines()) > 10


# --- worker: what its log says about failures ----------------------------------------------

def test_worker_logs_each_failed_attempt_on_one_line_and_the_last_as_failed(
        database_url: str, db: psycopg.Connection, spawn: Any) -> None:
    app = App(database_url)
    app.task("cli.broken")(lambda **kwargs: None)
    job_id = int(app.tasks["cli.broken"].configure(max_attempts=2).enqueue(item="x7"))
    app.close()
    worker = spawn("worker", f"{APP_MODULE}:app", *FAST, env={"AKADZE_DATABASE_URL": database_url})
    worker.wait_log(rf"job {job_id} cli\.broken failed for good")
    lines = [line for line in worker.stderr.splitlines() if f" job {job_id} " in line]
    assert len(lines) == 2, worker.stderr
    first, last = lines
    # The error's type and message, its newline collapsed, and what happens next.
    assert re.search(rf"INFO akadze\.worker: job {job_id} cli\.broken failed attempt 1/2 in "
                     r"[\d.]+s: ValueError: bad id x7 see the vendor's log \(retry in 0\.2s\)$",
                     first), first
    assert re.search(rf"INFO akadze\.worker: job {job_id} cli\.broken failed for good on "
                     r"attempt 2/2 in [\d.]+s: ValueError: bad id x7 see the vendor's log "
                     r"\(no attempts left\)$", last), last
    assert "retry" not in last
    assert "Traceback" not in worker.stderr  # at DEBUG only
    assert job(db, job_id)["state"] == "failed"


def test_worker_logs_the_traceback_of_a_failed_attempt_at_debug(
        database_url: str, enqueue: Any, spawn: Any) -> None:
    job_id = enqueue("cli.refuse", reason="no thanks")
    worker = spawn("worker", f"{APP_MODULE}:app", "--log-level", "DEBUG", *FAST,
                   env={"AKADZE_DATABASE_URL": database_url})
    worker.wait_log(rf"job {job_id} cli\.refuse failed for good on attempt 1/3 in [\d.]+s: "
                    r"Fail: no thanks \(not retried\)$")
    worker.wait_log(rf"DEBUG akadze\.worker: job {job_id} cli\.refuse traceback of attempt 1/3:$")
    log = worker.stderr
    traceback = log[log.index(f"job {job_id} cli.refuse traceback"):]
    assert "Traceback (most recent call last):" in traceback
    assert 'raise Fail(reason)' in traceback
    assert "akadze_core.model.errors.Fail: no thanks" in traceback


def test_worker_logs_an_unregistered_task_as_a_warning(
        database_url: str, db: psycopg.Connection, enqueue: Any, spawn: Any) -> None:
    job_id = enqueue("cli.nowhere", n=1)
    worker = spawn("worker", f"{APP_MODULE}:app", *FAST, env={"AKADZE_DATABASE_URL": database_url})
    worker.wait_log(rf"WARNING akadze\.worker: job {job_id} cli\.nowhere failed: NotRegistered: "
                    r"no task 'cli\.nowhere' in this worker")
    assert len([line for line in worker.stderr.splitlines()
                if f" job {job_id} " in line]) == 1, worker.stderr
    assert job(db, job_id)["errors"][-1]["type"] == "NotRegistered"


@pytest.mark.parametrize("pool", [[], ["--processes", "1"]], ids=["threads", "processes"])
def test_what_a_task_prints_is_scrubbed_of_the_password(
        database_url: str, db: psycopg.Connection, enqueue: Any, spawn: Any,
        pool: list[str]) -> None:
    job_id = enqueue("cli.printer")
    worker = spawn("--database-url", with_password(database_url), "worker",
                   f"{APP_MODULE}:app", *pool, *FAST, env={})
    worker.wait_log(rf"job {job_id} cli\.printer succeeded")
    worker.proc.send_signal(signal.SIGINT)
    assert worker.wait() == 0, worker.output
    printed = worker.stdout_path.read_text("utf-8")
    assert PASSWORD not in worker.output, worker.output
    assert "connecting to " in printed and "password=***" in printed
    assert "postgresql://postgres:***@db.example/app\n" in printed
    assert "done printing" in printed
    assert "the secret is ***" in worker.stderr
