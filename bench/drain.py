"""Drain a pre-filled backlog with one worker subprocess and measure it from the database.

The figure is ``succeeded jobs / (last outcome written - first job claimed)``, both read from
the jobs table (``started_at``, ``finished_at``; database clock) after the drain: interpreter
start-up, imports and the stop are outside the window, and nothing is polled heavily while
the worker runs (two partial-index probes every half second to see the end, and /proc).
The worker's memory and CPU are sampled from /proc meanwhile; the CPU of the Postgres
backends serving it is read just before it stops.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import psycopg

from . import db, procs

REPO_ROOT = Path(__file__).resolve().parent.parent


class DrainError(RuntimeError):
    """The drain did not finish (the worker died, or the timeout passed)."""


@dataclass
class Sample:
    """One look at the worker process (tree)."""

    at: float
    rss: int
    cpu: float


@dataclass
class DrainResult:
    """What one drain measured."""

    jobs: int
    succeeded: int
    seconds: float
    rate: float
    rate_first: float | None = None  # jobs/s over the first tenth of the jobs finished
    rate_last: float | None = None   # ... and over the last tenth
    rss_first: int | None = None
    rss_start: int | None = None
    rss_end: int | None = None
    rss_peak: int | None = None
    worker_cpu: float | None = None
    postgres_cpu: float | None = None
    log: str = ""
    samples: list[Sample] = field(default_factory=list, repr=False)

    def as_dict(self) -> dict[str, Any]:
        """The figures, without the samples."""
        values = asdict(self)
        values.pop("samples")
        return values


def worker_env(url: str, extra: dict[str, str] | None = None) -> dict[str, str]:
    """The environment of a worker subprocess: the bench database, the repo importable."""
    env = dict(os.environ)
    env["AKADZE_DATABASE_URL"] = url
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO_ROOT),
                                                      env.get("PYTHONPATH")]))
    env.update(extra or {})
    return env


def console_script(name: str, module: str) -> list[str]:
    """The console script ``name`` of this interpreter, or ``python -m module``."""
    script = Path(sys.executable).with_name(name)
    return [str(script)] if script.exists() else [sys.executable, "-m", module]


#: Seconds between samples for the first ``FAST_SAMPLING`` seconds of a drain's worker.
FAST_SAMPLE = 0.01
FAST_SAMPLING = 5.0


def drain(url: str, argv: Sequence[str], *, jobs: int, log: Path, timeout: float,
          whole_tree: bool = False, env: dict[str, str] | None = None,
          on_start: Callable[[subprocess.Popen[bytes]], None] | None = None,
          cwd: Path | None = None, after_id: int = 0) -> DrainResult:
    """Start ``argv`` on a database holding ``jobs`` queued jobs; return when all ended.

    With ``after_id`` the drain is of the jobs of ids above it only: those below are a
    backlog the worker is not meant to finish (queued for later), which stays.

    ``on_start`` is called with the worker process at once (the profiler attaches there).
    ``cwd`` (default: this repository) matters to an interpreter that puts it on its path.
    """
    process = procs.start(argv, log=log, env=env or worker_env(url), cwd=cwd or REPO_ROOT)
    try:
        if on_start is not None:
            on_start(process)
        with psycopg.connect(url, autocommit=True) as connection:
            samples = _watch(process, connection, timeout, whole_tree, log, after_id)
            postgres_cpu = _backends_cpu(connection)
            procs.stop(process)
            window = db.drain_window(connection, after_id)
    finally:
        procs.stop(process)
    return _result(jobs, window, samples, postgres_cpu, log)


def _watch(process: subprocess.Popen[bytes], connection: psycopg.Connection, timeout: float,
           whole_tree: bool, log: Path, after_id: int = 0) -> list[Sample]:
    samples: list[Sample] = []
    started = time.monotonic()
    deadline = started + timeout
    next_check = next_tree = 0.0
    pids = [process.pid]
    while True:
        if whole_tree and time.monotonic() >= next_tree:
            # A walk of /proc takes a millisecond: not at every fast sample.
            next_tree = time.monotonic() + 0.25
            pids = procs.tree(process.pid)
        rss = sum(procs.rss_bytes(pid) or 0 for pid in pids)
        cpu = sum(procs.cpu_seconds(pid) or 0.0 for pid in pids)
        samples.append(Sample(time.time(), rss, cpu))
        if process.poll() is not None:
            raise DrainError(f"the worker exited with code {process.returncode}: see {log}")
        now = time.monotonic()
        if now >= next_check:
            next_check = now + 0.5
            if not db.unfinished(connection, after_id):
                return samples
        if now > deadline:
            raise DrainError(f"the drain did not finish in {timeout:.0f}s: see {log}")
        # Often while a short drain may begin: the worker's CPU is read from the last
        # sample before its first claim, and a quarter-second step there counted up to a
        # quarter second of its start-up into a one-second drain.
        time.sleep(FAST_SAMPLE if now - started < FAST_SAMPLING else 0.25)


def _backends_cpu(connection: psycopg.Connection) -> float:
    return sum(procs.cpu_seconds(pid) or 0.0 for pid in db.backend_pids(connection))


def _result(jobs: int, window: dict[str, Any], samples: list[Sample],
            postgres_cpu: float, log: Path) -> DrainResult:
    first, last = window["first_start"], window["last_finish"]
    if first is None or last is None or last <= first:
        raise DrainError(f"no job ran: see {log}")
    seconds = last - first
    inside = [s for s in samples if first <= s.at <= last + 0.5] or samples[-1:]
    # "Start" is taken a tenth into the drain: after the pools, caches and the first claims
    # have settled, so start-to-end growth is what a long drain adds.
    settled = [s for s in inside if s.at >= first + 0.1 * seconds] or inside
    before = [s for s in samples if s.at <= first] or samples[:1]
    return DrainResult(
        jobs=jobs, succeeded=window["succeeded"], seconds=seconds,
        rate=window["succeeded"] / seconds,
        rate_first=_tenth_rate(window, first, window.get("tenth")),
        rate_last=_tenth_rate(window, window.get("ninth"), last),
        rss_first=inside[0].rss, rss_start=settled[0].rss, rss_end=inside[-1].rss,
        rss_peak=max(s.rss for s in inside), worker_cpu=inside[-1].cpu - before[-1].cpu,
        postgres_cpu=postgres_cpu, log=str(log), samples=samples)


def _tenth_rate(window: dict[str, Any], start: float | None,
                end: float | None) -> float | None:
    """Jobs/s over a tenth of the finished jobs done between ``start`` and ``end``."""
    if start is None or end is None or end <= start or not window.get("finished"):
        return None
    return 0.1 * window["finished"] / (end - start)
