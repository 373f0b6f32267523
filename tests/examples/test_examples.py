"""The runnable examples, run as a user runs them: ``python -m examples.<name>`` subprocesses.

Each runs against the test's fresh database (``AKADZE_DATABASE_URL``); one test runs the
Celery-style project on its default, the embedded Postgres, from an empty directory (its
database in the per-user data directory).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from akadze_core.store.embedded import embedded_home

PROJECT_ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.slow


def run_example(module: str, *, cwd: Path, database_url: str | None, timeout: float = 120,
                env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """``python -m module`` with the repository on the path (and ``env`` added); asserts
    it exited 0."""
    env = {**{key: value for key, value in os.environ.items()
              if key not in ("AKADZE_DATABASE_URL", "CELERY_BROKER_URL", "BROKER_URL",
                             "AKADZE_HOME", "AKADZE_EMBEDDED_DIR")}, **(env or {})}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(PROJECT_ROOT),
                                                      os.environ.get("PYTHONPATH")]))
    if database_url is not None:
        env["AKADZE_DATABASE_URL"] = database_url
    completed = subprocess.run([sys.executable, "-m", module], cwd=cwd, env=env,
                               capture_output=True, text=True, timeout=timeout)
    assert completed.returncode == 0, (
        f"{module} exited {completed.returncode}\n--- stdout\n{completed.stdout}"
        f"\n--- stderr\n{completed.stderr[-6000:]}")
    return completed


def check_celery_project_output(stdout: str) -> None:
    assert "$ akadze-compat -A examples.celery_project worker" in stdout
    assert "result.get(timeout=30) -> 5" in stdout
    countdown = re.search(r"countdown: 30 after (\d+\.\d)s", stdout)
    assert countdown is not None and float(countdown.group(1)) >= 1.9, stdout
    assert "fetch_rate: {" in stdout and "'retries': 2" in stdout
    assert "(state SUCCESS, retries 2)" in stdout
    assert "sync_crm: 'customer 42 synced after 2 retries'" in stdout
    assert ("always_down: get() raised VendorDown: the vendor is gone for good "
            "(state FAILURE)") in stdout
    assert re.search(r"committed task [0-9a-f-]{36}: exists=True", stdout)
    assert re.search(r"rolled-back task [0-9a-f-]{36}: exists=False", stdout)
    assert re.search(r"AsyncResult\('[0-9a-f-]{36}'\): state=SUCCESS result=5 "
                     r"name=examples.celery_project.tasks.add args=\[2, 3\]", stdout)
    assert "AsyncResult('no-such-task').state = PENDING" in stdout
    assert "first heartbeat: 'heartbeat from beat' (tick " in stdout
    assert "worker stopped with SIGTERM, exit code 0" in stdout


def test_celery_project(database_url: str) -> None:
    completed = run_example("examples.celery_project", cwd=PROJECT_ROOT,
                            database_url=database_url)
    check_celery_project_output(completed.stdout)
    # The worker's own log goes to stderr: its banner and Celery-style task lines.
    assert "pool:        threads (concurrency 4)" in completed.stderr
    assert "Task examples.celery_project.tasks.add[" in completed.stderr


def test_celery_project_on_the_embedded_postgres(tmp_path: Path) -> None:
    pytest.importorskip("pgserver")
    # An empty directory is no project: the database goes to the per-user data directory.
    data = {"XDG_DATA_HOME": str(tmp_path / "data")}
    (tmp_path / "work").mkdir()
    completed = run_example("examples.celery_project", cwd=tmp_path / "work", database_url=None,
                            timeout=240, env=data)
    check_celery_project_output(completed.stdout)
    assert embedded_home(tmp_path / "work", data).exists()
    assert not (tmp_path / "work" / ".akadze").exists()


def test_core_chain(database_url: str) -> None:
    stdout = run_example("examples.core_chain", cwd=PROJECT_ROOT,
                         database_url=database_url).stdout
    assert re.search(r"order 7 inserted, orders.charge enqueued as job \d+", stdout)
    chain = re.findall(r"job +\d+ +(orders\.\w+) +(\w+) +attempt (\d) +errors (\d)", stdout)
    assert chain == [("orders.charge", "succeeded", "2", "1"),
                     ("orders.ship", "succeeded", "1", "0"),
                     ("orders.email", "succeeded", "1", "0")], stdout
    assert "result \"'shipped' mail sent for order 7\"" in stdout
    assert "order 7: shipped, history ['charged (attempt 2)', 'shipped']" in stdout
    assert "orders.ship jobs: 1 " in stdout
    poll = re.search(r"runs (\d+), attempts spent 1 of 3 .* meta polls=(\d+)", stdout)
    assert poll is not None, stdout
    assert int(poll.group(1)) >= 2 and int(poll.group(2)) == int(poll.group(1)) - 1
    assert "export exp-1 ready at https://vendor.example/exports/exp-1.csv" in stdout


def test_demo(database_url: str) -> None:
    completed = run_example("examples.demo", cwd=PROJECT_ROOT, database_url=database_url)
    stdout = completed.stdout
    rows = dict(re.findall(r"^ +\d+ +(demo\.\w+) +(\w+) ", stdout, re.MULTILINE)[:6])
    assert rows == {"demo.add": "succeeded", "demo.flaky": "succeeded",
                    "demo.poll": "succeeded", "demo.reject": "failed",
                    "demo.down": "failed", "demo.report": "succeeded"}, stdout
    assert "report 7 sent" in stdout
    # Each failed job's row says why: the type and message of its last error.
    assert re.search(r"^ +\d+ +demo\.reject +failed +1  Fail: vendor rejected the export$",
                     stdout, re.MULTILINE), stdout
    assert re.search(r"^ +\d+ +demo\.down +failed +2  ConnectionError: vendor unreachable "
                     r"in eu-west$", stdout, re.MULTILINE), stdout
    # And the worker's log said it as each attempt failed.
    log = completed.stderr
    assert re.search(r"demo\.down failed attempt 1/2 in [\d.]+s: ConnectionError: vendor "
                     r"unreachable in eu-west \(retry in 0\.3s\)", log), log
    assert re.search(r"demo\.down failed for good on attempt 2/2 in [\d.]+s: ConnectionError: "
                     r"vendor unreachable in eu-west \(no attempts left\)", log), log
