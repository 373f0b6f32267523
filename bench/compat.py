"""The Celery facade's worker, ``akadze-compat -A bench.apps.celery_app worker``.

Used only when ``akadze_compat.cli`` exists and ``akadze-compat worker --help`` works; the
table says "not available yet" otherwise. The backlog is made of one real ``delay()`` call
cloned in SQL (the rows are what ``delay()`` writes, only faster to make).
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
from pathlib import Path

from . import db, procs
from .drain import REPO_ROOT, DrainResult, drain, worker_env

APP_MODULE = "bench.apps.celery_app"


def command() -> list[str] | None:
    """How to run ``akadze-compat``: its console script, else its ``main`` (None: absent)."""
    script = Path(sys.executable).with_name("akadze-compat")
    if script.exists():
        return [str(script)]
    try:
        found = importlib.util.find_spec("akadze_compat.cli") is not None
    except ImportError:
        found = False
    if not found:
        return None
    return [sys.executable, "-c", "from akadze_compat.cli import main; main()"]


def availability(url: str, log: Path) -> tuple[list[str] | None, str]:
    """The command and "ok", or None and why the facade's worker cannot be benchmarked."""
    argv = command()
    if argv is None:
        return None, "not available yet (no akadze_compat.cli)"
    try:
        done = procs.run([*argv, "-A", APP_MODULE, "worker", "--help"], log=log,
                         env=worker_env(url), cwd=REPO_ROOT, timeout=120)
    except Exception as exc:  # the facade is being written: any failure means "not yet"
        return None, f"not available yet ({type(exc).__name__})"
    if done.returncode != 0:
        return None, f"not available yet (`akadze-compat worker --help` exit {done.returncode})"
    return argv, "ok"


def pools(options: argparse.Namespace) -> list[tuple[str, str, int]]:
    """(result key, pool, concurrency) of each drain: ``--threads``, ``--wide-threads``
    (unless 0) and ``--prefork``."""
    found = [("threads", "threads", options.threads)]
    if options.wide_threads and options.wide_threads != options.threads:
        found.append(("threads wide", "threads", options.wide_threads))
    return [*found, ("prefork", "prefork", options.prefork)]


def fill(url: str, jobs: int) -> None:
    """``jobs`` queued no-ops as ``delay()`` writes them."""
    from .apps.celery_app import NOOP, make_app

    app = make_app(url)
    try:
        result = app.tasks[NOOP].delay(0)
        job_id = result.job_id
    finally:
        app.close()
    db.clone_job(url, int(job_id), jobs - 1)


def compat_drain(url: str, argv: list[str], jobs: int, *, pool: str, concurrency: int,
                 run_dir: Path, timeout: float = 1800) -> DrainResult:
    """Fill ``jobs`` no-ops, then drain them with one ``akadze-compat worker``."""
    db.reset(url)
    fill(url, jobs)
    worker = [*argv, "-A", APP_MODULE, "worker", "-P", pool, "-c", str(concurrency)]
    return drain(url, worker, jobs=jobs, log=run_dir / f"compat-{pool}-{concurrency}.log",
                 timeout=timeout, whole_tree=pool == "prefork")
