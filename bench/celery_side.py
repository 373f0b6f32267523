"""Real Celery 5.7, for comparison: a separate virtualenv, Redis and RabbitMQ brokers.

Celery never runs in this interpreter: it is installed in its own virtualenv
(``$CELERY_PYTHON``, else ``/tmp/akadze-celery-venv``, created on first use with
``pip install celery[redis]==5.7.0``), and ``bench/celery_real`` is executed there.

A drain: purge the queue, publish N no-ops (before the worker starts), start
``celery -A celery_bench_app worker -P <pool> -c <n> --without-gossip --without-mingle
--without-heartbeat`` (results ignored), and wait until the worker processes have finished N
tasks; the rate is N over the window from the first task's start to the last task's end
(see ``celery_real/celery_bench_app.py``), so start-up and stop are outside the window, as
for akadze.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

from . import procs
from .drain import DrainResult

CELERY_VERSION = "5.7.0"
DEFAULT_VENV = Path("/tmp/akadze-celery-venv")
CELERY_DIR = Path(__file__).resolve().parent / "celery_real"

BROKERS = {
    "Redis": "redis://127.0.0.1:6379/13",
    "RabbitMQ": "amqp://guest:guest@127.0.0.1:5672//",
}


class CeleryUnavailable(RuntimeError):
    """Celery's virtualenv could not be made or used."""


def reachable(url: str, timeout: float = 1.0) -> bool:
    """Whether the broker's TCP port accepts connections."""
    parts = urlsplit(url)
    default = 6379 if parts.scheme.startswith("redis") else 5672
    try:
        with socket.create_connection((parts.hostname or "127.0.0.1", parts.port or default),
                                      timeout):
            return True
    except OSError:
        return False


def celery_python(log: Path) -> Path:
    """The Celery virtualenv's interpreter, creating the virtualenv if needed."""
    explicit = os.environ.get("CELERY_PYTHON")
    python = Path(explicit) if explicit else DEFAULT_VENV / "bin" / "python"
    if not explicit and not python.exists():
        procs.run([sys.executable, "-m", "venv", str(DEFAULT_VENV)], log=log)
    version = _celery_version(python, log)
    if version is None and not explicit:
        # kombu's Redis transport imports packaging, which celery[redis] does not pull in.
        procs.run([str(python), "-m", "pip", "install", "-q", f"celery[redis]=={CELERY_VERSION}",
                   "packaging"], log=log, timeout=900)
        version = _celery_version(python, log)
    if version is None:
        raise CeleryUnavailable(f"no Celery in {python}: see {log}")
    return python


def _celery_version(python: Path, log: Path) -> str | None:
    if not python.exists():
        return None
    # Both transports imported, not only their client libraries: a transport module may need
    # more (kombu.transport.redis imports packaging).
    done = procs.run([str(python), "-c", "import celery, kombu.transport.redis, "
                      "kombu.transport.pyamqp; print(celery.__version__)"], log=log, timeout=120)
    return done.stdout.strip() if done.returncode == 0 else None


@dataclass
class CeleryRun:
    """One Celery drain's set-up."""

    python: Path
    broker: str
    pool: str
    concurrency: int
    jobs: int
    run_dir: Path

    @property
    def name(self) -> str:
        return f"celery-{urlsplit(self.broker).scheme}-{self.pool}-{self.concurrency}"

    def env(self, stats_dir: Path, queue: str) -> dict[str, str]:
        env = {key: value for key, value in os.environ.items()
               if key not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV")}
        env.update(BENCH_BROKER_URL=self.broker, BENCH_QUEUE=queue,
                   BENCH_STATS_DIR=str(stats_dir), PYTHONPATH=str(CELERY_DIR))
        return env


def celery_drain(run: CeleryRun, timeout: float = 1800) -> DrainResult:
    """Publish ``run.jobs`` no-ops, then drain them with one Celery worker."""
    stats_dir = run.run_dir / run.name
    stats_dir.mkdir(parents=True, exist_ok=True)
    for old in stats_dir.glob("*.json"):
        old.unlink()
    queue = f"akadze_bench_{os.getpid()}"
    env = run.env(stats_dir, queue)
    log = run.run_dir / f"{run.name}.log"
    python = str(run.python)
    published = procs.run([python, "-m", "celery_bench_publish", "--jobs", str(run.jobs)],
                          log=log, env=env, cwd=stats_dir, timeout=timeout)
    if published.returncode != 0:
        raise RuntimeError(f"publishing to {run.broker} failed: see {log}")
    queued = json.loads(published.stdout)["queued"]
    if queued != run.jobs:
        raise RuntimeError(f"{queued} tasks queued after publishing {run.jobs}: see {log}")
    argv = [python, "-m", "celery", "-A", "celery_bench_app", "worker", "-P", run.pool,
            "-c", str(run.concurrency), "--without-gossip", "--without-mingle",
            "--without-heartbeat", "-Q", queue, "-n", f"{run.name}-{os.getpid()}@%h",
            "-l", "WARNING"]
    process = procs.start(argv, log=log, env=env, cwd=stats_dir)
    try:
        samples = _watch(process, stats_dir, run.jobs, timeout, log)
    finally:
        procs.stop(process)
        procs.run([python, "-m", "celery_bench_publish", "--delete"], log=log, env=env,
                  cwd=stats_dir, timeout=120)
    stats = _read_stats(stats_dir)
    first = min(s["first"] for s in stats)
    last = max(s["last"] for s in stats if s["last"] is not None)
    return DrainResult(jobs=run.jobs, succeeded=sum(s["count"] for s in stats),
                       seconds=last - first, rate=run.jobs / (last - first),
                       rss_start=samples[0] if samples else None,
                       rss_end=samples[-1] if samples else None,
                       rss_peak=max(samples) if samples else None, log=str(log))


def _read_stats(stats_dir: Path) -> list[dict[str, float]]:
    stats = []
    for path in stats_dir.glob("*.json"):
        try:
            stats.append(json.loads(path.read_text()))
        except (OSError, ValueError):
            continue  # being replaced right now; read again next time
    return stats


def _watch(process: subprocess.Popen[bytes], stats_dir: Path, jobs: int, timeout: float,
           log: Path) -> list[int]:
    """Wait until the worker processes report ``jobs`` finished; returns RSS samples of
    the worker's process tree."""
    deadline = time.monotonic() + timeout
    rss: list[int] = []
    while True:
        done = sum(int(s["count"]) for s in _read_stats(stats_dir))
        if done >= jobs:
            time.sleep(0.25)  # the last flush of every process
            return rss
        if process.poll() is not None:
            raise RuntimeError(f"the Celery worker exited with code {process.returncode}: "
                               f"see {log}")
        if time.monotonic() > deadline:
            raise RuntimeError(f"the Celery drain did not finish in {timeout:.0f}s: see {log}")
        rss.append(sum(procs.rss_bytes(pid) or 0 for pid in procs.tree(process.pid)))
        time.sleep(0.1)
