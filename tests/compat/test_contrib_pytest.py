"""``akadze_compat.contrib.pytest`` and ``contrib.testing.worker``: a Celery project's own
pytest suite passes after the rename, and the embedded worker is a real one.

``projects/pytestproj`` is that suite, written as for Celery 5 (``pytest_plugins``,
``celery_config``, ``celery_includes``, ``celery_app``/``celery_worker``, the session twins,
``@pytest.mark.celery``, ``start_worker`` on the project's app). It runs here in a
subprocess, as its users run it, on this test's database; and, when the Celery interpreter
is there, the same files with ``akadze_compat`` renamed back to ``celery`` run on real
Celery (memory broker, cache result backend: its own testing defaults).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from akadze_compat import Celery
from akadze_compat.contrib.testing.app import database_for_tests, setup_default_app
from akadze_compat.contrib.testing.worker import start_worker
from tests.compat.celery_reference import celery_python
from tests.compat.differential import no_celery_reason

ROOT = Path(__file__).resolve().parents[2]
PROJECT = Path(__file__).with_name("projects") / "pytestproj"
#: Every test of pytestproj: 8 with the function fixtures, 2 with start_worker, 2 with the
#: session worker. A test that silently stopped being collected fails this count.
EXPECTED = "12 passed"
#: What pytest needs to run under the Celery interpreter, lent from ours (same Python).
PYTEST_MODULES = ("pytest", "_pytest", "py.py", "pluggy", "iniconfig", "pygments",
                  "packaging")


def _suite_env(**extra: str) -> dict[str, str]:
    env = {name: value for name, value in os.environ.items()
           if not name.startswith(("PYTEST_", "CELERY_", "AKADZE_"))}
    env.update(PYTHONDONTWRITEBYTECODE="1", **extra)
    return env


def _run_suite(python: str, cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [python, "-m", "pytest", "-q", "-p", "no:cacheprovider"],
        cwd=cwd, env=env, capture_output=True, text=True, timeout=240, check=False)


def _passed(completed: subprocess.CompletedProcess[str]) -> None:
    output = completed.stdout + completed.stderr
    assert completed.returncode == 0, output
    assert re.search(rf"\b{EXPECTED}\b", completed.stdout), output


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_celery_projects_own_pytest_suite_passes_after_the_rename(
        database_url: str) -> None:
    completed = _run_suite(sys.executable, PROJECT,
                           _suite_env(PYTHONPATH=str(ROOT), AKADZE_DATABASE_URL=database_url))
    _passed(completed)
    with psycopg.connect(database_url, autocommit=True) as connection:
        # The tasks ran on real workers on this database, and every worker unregistered.
        tasks = dict(connection.execute(
            "SELECT task, count(*) FROM akadze.jobs WHERE state = 'succeeded' GROUP BY task"
        ).fetchall())
        workers = connection.execute("SELECT count(*) FROM akadze.workers").fetchone()
    assert tasks["proj.tasks.add"] >= 4
    assert tasks["test_app_fixtures.mul"] == 1
    assert tasks["proj.tasks.send_report"] == 1
    assert workers == (0,)


@pytest.fixture
def celery_copy(tmp_path: Path) -> Iterator[Path]:
    """pytestproj with ``akadze_compat`` renamed to ``celery``, beside a folder lending
    pytest to the Celery interpreter."""
    project = tmp_path / "pytestproj"
    shutil.copytree(PROJECT, project, ignore=shutil.ignore_patterns("__pycache__"))
    for path in project.rglob("*.py"):
        path.write_text(path.read_text().replace("akadze_compat", "celery"))
    lent = tmp_path / "lent"
    lent.mkdir()
    site = Path(pytest.__file__).resolve().parents[1]
    for name in PYTEST_MODULES:
        if (site / name).exists():
            (lent / name).symlink_to(site / name)
    yield project


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_the_same_suite_passes_on_real_celery(celery_copy: Path) -> None:
    python = celery_python()
    if python is None:
        pytest.skip(no_celery_reason("CELERY_PYTHON"))
    completed = _run_suite(python, celery_copy, _suite_env(
        PYTHONPATH=str(celery_copy.parent / "lent"), CELERY_BROKER_URL="memory://",
        CELERY_RESULT_BACKEND="cache+memory://"))
    _passed(completed)


# --- the embedded worker, in this process -----------------------------------------------------

def test_start_worker_runs_tasks_defined_before_and_after_it_started(
        database_url: str, db: psycopg.Connection) -> None:
    app = Celery("embedded", broker=database_url, set_as_current=False)

    @app.task
    def double(x: int) -> int:
        return 2 * x

    with setup_default_app(app), start_worker(app, shutdown_timeout=5) as worker:
        assert double.delay(21).get(timeout=10) == 42

        @app.task
        def negate(x: int) -> int:
            return -x

        assert negate.delay(5).get(timeout=10) == -5
        assert worker.hostname in {row[0] for row in db.execute(
            "SELECT name FROM akadze.workers").fetchall()}
        # It answers inspect as a worker started by the command does (Celery's test
        # Manager waits for active() to be empty after each of its integration tests).
        inspect = app.control.inspect(timeout=5)
        assert inspect.active() == {worker.hostname: []}
        assert inspect.ping() == {worker.hostname: {"ok": "pong"}}
    assert db.execute("SELECT count(*) FROM akadze.workers").fetchone() == (0,)
    assert db.execute("SELECT count(*) FROM akadze.jobs WHERE state <> 'succeeded'"
                      ).fetchone() == (0,)


def test_start_worker_applies_the_schema_to_a_new_database(empty_database_url: str) -> None:
    app = Celery("fresh", broker=empty_database_url, set_as_current=False)
    with setup_default_app(app), start_worker(app) as worker:
        assert worker.queues == ["celery"]
        assert app.tasks["celery.ping"].delay().get(timeout=10) == "pong"


def test_a_task_running_at_teardown_gets_the_shutdown_timeout_then_goes_back(
        database_url: str, db: psycopg.Connection) -> None:
    app = Celery("slow", broker=database_url, set_as_current=False)
    started = threading.Event()

    @app.task
    def wait_forever() -> None:
        started.set()
        time.sleep(3)

    with setup_default_app(app), start_worker(app, shutdown_timeout=0.5):
        wait_forever.delay()
        assert started.wait(10)
        stopping = time.monotonic()
    assert time.monotonic() - stopping < 2.5
    # The stop did not wait 3 s for the body: the job went back to the queue unspent.
    assert db.execute("SELECT state, attempt FROM akadze.jobs WHERE task LIKE '%wait_forever'"
                      ).fetchone() == ("queued", 0)


def test_the_test_database_is_the_env_broker_then_a_postgres_broker_url_then_akadze_env(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CELERY_BROKER_URL", raising=False)
    monkeypatch.delenv("AKADZE_DATABASE_URL", raising=False)
    assert database_for_tests("memory://") is None  # None: the embedded Postgres
    monkeypatch.setenv("AKADZE_DATABASE_URL", "postgresql://env/db")
    assert database_for_tests("memory://") == "postgresql://env/db"
    assert database_for_tests("redis://localhost:6379/0") == "postgresql://env/db"
    assert database_for_tests("postgresql://config/db") == "postgresql://config/db"
    assert database_for_tests("sqla+postgresql://config/db") == "sqla+postgresql://config/db"
    monkeypatch.setenv("CELERY_BROKER_URL", "postgresql://celery-env/db")
    assert database_for_tests("postgresql://config/db") == "postgresql://celery-env/db"
