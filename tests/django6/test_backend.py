"""Django's task framework on akadze (``akadze_core.contrib.django.AkadzeBackend``), with a
real Django 6.1 project (tests/django6/project) on Postgres and a real ``akadze worker``.

Django 6 needs Python 3.12+, so the project runs in the interpreter ``$DJANGO6_PYTHON``
(default ``/tmp/akadze-django6-venv/bin/python``, built by ``.ci/run``), with this checkout
first on its path; its driver (``project/driver.py``) answers in JSON, and the jobs table is
read here. Each test has its own database, created and dropped by ``database_url``.
"""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Iterator
from datetime import datetime
from functools import cache
from pathlib import Path
from typing import Any

import psycopg
import pytest

PROJECT = Path(__file__).resolve().parent / "project"
ROOT = PROJECT.parent.parent.parent
DEFAULT_DJANGO6_PYTHON = "/tmp/akadze-django6-venv/bin/python"
pytestmark = pytest.mark.slow


@cache
def django6_python() -> str:
    """The interpreter with Django 6, or a skip saying how to get one."""
    python = os.environ.get("DJANGO6_PYTHON", DEFAULT_DJANGO6_PYTHON)
    try:
        found = subprocess.run(
            [python, "-c", "import django, psycopg_pool, click, croniter; "
                           "assert django.VERSION >= (6, 0)"],
            capture_output=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        found = None
    if found is None or found.returncode != 0:
        pytest.skip(f"no Django 6 at {python}: `bash .ci/run` builds it (python3.12 -m venv "
                    f"/tmp/akadze-django6-venv && its pip install 'django==6.1.*' .), or "
                    "set DJANGO6_PYTHON")
    return python


@pytest.fixture(autouse=True)
def _needs_django6() -> None:
    """Skip before a database is made for nothing."""
    django6_python()


def environment(database_url: str) -> dict[str, str]:
    return {"DJTASKS_DATABASE_URL": database_url, "DJANGO_SETTINGS_MODULE": "settings",
            "PYTHONPATH": f"{PROJECT}{os.pathsep}{ROOT}", "PATH": "/usr/bin:/bin"}


def driver(database_url: str, action: str, argument: Any = None) -> Any:
    """Run ``driver.py action argument`` on the Django side; its JSON answer."""
    done = subprocess.run(
        [django6_python(), "driver.py", action, json.dumps(argument)], cwd=PROJECT,
        capture_output=True, text=True, timeout=120, env=environment(database_url))
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.splitlines()[-1])


@pytest.fixture
def django_db(database_url: str) -> str:
    """The test database, with the project's tables (Django's migrate)."""
    driver(database_url, "migrate")
    return database_url


class WorkerProcess:
    """``akadze worker akadze_core.contrib.django:app`` in the Django interpreter."""

    def __init__(self, database_url: str, log: Path, *options: str,
                 manage: bool = False) -> None:
        self.log = log
        # `akadze worker akadze_core.contrib.django:app`, or the same through the
        # management command of the app in INSTALLED_APPS.
        command = ["manage.py", "akadze", "worker"] if manage else [
            "-m", "akadze_core.cli", "worker", "akadze_core.contrib.django:app"]
        with self.log.open("w") as out:
            self.process = subprocess.Popen(
                [django6_python(), *command, "--poll-interval", "0.2",
                 "--log-level", "INFO", *options],
                cwd=PROJECT, env=environment(database_url), stdout=out,
                stderr=subprocess.STDOUT)

    def stop(self) -> str:
        """Stop it (SIGTERM, then SIGKILL after 30 s); its log."""
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(10)
        return self.log.read_text()


@pytest.fixture
def start_worker(django_db: str, tmp_path: Path) -> Iterator[Any]:
    started: list[WorkerProcess] = []

    def start(*options: str, manage: bool = False) -> WorkerProcess:
        worker = WorkerProcess(django_db, tmp_path / f"worker-{len(started)}.log", *options,
                               manage=manage)
        started.append(worker)
        return worker

    yield start
    for worker in started:
        worker.stop()


def results(database_url: str, pairs: list[tuple[str, str]], wait: float = 0) -> list[Any]:
    answer = driver(database_url, "results", {"ids": pairs, "wait": wait})
    return list(answer["results"])


