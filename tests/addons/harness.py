"""One Celery project with an add-on, run on Celery 5.7 + Redis and on akadze, unchanged.

Each add-on test writes ``observe.py``: the add-on set up as its own docs show, plus
``emit(record)`` (a JSON line in ``$ADDON_OUT/<pid>.jsonl``), ``producer_span()`` (the
producer's own trace, around the sends) and ``finish()``. The project (``proj.py``, which
imports ``observe`` first, as a project puts its instrumentation first) and the producer
(``producer.py``) are the same text on both sides and import ``celery``:

- Celery: ``python -m celery -A proj worker -P prefork -c 1`` in ``$CELERY_PYTHON``, broker
  and result backend on Redis (database 9, a queue of the run's own);
- akadze: ``akadze-compat -A proj worker -P prefork -c 1`` (the command turns the celery
  alias on), broker the test's Postgres database, and the producer with the alias's first
  line import, ``import akadze_compat.as_celery``.

The worker stops (SIGTERM, as a deployment stops it) before the records are read, so what
the add-on does at a child's exit happened. Nothing leaves the machine: the add-ons write to
``$ADDON_OUT`` through their local hooks (a Sentry transport, an OpenTelemetry exporter, a
ddtrace trace filter, New Relic's developer mode).
"""

from __future__ import annotations

import importlib.util
import itertools
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.compat.differential import CELERY_SERIES, celery_python, no_celery_reason

REDIS_URL = "redis://127.0.0.1:6379/9"
_runs = itertools.count()

PROJECT = '''
import os

import observe  # noqa: F401  (the add-on, set up first)
from celery import Celery

app = Celery("proj", broker=os.environ["PROJ_BROKER"],
             backend=os.environ.get("PROJ_BACKEND") or None)
app.conf.task_default_queue = os.environ["PROJ_QUEUE"]


@app.task(name="proj.double")
def double(x):
    return x * 2


@app.task(name="proj.boom")
def boom():
    raise ValueError("boom from the task")
'''

PRODUCER = '''
import observe
from proj import boom, double

with observe.producer_span():
    ok = double.delay(21)
    failed = boom.delay()
value = ok.get(timeout=60)
try:
    failed.get(timeout=60)
    error = None
except Exception as exc:
    error = type(exc).__name__
observe.emit({"role": "producer", "ok_id": ok.id, "boom_id": failed.id, "value": value,
              "error": error, **observe.producer_facts()})
observe.finish()
'''

#: What every observe.py starts with: where records go.
EMIT = '''
import json
import os


def emit(record):
    path = os.path.join(os.environ["ADDON_OUT"], f"{os.getpid()}.jsonl")
    with open(path, "a", encoding="utf-8") as out:
        out.write(json.dumps(record, default=str) + "\\n")
'''


def require(*modules: str) -> None:
    """Skip unless this interpreter has the add-on's modules."""
    for module in modules:
        if importlib.util.find_spec(module.split(".")[0]) is None \
                or importlib.util.find_spec(module) is None:
            pytest.skip(f"{module} is not installed (the test extra pins it)")


@dataclass
class Run:
    """What one side's run left: every record, the producer's, and the worker's log."""

    side: str
    records: list[dict[str, Any]]
    log: str
    worker_pid: int
    #: The project's directory (what the project wrote there beside ``out``).
    directory: Path | None = None

    @property
    def producer(self) -> dict[str, Any]:
        """The producer's record."""
        [record] = [record for record in self.records if record.get("role") == "producer"]
        return record

    def of(self, kind: str) -> list[dict[str, Any]]:
        """The records of ``kind`` (whatever ``observe.py`` names its records)."""
        return [record for record in self.records if record.get("kind") == kind]


def celery_side_python(*modules: str) -> str:
    """Celery's interpreter, with the add-on's modules; skips (with the reason) otherwise."""
    python = celery_python()
    if not Path(python).is_file():
        pytest.skip(no_celery_reason(python))
    probe = "import celery, sys; print(celery.__version__); " + "; ".join(
        f"import {module}" for module in modules)
    found = subprocess.run([python, "-c", probe], capture_output=True, text=True, timeout=60)
    if found.returncode != 0:
        pytest.skip(f"{python} cannot import celery or the add-on: {found.stderr[-300:]}")
    if not found.stdout.startswith(CELERY_SERIES):
        pytest.skip(f"{python} has Celery {found.stdout.strip()}")
    return python


def _environment(extra: dict[str, str], project: Path) -> dict[str, str]:
    env = {key: value for key, value in os.environ.items()
           if not key.startswith(("AKADZE_", "CELERY_", "DD_", "NEW_RELIC_", "SENTRY_",
                                  "OTEL_"))}
    env["PYTHONPATH"] = os.pathsep.join([str(project), *filter(None, [env.get("PYTHONPATH")])])
    env["PYTHONUNBUFFERED"] = "1"
    env["AKADZE_POLL_INTERVAL"] = "0.1"
    return {**env, **extra}


def run_project(tmp_path: Path, side: str, observe: str, *, database_url: str = "",
                celery: str = "", env: dict[str, str] | None = None,
                timeout: float = 90, files: dict[str, str] | None = None) -> Run:
    """Run the project with ``observe`` (observe.py's text after ``EMIT``) on ``side``
    ("celery": with the interpreter ``celery``; "akadze": on ``database_url``). ``files``
    (name: text) are written into the project after ``proj.py`` and ``producer.py``, which
    they may replace: an add-on whose docs set the project up differently."""
    number = next(_runs)
    project = tmp_path / f"{side}-{number}"
    out = project / "out"
    out.mkdir(parents=True)
    (project / "proj.py").write_text(textwrap.dedent(PROJECT))
    (project / "producer.py").write_text(textwrap.dedent(PRODUCER))
    (project / "observe.py").write_text(textwrap.dedent(EMIT) + textwrap.dedent(observe))
    for name, text in (files or {}).items():
        (project / name).write_text(textwrap.dedent(text))
    queue = f"addons_{os.getpid()}_{number}"
    extra = {"ADDON_OUT": str(out), "PROJ_QUEUE": queue, **(env or {})}
    if side == "celery":
        extra.update(PROJ_BROKER=REDIS_URL, PROJ_BACKEND=REDIS_URL)
        worker_command = [celery, "-m", "celery", "-A", "proj", "worker", "-P", "prefork",
                          "-c", "1", "-Q", queue, "-l", "INFO", "--without-gossip",
                          "--without-mingle", "--without-heartbeat"]
        producer_command = [celery, "producer.py"]
    else:
        extra.update(PROJ_BROKER=database_url)
        worker_command = [sys.executable, "-m", "akadze_compat", "-A", "proj", "worker", "-P",
                          "prefork", "-c", "1", "-Q", queue, "-l", "INFO"]
        # The alias's documented first line, in front of the unchanged producer.
        producer_command = [sys.executable, "-c", "import akadze_compat.as_celery, runpy; "
                            "runpy.run_path('producer.py', run_name='__main__')"]
    environment = _environment(extra, project)
    log_path = project / "worker.log"
    with open(log_path, "wb") as log:
        worker = subprocess.Popen(worker_command, cwd=project, env=environment,
                                  stdin=subprocess.DEVNULL, stdout=log,
                                  stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.monotonic() + timeout
        while "ready." not in log_path.read_text(errors="replace"):
            if worker.poll() is not None or time.monotonic() > deadline:
                raise AssertionError(f"the {side} worker did not start:\n"
                                     f"{log_path.read_text(errors='replace')[-3000:]}")
            time.sleep(0.1)
        produced = subprocess.run(producer_command, cwd=project, env=environment,
                                  capture_output=True, text=True, timeout=timeout)
        assert produced.returncode == 0, (
            f"the {side} producer failed:\n{produced.stderr[-3000:]}\n"
            f"worker log:\n{log_path.read_text(errors='replace')[-3000:]}")
    finally:
        worker.send_signal(signal.SIGTERM)
        try:
            worker.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(worker.pid, signal.SIGKILL)
            worker.wait()
    records = []
    for path in sorted(out.glob("*.jsonl")):
        pid = int(path.stem)
        for line in path.read_text().splitlines():
            records.append({"pid": pid, **json.loads(line)})
    return Run(side, records, log_path.read_text(errors="replace"), worker.pid, project)
