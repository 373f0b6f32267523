"""10,000 runtime schedules: what one worker's scheduling costs, and whether claims wait.

Two phases on the same worker command (``akadze worker bench.apps.core_app:app --slots 10``,
which serves the ``default`` queue only), each ``seconds`` long so that it spans minute
boundaries:

1. **without** runtime schedules;
2. **with** ``count`` of them, stored through ``App.runtime_schedules.add`` before the worker
   starts: half ``every 60s`` (all tick together, at every minute), half cron expressions in
   four time zones (``*/2``, ``*/5``, a minute of every hour, a minute of every other hour).
   Their jobs go to the queue ``sched_ticks``, which no worker serves, so what is measured
   is the scheduling and not the running of those jobs.

In both, the bench enqueues a probe (``bench.stamp``, which returns the time its body
started) every 50 ms and samples the worker's CPU time (user + system, ``/proc``) every
second. The scheduling's cost is the worker's CPU per second of wall time with the schedules
minus without (the probes, heartbeats and claims cost the same in both); the worst second
(the one at a minute boundary, when 5,000 ``every 60s`` ticks and the cron ones come due) is
reported too, against the median second without. Claim latency is enqueue commit -> body
start of the probes, p50 / p99 / max in both phases, and for the probes enqueued in the two
seconds after each minute boundary. Every tick is checked to have been enqueued once.
"""

from __future__ import annotations

import itertools
import statistics
import threading
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

import psycopg

from akadze_core import Cron, Every

from . import db, procs
from .apps.core_app import STAMP, make_app
from .core import percentile, worker_argv
from .drain import REPO_ROOT, worker_env

TICK_TASK = "bench.sched_tick"
TICK_QUEUE = "sched_ticks"
PROBE_EVERY = 0.05
ZONES = ("UTC", "Europe/Berlin", "America/New_York", "Asia/Tokyo")


@dataclass
class Phase:
    """One phase's figures (milliseconds; CPU in ms per second of wall time)."""

    seconds: float
    cpu_per_second: float
    cpu_worst_second: float
    cpu_median_second: float
    probes: int
    p50: float
    p99: float
    max: float
    settle_cpu: float = 0.0  # CPU seconds from registration until quiet (the first load)
    boundary_probes: int = 0
    boundary_p99: float | None = None
    boundary_max: float | None = None


@dataclass
class SchedulesResult:
    """Both phases, and what the schedules enqueued."""

    schedules: int
    without: Phase
    with_schedules: Phase
    tick_jobs: int
    duplicate_ticks: int
    boundaries: list[str] = field(default_factory=list)

    @property
    def cpu_cost(self) -> float:
        """Scheduling CPU, ms per second of wall time (mean over the phase)."""
        return max(0.0, self.with_schedules.cpu_per_second - self.without.cpu_per_second)

    @property
    def worst_second_cost(self) -> float:
        """The worst second with schedules minus the median second without."""
        return max(0.0, self.with_schedules.cpu_worst_second - self.without.cpu_median_second)