def test_the_worker_runs_django_tasks_and_results_are_read_back(
        django_db: str, start_worker: Any, db: psycopg.Connection) -> None:
    specs = [
        {"task": "add", "args": [2, 3]},
        {"task": "fail", "args": ["boom"]},
        {"task": "flaky", "args": [3]},
        {"task": "whoami", "kwargs": {"x": 7}},
        {"task": "send", "args": ["a@example.com"]},
        {"task": "record", "args": ["orm"]},
        # Tasks of the other backends on the same database ("intx", "now": MAX_ATTEMPTS 2),
        # in the same queue: the worker runs them too, each with its backend's settings.
        {"task": "noted", "args": [11]},
        {"task": "fail_twice", "args": ["twice"]},
    ]
    ids = driver(django_db, "enqueue", specs)["ids"]
    pairs = [(spec["task"], result_id) for spec, result_id in zip(specs, ids, strict=True)]
    # Nothing runs them yet: each is READY, its arguments and queue kept.
    before = results(django_db, pairs)
    assert [r["status"] for r in before] == ["READY"] * len(specs)
    assert before[0]["args"] == [2, 3] and before[3]["kwargs"] == {"x": 7}
    assert before[4]["queue"] == "emails"

    worker = start_worker("-q", "default,emails")
    added, failed, flaky, whoami, sent, recorded, noted, twice = results(
        django_db, pairs, wait=60)

    assert added["status"] == "SUCCESSFUL" and added["return_value"] == 5
    assert added["attempts"] == 1 and added["errors"] == []
    assert added["enqueued_at"] <= added["started_at"] <= added["finished_at"]

    # A failure: FAILED, its error's class path and traceback, no retry (MAX_ATTEMPTS 1).
    assert failed["status"] == "FAILED" and failed["attempts"] == 1
    [[path, traceback]] = failed["errors"]
    assert path == "builtins.ValueError" and failed["exception_class"] == "ValueError"
    assert "ValueError: boom" in traceback

    # @task(max_attempts=3, backoff=...): two failed attempts, then the third succeeds; the
    # task's context counted its attempts.
    assert flaky["status"] == "SUCCESSFUL" and flaky["return_value"] == 3
    assert flaky["attempts"] == 3
    assert [e[0] for e in flaky["errors"]] == ["builtins.RuntimeError"] * 2

    # takes_context: the context's result is this job's, RUNNING, on its first attempt.
    assert whoami["return_value"] == {"id": ids[3], "attempt": 1, "x": 7,
                                      "status": "RUNNING", "workers": 1}
    # queue_name: run from its queue; the tuple returned comes back as a list.
    assert sent["return_value"] == ["sent", "a@example.com"]
    [[queue]] = db.execute("SELECT queue FROM akadze.jobs WHERE meta->>'task_id' = %s",
                           (ids[4],)).fetchall()
    assert queue == "emails"
    # The ORM works in the worker.
    assert recorded["return_value"] == "orm"
    assert db.execute("SELECT label FROM shop_run").fetchall() == [("orm",)]

    assert noted["status"] == "SUCCESSFUL" and noted["return_value"] == 11
    assert noted["backend"] == "intx"
    assert twice["status"] == "FAILED" and twice["attempts"] == 2 and twice["backend"] == "now"
    assert [e[0] for e in twice["errors"]] == ["builtins.ValueError"] * 2

    # run_after: not run before it, run after it.
    answer = driver(django_db, "enqueue", [{"task": "add", "args": [1, 1], "delay": 2}])
    [deferred], [early] = answer["ids"], answer["results"]
    assert early["status"] == "READY" and early["run_after"] is not None
    [late] = results(django_db, [("add", deferred)], wait=30)
    assert late["status"] == "SUCCESSFUL" and late["return_value"] == 2
    assert datetime.fromisoformat(late["started_at"]) >= datetime.fromisoformat(
        late["run_after"])

    # An async task, through aenqueue, arefresh and aget_result.
    answer = driver(django_db, "async", {"args": [20, 22], "wait": 30})
    assert answer["refreshed"]["status"] == "SUCCESSFUL"
    assert answer["refreshed"]["return_value"] == 42
    assert answer["again"]["return_value"] == 42

    # A stored error's module is never imported to read its class.
    assert driver(django_db, "hostile", {"id": ids[1]}) == {
        "path": "this.Boom", "raised": "ValueError", "imported": False}

    # An id no job has.
    assert driver(django_db, "unknown", {"id": "no-such-id"}) == {"missing": True}
    log = worker.stop()
    assert "Traceback" in log  # Django's own task_finished logging, at ERROR, for `fail`
    assert "state=SUCCESSFUL" in log


