"""Oban for Python (``oban`` on PyPI), for comparison: its own virtualenv and database.

Oban needs Python >= 3.12, so it never runs in this interpreter: it is installed in its own
virtualenv (``$OBAN_PYTHON``, else ``/tmp/akadze-oban-venv``, created on first use from the
first Python >= 3.12 found: ``$OBAN_BASE_PYTHON``, this interpreter, ``python3.12`` ...
``python3.15`` on PATH, pyenv's versions oldest first; ``pip install oban==0.7.0``), and
``bench/oban_real`` is executed there. When no such Python exists or the install fails,
``ObanUnavailable`` says so in one line and the workload is skipped.

A drain, in a database of its own (the bench's database name + ``_oban``, dropped and
created again for every drain): ``oban install --dsn URL`` (Oban's own schema command), N
no-ops inserted with ``Oban.enqueue_many`` (``oban_real/oban_bench_enqueue.py``), ANALYZE,
then one ``oban start --dsn URL --queues bench:<limit>`` (the CLI's defaults otherwise: INFO
log, two lines per job; a pool of 10 connections; the Basic engine of the open-source
package). The figure is ``completed / (max(completed_at) - min(attempted_at))`` read from
``oban_jobs`` after the drain: the same window as akadze's (first claim to last outcome
written, database clock), start-up and stop outside it.
"""

from __future__ import annotations

import glob
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import psycopg
from psycopg import sql

from . import db, procs
from .core import LatencyResult, percentile
from .drain import DrainError, DrainResult, Sample, _result

OBAN_VERSION = "0.7.0"
DEFAULT_VENV = Path("/tmp/akadze-oban-venv")
OBAN_DIR = Path(__file__).resolve().parent / "oban_real"
#: The drain's own database by default (the bench's prefix: ``db`` refuses any other name).
DATABASE = f"{db.DEFAULT_NAME}_oban"
QUEUE = "bench"
MIN_PYTHON = (3, 12)


class ObanUnavailable(RuntimeError):
    """Oban's virtualenv could not be made or used (the reason is one line)."""


def _version_of(python: str) -> tuple[int, int] | None:
    try:
        done = subprocess.run([python, "-c", "import sys; print(*sys.version_info[:2])"],
                              capture_output=True, text=True, timeout=30, check=False)
    except (OSError, subprocess.SubprocessError):
        return None
    parts = done.stdout.split()
    if done.returncode != 0 or len(parts) != 2:
        return None
    return int(parts[0]), int(parts[1])


def base_python() -> str | None:
    """The first Python >= 3.12 found to build the virtualenv from, or None."""
    candidates = [os.environ.get("OBAN_BASE_PYTHON"), sys.executable]
    candidates += [shutil.which(f"python3.{minor}") for minor in range(12, 16)]
    pyenv = Path(os.environ.get("PYENV_ROOT", Path.home() / ".pyenv")) / "versions"
    candidates += sorted(glob.glob(str(pyenv / "3.1[2-9]*" / "bin" / "python")))
    for candidate in candidates:
        if candidate and (version := _version_of(candidate)) and version >= MIN_PYTHON:
            return candidate
    return None


def oban_python(log: Path) -> Path:
    """The Oban virtualenv's interpreter, creating the virtualenv if needed."""
    explicit = os.environ.get("OBAN_PYTHON")
    python = Path(explicit) if explicit else DEFAULT_VENV / "bin" / "python"
    if not explicit and not python.exists():
        base = base_python()
        if base is None:
            raise ObanUnavailable("Oban needs Python >= 3.12 and none was found (set "
                                  "$OBAN_BASE_PYTHON or $OBAN_PYTHON)")
        done = procs.run([base, "-m", "venv", str(DEFAULT_VENV)], log=log, timeout=300)
        if done.returncode != 0:
            raise ObanUnavailable(f"cannot create {DEFAULT_VENV} with {base}: see {log}")
    version = oban_version(python, log)
    if version is None and not explicit:
        procs.run([str(python), "-m", "pip", "install", "-q", f"oban=={OBAN_VERSION}"],
                  log=log, timeout=900)
        version = oban_version(python, log)
    if version is None:
        raise ObanUnavailable(f"no Oban in {python}: see {log}")
    return python


def oban_version(python: Path, log: Path) -> str | None:
    """The version of Oban ``python`` imports, or None."""
    if not python.exists():
        return None
    done = procs.run([str(python), "-c", "import oban; print(oban.__version__)"], log=log,
                     timeout=120)
    return done.stdout.strip() if done.returncode == 0 else None


def _env() -> dict[str, str]:
    env = {key: value for key, value in os.environ.items()
           if key not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV") and
           not key.startswith("OBAN_")}
    env["PYTHONPATH"] = str(OBAN_DIR)
    return env


def fresh_database(admin: str, name: str) -> str:
    """Drop and create ``name`` empty (no akadze schema); returns its URL."""
    db.drop(admin, name)
    with psycopg.connect(admin, autocommit=True) as connection:
        connection.execute(sql.SQL("CREATE DATABASE {}").format(
            sql.Identifier(db.checked_name(name))))
    return db.url_for(admin, name)


def oban_drain(python: Path, admin: str, jobs: int, *, limit: int, run_dir: Path,
               label: str = "oban-drain", database: str = DATABASE,
               timeout: float = 1800) -> tuple[DrainResult, float | None]:
    """Install Oban's schema in a fresh database, enqueue ``jobs`` no-ops, drain them with
    one ``oban start`` whose queue runs ``limit`` jobs at a time; the database is dropped
    afterwards. Returns the drain and the enqueue's jobs/s (``enqueue_many``)."""
    url = fresh_database(admin, database)
    log = run_dir / f"{label}-{jobs}-{limit}.log"
    cli = [str(python), "-m", "oban"]
    env = _env()
    # cwd: the drain's own directory, so that no oban.toml is read and the CLI's search
    # for cron workers scans nothing of ours.
    work = run_dir / label
    work.mkdir(parents=True, exist_ok=True)
    try:
        done = procs.run([*cli, "install", "--dsn", url], log=log, env=env, cwd=work,
                         timeout=300)
        if done.returncode != 0:
            raise RuntimeError(f"oban install failed: see {log}")
        done = procs.run([str(python), "-m", "oban_bench_enqueue", "--dsn", url, "--jobs",
                          str(jobs)], log=log, env=env, cwd=work, timeout=timeout)
        if done.returncode != 0:
            raise RuntimeError(f"enqueueing the Oban jobs failed: see {log}")
        enqueue = json.loads(done.stdout.strip().splitlines()[-1])
        argv = [*cli, "start", "--dsn", url, "--queues", f"{QUEUE}:{limit}"]
        process = procs.start(argv, log=log, env=env, cwd=work)
        try:
            with psycopg.connect(url, autocommit=True) as connection:
                samples = _watch(process, connection, timeout, log)
                postgres_cpu = sum(procs.cpu_seconds(pid) or 0.0
                                   for pid in db.backend_pids(connection))
                procs.stop(process)
                window = drain_window(connection)
        finally:
            procs.stop(process)
    finally:
        db.drop(admin, database)
    result = _result(jobs, window, samples, postgres_cpu, log)
    if result.succeeded != jobs:
        raise DrainError(f"{result.succeeded} of {jobs} Oban jobs completed: see {log}")
    return result, (jobs / enqueue["seconds"] if enqueue["seconds"] > 0 else None)


def oban_latency(python: Path, admin: str, samples: int, *, limit: int, run_dir: Path,
                 database: str = DATABASE, timeout: float = 600) -> LatencyResult:
    """Enqueue commit -> body start on an idle ``oban start`` (queue limit ``limit``), one
    job at a time, ``samples`` times, as ``bench.core.latency`` measures akadze; in a fresh
    database, dropped afterwards."""
    url = fresh_database(admin, database)
    log = run_dir / f"oban-latency-{limit}.log"
    env = {**_env(), "BENCH_STAMP_DSN": url}
    work = run_dir / "oban-latency"
    work.mkdir(parents=True, exist_ok=True)
    try:
        done = procs.run([str(python), "-m", "oban", "install", "--dsn", url], log=log,
                         env=env, cwd=work, timeout=300)
        if done.returncode != 0:
            raise RuntimeError(f"oban install failed: see {log}")
        with psycopg.connect(url, autocommit=True) as connection:
            connection.execute("CREATE TABLE bench_stamps (job_id bigint PRIMARY KEY,"
                               " started float8 NOT NULL)")
        process = procs.start([str(python), "-m", "oban", "start", "--dsn", url, "--queues",
                               f"{QUEUE}:{limit}"], log=log, env=env, cwd=work)
        try:
            done = procs.run([str(python), "-m", "oban_bench_latency", "--dsn", url,
                              "--samples", str(samples)], log=log, env=env, cwd=work,
                             timeout=timeout)
        finally:
            procs.stop(process)
        if done.returncode != 0:
            raise RuntimeError(f"the Oban latency run failed: see {log}")
    finally:
        db.drop(admin, database)
    figures = json.loads(done.stdout.strip().splitlines()[-1])
    delays, enqueue = figures["delays_ms"], figures["enqueue_ms"]
    return LatencyResult(samples=len(delays), p50=percentile(delays, 0.5),
                         p99=percentile(delays, 0.99), max=max(delays),
                         mean=statistics.fmean(delays), enqueue_p50=percentile(enqueue, 0.5))


def unfinished(connection: psycopg.Connection) -> bool:
    """Whether any job is still to run or running (Oban's state index leads with state)."""
    row = connection.execute(
        "SELECT EXISTS (SELECT 1 FROM oban_jobs WHERE state IN"
        " ('available', 'executing', 'scheduled', 'retryable'))").fetchone()
    return bool(row and row[0])


def drain_window(connection: psycopg.Connection) -> dict[str, Any]:
    """``db.drain_window`` for ``oban_jobs``: completed count, first ``attempted_at`` (the
    claim) and last ``completed_at`` (the ack), UTC timestamps as epoch seconds."""
    row = connection.execute(
        "SELECT count(*) FILTER (WHERE state = 'completed'), count(*), count(completed_at),"
        " extract(epoch FROM min(attempted_at))::float8,"
        " extract(epoch FROM max(completed_at))::float8,"
        " extract(epoch FROM percentile_disc(0.1) WITHIN GROUP (ORDER BY completed_at))"
        "::float8,"
        " extract(epoch FROM percentile_disc(0.9) WITHIN GROUP (ORDER BY completed_at))"
        "::float8"
        " FROM oban_jobs").fetchone()
    assert row is not None
    succeeded, total, finished, first, last, tenth, ninth = row
    return {"succeeded": succeeded, "total": total, "finished": finished, "first_start": first,
            "last_finish": last, "tenth": tenth, "ninth": ninth}


def _watch(process: subprocess.Popen[bytes], connection: psycopg.Connection, timeout: float,
           log: Path) -> list[Sample]:
    samples: list[Sample] = []
    deadline = time.monotonic() + timeout
    next_check = 0.0
    while True:
        samples.append(Sample(time.time(), procs.rss_bytes(process.pid) or 0,
                              procs.cpu_seconds(process.pid) or 0.0))
        if process.poll() is not None:
            raise DrainError(f"oban start exited with code {process.returncode}: see {log}")
        now = time.monotonic()
        if now >= next_check:
            next_check = now + 0.5
            if not unfinished(connection):
                return samples
        if now > deadline:
            raise DrainError(f"the Oban drain did not finish in {timeout:.0f}s: see {log}")
        time.sleep(0.25)