def trigger_of(number: int) -> Every | Cron:
    """The trigger of schedule ``number``: even ones every minute, odd ones a cron."""
    if number % 2 == 0:
        return Every(60)
    minute = number % 60
    expression = ("*/2 * * * *", "*/5 * * * *", f"{minute} * * * *",
                  f"{minute} */2 * * *")[(number // 2) % 4]
    return Cron(expression, timezone=ZONES[(number // 8) % len(ZONES)])


def store_schedules(url: str, count: int) -> float:
    """Add ``count`` runtime schedules through the API, in one transaction; seconds taken."""
    app = make_app(url)
    started = time.monotonic()
    try:
        with psycopg.connect(url) as connection:
            for number in range(count):
                app.runtime_schedules.add(
                    f"bench-{number:05}", TICK_TASK, trigger=trigger_of(number),
                    args={"n": number}, queue=TICK_QUEUE, session=connection)
    finally:
        app.close()
    return time.monotonic() - started


def _sample_cpu(pid: int, stop: threading.Event, samples: list[tuple[float, float]]) -> None:
    while not stop.is_set():
        cpu = procs.cpu_seconds(pid)
        if cpu is None:
            return
        samples.append((time.time(), cpu))
        stop.wait(1.0)


def _settle(pid: int, timeout: float = 90.0) -> float:
    """Wait until the worker is quiet (two seconds in a row under 150 ms of CPU each, its
    start-up and first scheduling pass done); returns the CPU seconds spent meanwhile."""
    first = last = procs.cpu_seconds(pid) or 0.0
    quiet = 0
    deadline = time.monotonic() + timeout
    while quiet < 2 and time.monotonic() < deadline:
        time.sleep(1.0)
        now = procs.cpu_seconds(pid)
        if now is None:
            break
        quiet = quiet + 1 if now - last < 0.15 else 0
        last = now
    return last - first


def run_phase(url: str, seconds: float, *, run_dir: Path, label: str) -> tuple[Phase, list[float]]:
    """One worker, probes every ``PROBE_EVERY`` s for ``seconds``; the phase and the minute
    boundaries (epoch seconds) it spanned."""
    app = make_app(url)
    stamp = app.tasks[STAMP]
    log = run_dir / f"schedules-{label}.log"
    process = procs.start(worker_argv(url, 10), log=log, env=worker_env(url), cwd=REPO_ROOT)
    sent: list[tuple[int, float]] = []  # job id, time.time() once enqueue() returned
    cpu: list[tuple[float, float]] = []
    stop = threading.Event()
    try:
        with psycopg.connect(url, autocommit=True) as connection:
            if not procs.wait_until(lambda: connection.execute(
                    "SELECT count(*) FROM akadze.workers").fetchone() == (1,), 60):
                raise RuntimeError(f"the worker did not start: see {log}")
            settled_in = _settle(process.pid)  # its first passes: the timetable loaded
            sampler = threading.Thread(target=_sample_cpu, args=(process.pid, stop, cpu),
                                       daemon=True)
            sampler.start()
            began = time.time()
            next_probe = time.monotonic()
            while time.time() - began < seconds:
                if process.poll() is not None:
                    raise RuntimeError(f"the worker exited: see {log}")
                job_id = stamp.enqueue()
                sent.append((job_id, time.time()))
                next_probe += PROBE_EVERY
                time.sleep(max(0.0, next_probe - time.monotonic()))
            ended = time.time()
            stop.set()
            sampler.join(5)
            time.sleep(1.0)  # the last probes run
            rows = dict(connection.execute(
                "SELECT id, (result #>> '{}')::float8 FROM akadze.jobs "
                "WHERE task = %s AND state = 'succeeded'", (STAMP,)).fetchall())
    finally:
        stop.set()
        procs.stop(process)
        app.close()
    ran = [(rows[job_id], sent_at) for job_id, sent_at in sent if job_id in rows]
    if len(ran) < len(sent):
        raise RuntimeError(f"only {len(ran)} of {len(sent)} probes ran: see {log}")
    latencies = [(start - sent_at) * 1000 for start, sent_at in ran]
    boundaries = list(range(int(began // 60 + 1) * 60, int(ended), 60))
    near = [(start - sent_at) * 1000 for start, sent_at in ran
            if any(0 <= sent_at - minute < 2 for minute in boundaries)]
    per_second = [(b[1] - a[1]) * 1000 / (b[0] - a[0]) for a, b in itertools.pairwise(cpu)]
    span = cpu[-1][0] - cpu[0][0]
    phase = Phase(
        seconds=round(ended - began, 1),
        cpu_per_second=(cpu[-1][1] - cpu[0][1]) * 1000 / span,
        cpu_worst_second=max(per_second), cpu_median_second=statistics.median(per_second),
        probes=len(latencies), p50=percentile(latencies, 0.5),
        p99=percentile(latencies, 0.99), max=max(latencies),
        settle_cpu=settled_in, boundary_probes=len(near),
        boundary_p99=percentile(near, 0.99) if near else None,
        boundary_max=max(near) if near else None)
    return phase, [float(minute) for minute in boundaries]


def schedules_workload(url: str, count: int, seconds: float, *, run_dir: Path
                       ) -> SchedulesResult:
    """Both phases (see the module's docstring)."""
    db.reset(url)
    _clear_schedules(url)
    without, _ = run_phase(url, seconds, run_dir=run_dir, label="without")
    db.reset(url)
    took = store_schedules(url, count)
    print(f"[schedules] stored {count:,} runtime schedules in {took:.1f}s", flush=True)
    with_schedules, boundaries = run_phase(url, seconds, run_dir=run_dir, label="with")
    with psycopg.connect(url, autocommit=True) as connection:
        row = connection.execute(
            "SELECT count(*), count(*) - count(DISTINCT (meta->>'schedule', meta->>'tick')) "
            "FROM akadze.jobs WHERE task = %s", (TICK_TASK,)).fetchone()
    assert row is not None
    _clear_schedules(url)
    return SchedulesResult(
        schedules=count, without=without, with_schedules=with_schedules, tick_jobs=row[0],
        duplicate_ticks=row[1],
        boundaries=[datetime.fromtimestamp(b, timezone.utc).strftime("%H:%M")
                    for b in boundaries])


def _clear_schedules(url: str) -> None:
    with psycopg.connect(url, autocommit=True) as connection:
        connection.execute("DELETE FROM akadze.schedules")


__all__ = ["SchedulesResult", "schedules_workload", "store_schedules", "trigger_of"]