def test_priority_orders_the_runs(django_db: str, start_worker: Any,
                                  db: psycopg.Connection) -> None:
    specs = [{"task": "record", "args": [label], "priority": priority}
             for label, priority in (("low", -50), ("mid", 0), ("high", 100), ("top", 100))]
    ids = driver(django_db, "enqueue", specs)["ids"]
    # Through `manage.py akadze worker`, in one process child (--processes re-runs the
    # command line in the child, which sets Django up again).
    start_worker("--slots", "1", "--processes", "1", manage=True)
    done = results(django_db, [("record", i) for i in ids], wait=60)
    assert [r["status"] for r in done] == ["SUCCESSFUL"] * 4
    assert [r["priority"] for r in done] == [-50, 0, 100, 100]
    # Larger first, as Django orders them; equal ones in the order they were enqueued.
    order = [label for (label,) in db.execute("SELECT label FROM shop_run ORDER BY id")]
    assert order == ["high", "top", "mid", "low"]


def test_enqueue_follows_djangos_transaction(django_db: str) -> None:
    # ENQUEUE "on_commit" (the default): sent when the transaction commits, never if it
    # rolls back.
    sent = driver(django_db, "transaction", {"task": "add", "args": [1, 2]})
    assert (sent["inside"], sent["outside_before_commit"], sent["after"]) == (0, 0, 1)
    assert sent["missing"] is False
    dropped = driver(django_db, "transaction", {"task": "add", "args": [1, 2],
                                                "rollback": True})
    assert (dropped["after"], dropped["orders"], dropped["missing"]) == (0, 1, True)

    # ENQUEUE "in_transaction": the row is in Django's transaction, seen only by it until
    # the commit; a rollback (of the block or of an inner savepoint) leaves no job.
    joined = driver(django_db, "transaction", {"task": "noted", "args": [1]})
    assert (joined["inside"], joined["outside_before_commit"], joined["after"]) == (1, 0, 1)
    assert joined["missing"] is False
    rolled = driver(django_db, "transaction", {"task": "noted", "args": [1], "rollback": True})
    assert (rolled["inside"], rolled["outside_before_commit"], rolled["after"]) == (1, 0, 0)
    assert rolled["missing"] is True
    inner = driver(django_db, "transaction", {"task": "noted", "args": [1], "savepoint": True})
    assert (inner["inside"], inner["after"], inner["missing"]) == (0, 0, True)

    # ENQUEUE "now": sent at once on the queue's own connection, whatever happens next.
    at_once = driver(django_db, "transaction", {"task": "fail_twice", "args": ["x"],
                                                "rollback": True})
    assert (at_once["outside_before_commit"], at_once["after"]) == (1, 1)


def test_settings_are_checked(database_url: str) -> None:
    answer = driver(database_url, "check")
    assert answer["default"] == [] and answer["lite"] == ["akadze.E001"]
    assert answer["errors"] == dict.fromkeys(("bad_mode", "typo", "url_in_tx", "attempts"),
                                             "ImproperlyConfigured")


def test_the_backends_of_every_thread_share_tasks_and_app(database_url: str) -> None:
    assert driver(database_url, "threads") == {
        "other_backend": True, "same_app": True, "status": "READY", "enqueued": "READY"}


def test_the_names_the_docs_give_exist() -> None:
    """Every ``akadze_core.contrib.…`` name the guide and the how-to write in backticks
    resolves under Django 6 (the guide's own name check leaves them here)."""
    import re

    names = sorted({name for page in (ROOT / "migration_guide" / "django.md",
                                      ROOT / "docs" / "how-to" / "django-tasks.md")
                    for name in re.findall(r"`(akadze_core\.contrib(?:\.\w+)+)(?::\w+)?`",
                                           page.read_text())})
    assert "akadze_core.contrib.django.AkadzeBackend" in names
    probe = (
        "import importlib, json, sys\n"
        "bad = []\n"
        "for dotted in json.loads(sys.argv[1]):\n"
        "    parts = dotted.split('.')\n"
        "    for cut in range(len(parts), 0, -1):\n"
        "        try:\n"
        "            found = importlib.import_module('.'.join(parts[:cut]))\n"
        "        except ModuleNotFoundError:\n"
        "            continue\n"
        "        for name in parts[cut:]:\n"
        "            found = getattr(found, name, None)\n"
        "        if found is None:\n"
        "            bad.append(dotted)\n"
        "        break\n"
        "print(json.dumps(bad))\n")
    done = subprocess.run([django6_python(), "-c", probe, json.dumps(names)], cwd=PROJECT,
                          capture_output=True, text=True, timeout=60,
                          env={**environment("dbname=unused"),
                               "DJANGO_SETTINGS_MODULE": "settings"})
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == []
