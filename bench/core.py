"""Workloads on the core engine's worker: the drain of async no-ops, and the latency from
enqueue to start on an idle worker."""

from __future__ import annotations

import random
import statistics
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import psycopg

from . import db, procs
from .apps.core_app import NOOP, STAMP, make_app
from .drain import REPO_ROOT, DrainResult, console_script, drain, worker_env

APP_SPEC = "bench.apps.core_app:app"


def worker_argv(url: str, slots: int, log_level: str | None = None) -> list[str]:
    """``akadze --database-url URL worker bench.apps.core_app:app --slots N``."""
    argv = [*console_script("akadze", "akadze_core.cli.main"), "--database-url", url, "worker",
            APP_SPEC, "--slots", str(slots)]
    if log_level:
        argv += ["--log-level", log_level]
    return argv


def core_drain(url: str, jobs: int, *, slots: int, run_dir: Path, log_level: str | None = None,
               timeout: float = 1800,
               on_start: Callable[[subprocess.Popen[bytes]], None] | None = None,
               label: str = "core-drain") -> DrainResult:
    """Fill ``jobs`` async no-ops, then drain them with one ``akadze worker`` (its log:
    ``run_dir/<label>-<jobs>-<slots>-<log level>.log``)."""
    db.reset(url)
    db.fill(url, jobs, task=NOOP)
    name = f"{label}-{jobs}-{slots}-{(log_level or 'default').lower()}"
    return drain(url, worker_argv(url, slots, log_level), jobs=jobs,
                 log=run_dir / f"{name}.log", timeout=timeout, on_start=on_start)


@dataclass
class LatencyResult:
    """Enqueue commit to body start, in milliseconds."""

    samples: int
    p50: float
    p99: float
    max: float
    mean: float
    enqueue_p50: float
    # Its two halves, p50: commit returned -> the claim's transaction start (the job's
    # started_at: the NOTIFY's way and the worker's wake-up), and from there to the body's
    # start (the claim itself, its answer, the run's start).
    to_claim_p50: float | None = None
    claim_to_body_p50: float | None = None


def percentile(values: list[float], fraction: float) -> float:
    """Nearest-rank percentile of ``values``."""
    ordered = sorted(values)
    rank = max(1, min(len(ordered), round(fraction * len(ordered) + 0.5)))
    return ordered[rank - 1]


def latency(url: str, samples: int, *, slots: int, run_dir: Path,
            env: dict[str, str] | None = None, cwd: Path | None = None) -> LatencyResult:
    """Enqueue one job at a time to an idle worker and time commit -> body start.

    Worker, client and Postgres share this host, hence one wall clock: the client notes
    ``time.time()`` when ``enqueue()`` has returned (the commit is done), the body returns
    ``time.time()`` at its start. Each job is enqueued only once the previous one finished
    and the worker went idle again. ``env`` and ``cwd`` are the worker's (default: this
    repository importable, the database ``url``).
    """
    db.reset(url)
    app = make_app(url)
    stamp = app.tasks[STAMP]
    log = run_dir / "latency-worker.log"
    process = procs.start(worker_argv(url, slots), log=log, env=env or worker_env(url),
                          cwd=cwd or REPO_ROOT)
    sent: list[tuple[int, float, float]] = []
    try:
        with psycopg.connect(url, autocommit=True) as connection:
            for _ in range(3):  # warm up: the worker's pools, LISTEN, the client's pool
                _wait_finished(connection, stamp.enqueue(), process, log)
            for _ in range(samples):
                time.sleep(random.uniform(0.02, 0.04))  # the worker is idle again
                before = time.time()
                job_id = stamp.enqueue()
                after = time.time()
                sent.append((job_id, before, after))
                _wait_finished(connection, job_id, process, log)
            found = connection.execute(
                "SELECT id, (result #>> '{}')::float8, extract(epoch FROM started_at)::float8"
                " FROM akadze.jobs WHERE id = ANY(%s)",
                ([job_id for job_id, _, _ in sent],)).fetchall()
    finally:
        procs.stop(process)
        app.close()
    rows = {job_id: (body, claimed) for job_id, body, claimed in found}
    delays = [(rows[job_id][0] - after) * 1000 for job_id, _, after in sent]
    enqueue = [(after - before) * 1000 for _, before, after in sent]
    to_claim = [(rows[job_id][1] - after) * 1000 for job_id, _, after in sent]
    to_body = [(body - claimed) * 1000 for body, claimed in rows.values()]
    return LatencyResult(samples=len(delays), p50=percentile(delays, 0.5),
                         p99=percentile(delays, 0.99), max=max(delays),
                         mean=statistics.fmean(delays), enqueue_p50=percentile(enqueue, 0.5),
                         to_claim_p50=percentile(to_claim, 0.5),
                         claim_to_body_p50=percentile(to_body, 0.5))


def _wait_finished(connection: psycopg.Connection, job_id: int,
                   process: subprocess.Popen[bytes],
                   log: Path, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while True:
        row = connection.execute("SELECT state FROM akadze.jobs WHERE id = %s",
                                 (job_id,)).fetchone()
        if row and row[0] not in ("queued", "running"):
            return
        if process.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"latency job {job_id} did not finish: see {log}")
        time.sleep(0.005)


__all__ = ["NOOP", "LatencyResult", "core_drain", "latency", "worker_argv"]
