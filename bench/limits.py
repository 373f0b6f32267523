"""Rate limits and per-key concurrency (docs/how-to/limits.md): what a limit costs when it
does not bind, whether it holds exactly under 4 workers, and how keys share the fleet.

1. **Cost.** The core drain (``core.core_drain``: one worker, async no-ops) with no limit and
   with a limit on its queue far above what it reaches, taking turns ``rounds`` times; the
   ratio of the medians' jobs/s (the brief: at least 0.8).
2. **Exactness.** ``exact_jobs`` no-ops under ``"<rate>/s"`` on their queue, drained by 4
   worker processes; from the jobs' own ``started_at`` (database clock), the most starts in
   any 1-second window [t, t + 1 s), against the rate, and the rate reached.
3. **Fairness.** One key's backlog enqueued ahead of two other keys' (max_concurrency 2 each),
   drained by 4 workers: when each key's first job started, and the starts of each key while
   all three still had jobs waiting (the least over the most: 1.0 is an even share).
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass
from pathlib import Path

import psycopg

from . import db, procs
from .apps.core_app import NOOP
from .core import core_drain, worker_argv
from .drain import REPO_ROOT, worker_env

#: A limit the single-worker drain never reaches.
NOT_BINDING = "1000000/s"
WORKERS = 4


@dataclass
class LimitsResult:
    """The three figures (see the module's docstring)."""

    free_rate: float
    limited_rate: float
    ratio: float
    exact_rate: int
    exact_most: int
    exact_reached: float
    fair_first_start: dict[str, float]
    fair_share: float
    fair_starts: dict[str, int]


def _set_limit(url: str, rate: str | None) -> None:
    # The bench's own statements, as db.fill's: the limits table, not through an App.
    with psycopg.connect(url, autocommit=True) as connection:
        connection.execute("DELETE FROM akadze.limits")
        if rate is not None:
            count, _ = rate.split("/")
            connection.execute("INSERT INTO akadze.limits (kind, name, rate, period)"
                               " VALUES ('queue', 'default', %s, interval '1 second')",
                               [int(count)])


def _fleet(url: str, run_dir: Path, label: str, slots: int, timeout: float) -> None:
    """Run WORKERS workers until no job is queued or running."""
    workers = [procs.start(worker_argv(url, slots), log=run_dir / f"{label}-{n}.log",
                           env=worker_env(url), cwd=REPO_ROOT) for n in range(WORKERS)]
    try:
        with psycopg.connect(url, autocommit=True) as connection:
            time.sleep(1.0)
            if not procs.wait_until(lambda: not db.unfinished(connection), timeout, 0.25):
                raise RuntimeError(f"{label}: the fleet did not drain in {timeout}s")
    finally:
        for worker in workers:
            procs.stop(worker)


def most_in_any_window(starts: list[float], period: float) -> int:
    """The most of ``starts`` (epoch seconds) in any window [t, t + period)."""
    starts = sorted(starts)
    best = low = 0
    for high, moment in enumerate(starts):
        while starts[low] <= moment - period:
            low += 1
        best = max(best, high - low + 1)
    return best


def _exactness(url: str, jobs: int, rate: int, run_dir: Path) -> tuple[int, float]:
    db.reset(url)
    db.fill(url, jobs, task=NOOP)
    _set_limit(url, f"{rate}/s")
    try:
        _fleet(url, run_dir, "limits-exact", 10, 60 + 3 * jobs / rate)
    finally:
        _set_limit(url, None)
    with psycopg.connect(url, autocommit=True) as connection:
        starts = [row[0] for row in connection.execute(
            "SELECT extract(epoch FROM started_at)::float8 FROM akadze.jobs")]
    span = max(starts) - min(starts)
    return most_in_any_window(starts, 1.0), (len(starts) - 1) / span if span else 0.0


def _fairness(url: str, run_dir: Path, deep: int, shallow: int
              ) -> tuple[dict[str, float], float, dict[str, int]]:
    db.reset(url)
    with psycopg.connect(url, autocommit=True) as connection:
        for key, count in (("deep", deep), ("shallow-1", shallow), ("shallow-2", shallow)):
            connection.execute(
                "INSERT INTO akadze.jobs (task, queue, args, meta)"
                " SELECT %s, 'default', jsonb_build_object('n', i),"
                "        jsonb_build_object('concurrency_key', %s::text, 'max_concurrency', 2)"
                " FROM generate_series(1, %s) AS i", [NOOP, key, count])
        connection.execute("ANALYZE akadze.jobs")
    _fleet(url, run_dir, "limits-fair", 10, 600)
    with psycopg.connect(url, autocommit=True) as connection:
        rows = connection.execute(
            "SELECT meta ->> 'concurrency_key', extract(epoch FROM started_at)::float8"
            " FROM akadze.jobs").fetchall()
    by_key: dict[str, list[float]] = {}
    for key, started in rows:
        by_key.setdefault(key, []).append(started)
    begin = min(started for _, started in rows)
    first = {key: round(min(starts) - begin, 3) for key, starts in by_key.items()}
    # While every key still had jobs waiting: up to the first key's last start.
    end = min(max(starts) for starts in by_key.values())
    counts = {key: sum(1 for started in starts if started <= end)
              for key, starts in by_key.items()}
    share = min(counts.values()) / max(counts.values()) if max(counts.values()) else 0.0
    return first, share, counts


def limits_workload(url: str, drain_jobs: int, exact_jobs: int, *, rate: int, rounds: int,
                    run_dir: Path) -> LimitsResult:
    """The three parts, in order (see the module's docstring)."""
    free: list[float] = []
    limited: list[float] = []
    for _ in range(rounds):
        _set_limit(url, None)
        free.append(core_drain(url, drain_jobs, slots=10, run_dir=run_dir,
                               label="limits-free").rate)
        _set_limit(url, NOT_BINDING)
        limited.append(core_drain(url, drain_jobs, slots=10, run_dir=run_dir,
                                  label="limits-unbound").rate)
    _set_limit(url, None)
    free_rate, limited_rate = statistics.median(free), statistics.median(limited)
    most, reached = _exactness(url, exact_jobs, rate, run_dir)
    first, share, counts = _fairness(url, run_dir, deep=1_000, shallow=200)
    return LimitsResult(free_rate=free_rate, limited_rate=limited_rate,
                        ratio=limited_rate / free_rate, exact_rate=rate, exact_most=most,
                        exact_reached=reached, fair_first_start=first, fair_share=share,
                        fair_starts=counts)


__all__ = ["LimitsResult", "limits_workload", "most_in_any_window"]
