"""``python -m bench.hotpath``: the three hot-path figures.

Each cell runs on a fresh private Postgres 15 cluster (``initdb`` in a temporary directory,
a free port of 127.0.0.1, the server's stock postgresql.conf with only where it listens
changed: stock autovacuum), stopped and deleted afterwards:

- **drain**: ``--drain-jobs`` queued async no-ops (generated in SQL, ANALYZE, CHECKPOINT)
  drained by the real CLI, ``akadze worker bench.apps.core_app:app --slots 64 --log-level
  WARNING``. Completions per second over the first minute and over the last minute, from the
  jobs' ``finished_at`` (database clock), and the series per 10 s; the akadze tables' dead
  tuples and autovacuum counts every 10 s. Target: last ≥ 0.9 x first.
- **idle**: a producer offering ``--idle-rate`` jobs/s (paced on elapsed time), one worker
  ``--slots 64`` (``bench.hotpath_worker``: the CLI's own worker with every claim statement
  timed), a warm-up, then ``--idle-seconds`` with a session idle in transaction (``BEGIN;
  SELECT txid_current();``) pinning the MVCC horizon, then a phase after its release. Per
  10 s: offered and completed rates, queue depth, pickup latency (``started_at -
  scheduled_at``) and claim statement latency. Targets: claim p99 < 20 ms in every window of
  the held phase; completed ≥ 95 % of offered over the held phase.
- **claim**: ``claim_jobs(limit=10)`` p50/p99 (bench/claim.py) with 10,000 due jobs and no
  history vs behind ``--claim-history`` jobs a real worker ran to success, vacuumed and
  analyzed; for information also behind as many just-finished (marked succeeded in SQL) not
  vacuumed. Target: history p50 ≤ 1.5 x empty p50.

The table is printed and written to ``--results`` (bench/hotpath_results.md) with the
machine and the load average during each cell; the raw figures and every log stay in
``--run-dir``. Exit code 0 when every cell ran, whatever the verdicts.

The bench uses only the CLI, the Worker the CLI starts and ``database.claim_jobs``, and
reads the outcome from ``akadze.jobs`` (``JOBS``): it measures whatever storage the code it
runs on has.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import json
import os
import platform
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import psycopg

from . import claim, core, db, drain, procs
from .apps.core_app import NOOP
from .pgjqb.native import DEFAULT_PG_BIN, NativePostgres, private_cluster

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_RESULTS = ROOT / "bench" / "hotpath_results.md"
DATABASE = "akadze_bench_hotpath"
APP = "bench.apps.core_app:app"
#: Where finished jobs are read from (their started_at, finished_at, created_at).
JOBS = "akadze.jobs"
CELLS = ("drain", "idle", "claim")
DRAIN_TARGET = 0.9
CLAIM_P99_TARGET_MS = 20.0
HELD_COMPLETION_TARGET = 0.95
CLAIM_RATIO_TARGET = 1.5


# --- the machine, the cluster, the sampler -------------------------------------------------

def machine() -> dict[str, Any]:
    """What the figures ran on."""
    model = ""
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    return {"cores": os.cpu_count(), "cpu": model, "python": platform.python_version(),
            "kernel": platform.release(), "load_at_start": procs.load_average()}


@contextlib.contextmanager
def cluster(pg_bin: Path, log: Callable[[str], None]) -> Iterator[NativePostgres]:
    """A fresh private cluster (stock settings), stopped and deleted on the way out."""
    with private_cluster(pg_bin, "akadze-hotpath-pg-") as server:
        log(f"private cluster on port {server.port} ({server.root.parent})")
        yield server


def table_stats(connection: psycopg.Connection) -> dict[str, dict[str, int]]:
    """Live/dead tuples and (auto)vacuum counts of every table of the akadze schema."""
    rows = connection.execute(
        "SELECT relname, n_live_tup, n_dead_tup, autovacuum_count, autoanalyze_count,"
        "       vacuum_count"
        " FROM pg_stat_user_tables WHERE schemaname = 'akadze' ORDER BY relname").fetchall()
    return {name: {"live": live, "dead": dead, "autovacuum": autovacuum,
                   "autoanalyze": autoanalyze, "vacuum": vacuum}
            for name, live, dead, autovacuum, autoanalyze, vacuum in rows}


def server_stats(connection: psycopg.Connection) -> dict[str, Any]:
    """WAL, checkpoint and buffer counters, and the vacuums running now (what a drain's
    dips are read against)."""
    wal = connection.execute(
        "SELECT wal_records, wal_fpi, wal_bytes::bigint, wal_buffers_full FROM pg_stat_wal"
    ).fetchone()
    bgwriter = connection.execute(
        "SELECT checkpoints_timed + checkpoints_req, buffers_checkpoint, buffers_clean,"
        "       buffers_backend, buffers_alloc FROM pg_stat_bgwriter").fetchone()
    vacuums = connection.execute(
        "SELECT c.relname, p.phase FROM pg_stat_progress_vacuum p"
        " JOIN pg_class c ON c.oid = p.relid").fetchall()
    assert wal is not None and bgwriter is not None
    return {"wal_records": wal[0], "wal_fpi": wal[1], "wal_bytes": wal[2],
            "wal_buffers_full": wal[3], "checkpoints": bgwriter[0],
            "buffers_checkpoint": bgwriter[1], "buffers_clean": bgwriter[2],
            "buffers_backend": bgwriter[3], "buffers_alloc": bgwriter[4],
            "vacuuming": [f"{name}:{phase}" for name, phase in vacuums]}


def queue_depth(connection: psycopg.Connection) -> int:
    """Jobs queued and due now."""
    row = connection.execute(f"SELECT count(*) FROM {JOBS}"
                             " WHERE state = 'queued' AND scheduled_at <= now()").fetchone()
    return int(row[0]) if row else 0


class Sampler:
    """Every ``interval`` s, on a connection of its own: the load average, the akadze
    tables' statistics and (``depth``) the queue depth, each stamped with the epoch."""

    def __init__(self, url: str, interval: float, depth: bool = False) -> None:
        self.url = url
        self.interval = interval
        self.depth = depth
        self.samples: list[dict[str, Any]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="hotpath-sampler", daemon=True)

    def start(self) -> Sampler:
        """Begin sampling (one sample at once)."""
        self._thread.start()
        return self

    def stop(self) -> list[dict[str, Any]]:
        """Stop after one last sample; returns every sample."""
        self._stop.set()
        self._thread.join(30)
        return self.samples

    def _run(self) -> None:
        with psycopg.connect(self.url, autocommit=True) as connection:
            connection.execute("SET statement_timeout = '5s'")
            next_at = time.time()
            while True:
                self.samples.append(self._sample(connection))
                next_at += self.interval
                if self._stop.wait(max(0.0, next_at - time.time())):
                    self.samples.append(self._sample(connection))
                    return

    def _sample(self, connection: psycopg.Connection) -> dict[str, Any]:
        sample: dict[str, Any] = {"at": time.time(), "load1": os.getloadavg()[0]}
        try:
            sample["tables"] = table_stats(connection)
            sample["server"] = server_stats(connection)
            if self.depth:
                sample["depth"] = queue_depth(connection)
        except psycopg.Error as exc:  # a slow probe must not end the cell
            sample["error"] = str(exc)
        return sample


def load_summary(samples: list[dict[str, Any]]) -> dict[str, float]:
    """Mean and max of the 1-minute load average over a cell's samples."""
    loads = [s["load1"] for s in samples] or [os.getloadavg()[0]]
    return {"mean": sum(loads) / len(loads), "max": max(loads)}


def percentile(values: list[float], q: float) -> float | None:
    """bench.core's nearest-rank ``q`` quantile of ``values``; None when empty (a window
    without claims)."""
    return core.percentile(values, q) if values else None


# --- drain ------------------------------------------------------------------------------------

@dataclass
class DrainCell:
    """The drain's figures."""

    jobs: int
    succeeded: int
    seconds: float
    rate: float
    window: float  # seconds of the first and the last window (60; half a short drain)
    first_rate: float
    last_rate: float
    ratio: float
    bucket: float
    series: list[tuple[float, float]]  # (seconds since the first claim, completions/s)
    stats: list[dict[str, Any]]  # (seconds since the first claim, load, tables)
    load: dict[str, float]
    worker_cpu: float | None
    postgres_cpu: float | None
    fill_seconds: float


def drain_cell(server: NativePostgres, jobs: int, slots: int, bucket: float, run_dir: Path,
               log: Callable[[str], None]) -> DrainCell:
    """Fill ``jobs`` no-ops, drain them with the CLI, read the figures from the table."""
    url = db.recreate(server.url(), DATABASE)
    started = time.monotonic()
    db.fill(url, jobs, task=NOOP)  # ANALYZEs
    with psycopg.connect(url, autocommit=True) as connection:
        connection.execute("CHECKPOINT")
    fill_seconds = time.monotonic() - started
    log(f"drain: {jobs:,} jobs generated in {fill_seconds:.1f}s; the worker starts")
    sampler = Sampler(url, bucket)
    argv = [*drain.console_script("akadze", "akadze_core.cli.main"), "--database-url", url,
            "worker", APP, "--slots", str(slots), "--log-level", "WARNING"]
    try:
        result = drain.drain(url, argv, jobs=jobs, log=run_dir / "drain-worker.log",
                             timeout=600 + jobs / 200, on_start=lambda _p: _start(sampler))
    finally:
        samples = sampler.stop()
    with psycopg.connect(url, autocommit=True) as connection:
        first, last = _drain_bounds(connection)
        seconds = last - first
        window = min(60.0, seconds / 2)  # a minute, unless the drain is under two
        first_count = _count_finished(connection, first, first + window)
        last_count = _count_finished(connection, last - window, last + 1)
        series = _completion_series(connection, first, last, bucket)
    first_rate, last_rate = first_count / window, last_count / window
    stats = [{"t": round(s["at"] - first, 1), "load1": s["load1"],
              "tables": s.get("tables", {}), "server": s.get("server", {})}
             for s in samples]
    return DrainCell(
        jobs=jobs, succeeded=result.succeeded, seconds=seconds, rate=result.rate,
        window=window, first_rate=first_rate, last_rate=last_rate,
        ratio=last_rate / first_rate if first_rate else 0.0, bucket=bucket, series=series,
        stats=stats, load=load_summary(samples), worker_cpu=result.worker_cpu,
        postgres_cpu=result.postgres_cpu, fill_seconds=fill_seconds)


def _start(sampler: Sampler) -> None:
    sampler.start()


def _drain_bounds(connection: psycopg.Connection) -> tuple[float, float]:
    row = connection.execute(
        f"SELECT extract(epoch FROM min(started_at))::float8,"
        f"       extract(epoch FROM max(finished_at))::float8 FROM {JOBS}").fetchone()
    if row is None or row[0] is None or row[1] is None:
        raise RuntimeError("no job ran")
    return float(row[0]), float(row[1])


def _count_finished(connection: psycopg.Connection, start: float, end: float) -> int:
    row = connection.execute(
        f"SELECT count(*) FROM {JOBS}"
        " WHERE finished_at >= to_timestamp(%s) AND finished_at < to_timestamp(%s)",
        (start, end)).fetchone()
    return int(row[0]) if row else 0


def _completion_series(connection: psycopg.Connection, first: float, last: float,
                       bucket: float) -> list[tuple[float, float]]:
    """Completions/s per ``bucket`` s since ``first`` (the last, partial bucket by its own
    length)."""
    rows: dict[int, int] = dict(connection.execute(
        f"SELECT floor((extract(epoch FROM finished_at) - %(first)s) / %(bucket)s)::int,"
        f"       count(*) FROM {JOBS} WHERE finished_at IS NOT NULL GROUP BY 1",
        {"first": first, "bucket": bucket}).fetchall())
    series = []
    buckets = int((last - first) // bucket) + 1
    for index in range(buckets):
        length = min(bucket, last - first - index * bucket) or bucket
        series.append((index * bucket, rows.get(index, 0) / max(length, 1e-3)))
    return series


# --- idle in transaction ----------------------------------------------------------------------

@dataclass
class IdleWindow:
    """One window of the idle cell."""

    start: float  # seconds since the producer started
    phase: str
    offered: float
    completed: float
    depth: int | None
    pickup_p50: float | None
    pickup_p99: float | None
    claims: int
    claim_p50: float | None
    claim_p99: float | None
    claim_max: float | None
    lag_p99: float | None = None  # the worker's event loop: how late a 10 ms sleep woke
    lag_max: float | None = None


@dataclass
class IdleCell:
    """The idle cell's figures."""

    rate: float
    warmup: float
    held: float
    after: float
    window: float
    windows: list[IdleWindow]
    held_offered: float
    held_completed: float
    held_ratio: float
    held_claim_p99_worst: float | None
    held_pickup_p99_worst: float | None
    max_depth: int | None
    horizon_xid: int
    load: dict[str, float]
    stats: list[dict[str, Any]] = field(default_factory=list)


def idle_cell(server: NativePostgres, rate: float, warmup: float, held: float, after: float,
              slots: int, window: float, run_dir: Path,
              log: Callable[[str], None]) -> IdleCell:
    """Producer + timed worker; a session idle in transaction for the held phase."""
    url = db.recreate(server.url(), DATABASE)
    claims_file = run_dir / "idle-claims.json"
    env = drain.worker_env(url)
    worker = procs.start(
        [sys.executable, "-m", "bench.hotpath_worker", str(claims_file), "--database-url", url,
         "worker", APP, "--slots", str(slots), "--log-level", "WARNING"],
        log=run_dir / "idle-worker.log", env=env, cwd=ROOT)
    producer = None
    holder: psycopg.Connection | None = None
    total = warmup + held + after
    try:
        with psycopg.connect(url, autocommit=True) as connection:
            if not procs.wait_until(lambda: _registered(connection) or worker.poll() is not None,
                                    60):
                raise RuntimeError("the worker did not register within 60s")
            if worker.poll() is not None:
                raise RuntimeError(f"the worker exited with {worker.returncode}: see the log")
        sampler = Sampler(url, window, depth=True)
        # It runs past the cell's end (stopped then), and the cell starts with its first
        # job: neither the interpreter's start-up nor the stop is in a window.
        producer = procs.start(
            [sys.executable, "-m", "bench.hotpath_producer", url, str(rate), str(total + 30)],
            log=run_dir / "idle-producer.log", env=env, cwd=ROOT)
        with psycopg.connect(url, autocommit=True) as connection:
            if not procs.wait_until(lambda: _offered(connection) or producer.poll() is not None,
                                    60, 0.02) or producer.poll() is not None:
                raise RuntimeError("the producer enqueued nothing: see its log")
        t0 = time.time()
        sampler.start()
        log(f"idle: {rate:g} jobs/s offered; warm-up {warmup:g}s")
        _sleep_until(t0 + warmup, worker)
        holder = psycopg.connect(url, autocommit=True)
        holder.execute("BEGIN")
        xid_row = holder.execute("SELECT txid_current()").fetchone()
        horizon_xid = int(xid_row[0]) if xid_row else 0
        log(f"idle: session idle in transaction (xid {horizon_xid}) for {held:g}s")
        _sleep_until(t0 + warmup + held, worker)
        holder.execute("ROLLBACK")
        holder.close()
        holder = None
        log(f"idle: released; {after:g}s after")
        _sleep_until(t0 + total, worker)
        samples = sampler.stop()
        procs.stop(producer)
        procs.stop(worker)  # SIGTERM: the runner writes its claim times on the way out
        timings = json.loads(claims_file.read_text())
        with psycopg.connect(url, autocommit=True) as connection:
            windows = _idle_windows(connection, t0, warmup, held, total, window, samples,
                                    timings["seconds"], timings.get("loop_lag", {}))
    finally:
        if holder is not None:
            holder.close()
        if producer is not None:
            procs.stop(producer)
        procs.stop(worker)
    held_windows = [w for w in windows if w.phase == "held"]
    held_offered = sum(w.offered for w in held_windows)
    held_completed = sum(w.completed for w in held_windows)
    claim_p99s = [w.claim_p99 for w in held_windows if w.claim_p99 is not None]
    pickup_p99s = [w.pickup_p99 for w in held_windows if w.pickup_p99 is not None]
    depths = [w.depth for w in windows if w.depth is not None]
    return IdleCell(
        rate=rate, warmup=warmup, held=held, after=after, window=window, windows=windows,
        held_offered=held_offered / max(1, len(held_windows)),
        held_completed=held_completed / max(1, len(held_windows)),
        held_ratio=held_completed / held_offered if held_offered else 0.0,
        held_claim_p99_worst=max(claim_p99s) if claim_p99s else None,
        held_pickup_p99_worst=max(pickup_p99s) if pickup_p99s else None,
        max_depth=max(depths) if depths else None, horizon_xid=horizon_xid,
        load=load_summary(samples),
        stats=[{"t": round(s["at"] - t0, 1), "load1": s["load1"], "depth": s.get("depth"),
                "tables": s.get("tables", {})} for s in samples])


def _registered(connection: psycopg.Connection) -> bool:
    row = connection.execute("SELECT count(*) FROM akadze.workers").fetchone()
    return bool(row and row[0])


def _offered(connection: psycopg.Connection) -> bool:
    return connection.execute(f"SELECT EXISTS (SELECT FROM {JOBS})").fetchone() == (True,)


def _sleep_until(deadline: float, worker: Any) -> None:
    while (left := deadline - time.time()) > 0:
        if worker.poll() is not None:
            raise RuntimeError(f"the worker exited with {worker.returncode} during the cell")
        time.sleep(min(left, 0.5))


def _idle_windows(connection: psycopg.Connection, t0: float, warmup: float, held: float,
                  total: float, window: float, samples: list[dict[str, Any]],
                  claims: dict[str, dict[str, Any]],
                  lag: dict[str, dict[str, Any]]) -> list[IdleWindow]:
    params = {"t0": t0, "w": window, "end": t0 + total}

    def per_window(column: str) -> dict[int, int]:
        return dict(connection.execute(
            f"SELECT floor((extract(epoch FROM {column}) - %(t0)s) / %(w)s)::int, count(*)"
            f" FROM {JOBS} WHERE {column} >= to_timestamp(%(t0)s)"
            f"   AND {column} < to_timestamp(%(end)s) GROUP BY 1", params).fetchall())

    offered, completed = per_window("created_at"), per_window("finished_at")
    pickup = {index: (p50, p99) for index, p50, p99 in connection.execute(
        "SELECT floor((extract(epoch FROM started_at) - %(t0)s) / %(w)s)::int,"
        " percentile_cont(0.5) WITHIN GROUP (ORDER BY"
        "   extract(epoch FROM started_at - scheduled_at) * 1000),"
        " percentile_cont(0.99) WITHIN GROUP (ORDER BY"
        "   extract(epoch FROM started_at - scheduled_at) * 1000)"
        f" FROM {JOBS} WHERE started_at >= to_timestamp(%(t0)s)"
        "   AND started_at < to_timestamp(%(end)s) GROUP BY 1", params).fetchall()}
    windows = []
    for index in range(int(total // window)):
        start = index * window
        end = start + window
        phase = ("warm-up" if end <= warmup else "held" if start >= warmup and
                 end <= warmup + held else "after" if start >= warmup + held else "mixed")
        # The depth sampled closest to the window's end.
        near = [s for s in samples if "depth" in s and abs(s["at"] - (t0 + end)) < window / 2]
        span = [str(second) for second in range(int(t0 + start), int(t0 + end))]
        seconds = [claims[second] for second in span if second in claims]
        durations = [ms for bucket in seconds for ms in bucket["sample"]]
        lags = [lag[second] for second in span if second in lag]
        p50s = pickup.get(index, (None, None))
        windows.append(IdleWindow(
            start=start, phase=phase, offered=offered.get(index, 0) / window,
            completed=completed.get(index, 0) / window,
            depth=near[0]["depth"] if near else None,
            pickup_p50=p50s[0], pickup_p99=p50s[1],
            claims=sum(bucket["count"] for bucket in seconds),
            claim_p50=percentile(durations, 0.5), claim_p99=percentile(durations, 0.99),
            claim_max=max((bucket["max"] for bucket in seconds), default=None),
            lag_p99=percentile([ms for bucket in lags for ms in bucket["sample"]], 0.99),
            lag_max=max((bucket["max"] for bucket in lags), default=None)))
    return windows


# --- claim cost -------------------------------------------------------------------------------

@dataclass
class ClaimCell:
    """The claim cell's figures (milliseconds per ``claim_jobs(limit=10)``)."""

    due: int
    history: int
    claims: int
    results: dict[str, dict[str, Any]]
    ratio_p50: float
    ratio_p99: float
    history_drain: dict[str, Any] | None
    load: dict[str, float]


def claim_cell(server: NativePostgres, due: int, history: int, claims: int, slots: int,
               run_dir: Path, log: Callable[[str], None]) -> ClaimCell:
    """Empty history vs a worker-made history (vacuumed) vs an SQL-made one (not)."""
    drained: dict[str, Any] = {}

    def worker_history(url: str) -> None:
        db.fill(url, history, task=NOOP, queue=claim.QUEUE)
        argv = [*drain.console_script("akadze", "akadze_core.cli.main"), "--database-url", url,
                "worker", APP, "--queue", claim.QUEUE, "--slots", str(slots),
                "--log-level", "WARNING"]
        log(f"claim: {history:,} jobs run to success by `akadze worker` for the history")
        result = drain.drain(url, argv, jobs=history, log=run_dir / "claim-history.log",
                             timeout=600 + history / 200)
        drained.update(result.as_dict())
        with psycopg.connect(url, autocommit=True) as connection:
            connection.execute(f"VACUUM ANALYZE {JOBS}")

    scenarios = [
        claim.Scenario("empty", backlog=due),
        claim.Scenario("history", backlog=due, setup=worker_history),
        claim.Scenario("unvacuumed", backlog=due, finished=history),
    ]
    started = time.time()
    sampler = Sampler(server.url(), 10.0).start()  # the load average, for the record
    try:
        results = claim.claim_latency(server.url(), DATABASE, scenarios, claims=claims,
                                      limit=10)
    finally:
        samples = sampler.stop()
    log(f"claim: {claims} claims per scenario in {time.time() - started:.0f}s")
    figures = {name: asdict(result) for name, result in results.items()}
    empty, hist = results["empty"], results["history"]
    return ClaimCell(due=due, history=history, claims=claims, results=figures,
                     ratio_p50=hist.p50 / empty.p50, ratio_p99=hist.p99 / empty.p99,
                     history_drain=drained or None, load=load_summary(samples))


# --- the table --------------------------------------------------------------------------------

def _ms(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.2f}"


def _verdict(ok: bool | None) -> str:
    return "n/a" if ok is None else ("pass" if ok else "FAIL")


def summary_rows(figures: dict[str, Any]) -> list[tuple[str, str, str, str]]:
    """(figure, value, target, verdict) for every cell that ran."""
    rows = []
    if (d := figures.get("drain")) is not None:
        rows += [
            (f"drain: {d.jobs:,} no-ops, `--slots` {figures['options']['slots']}, "
             f"overall", f"{d.rate:,.0f} jobs/s in {d.seconds:.1f}s", "", ""),
            (f"drain: first {d.window:.0f}s", f"{d.first_rate:,.0f} jobs/s", "", ""),
            (f"drain: last {d.window:.0f}s", f"{d.last_rate:,.0f} jobs/s",
             f"≥ {DRAIN_TARGET:.1f} x first", ""),
            ("drain: last / first", f"{d.ratio:.2f}", f"≥ {DRAIN_TARGET}",
             _verdict(d.ratio >= DRAIN_TARGET)),
            ("drain: slowest full 10 s / first minute (info: autovacuum's sawtooth)",
             _slowest(d), "", ""),
            ("drain: peak dead tuples (akadze.jobs)", f"{_peak_dead(d.stats):,}", "", ""),
            ("drain: autovacuums of akadze.jobs during the drain",
             str(_autovacuums(d.stats)), "", ""),
        ]
    if (i := figures.get("idle")) is not None:
        rows += [
            (f"idle: offered over the held {i.held:g}s", f"{i.held_offered:,.0f} jobs/s",
             f"{i.rate:g} jobs/s", ""),
            ("idle: completed / offered, held phase", f"{i.held_ratio:.3f}",
             f"≥ {HELD_COMPLETION_TARGET}", _verdict(i.held_ratio >= HELD_COMPLETION_TARGET)),
            ("idle: worst claim p99 of a held window (ms)", _ms(i.held_claim_p99_worst),
             f"< {CLAIM_P99_TARGET_MS:g}",
             _verdict(None if i.held_claim_p99_worst is None
                      else i.held_claim_p99_worst < CLAIM_P99_TARGET_MS)),
            ("idle: worst pickup p99 of a held window (ms)", _ms(i.held_pickup_p99_worst),
             "", ""),
            ("idle: worst loop lag p99 of a held window (ms, info)",
             _ms(max((w.lag_p99 for w in i.windows if w.phase == "held"
                      and w.lag_p99 is not None), default=None)), "", ""),
            ("idle: largest queue depth", "n/a" if i.max_depth is None else f"{i.max_depth:,}",
             "", ""),
        ]
    if (c := figures.get("claim")) is not None:
        for name, label in (("empty", f"{c.due:,} due, empty history"),
                            ("history", f"{c.due:,} due behind {c.history:,} run by a "
                                        f"worker, vacuumed"),
                            ("unvacuumed", f"{c.due:,} due behind {c.history:,} just "
                                           f"finished, not vacuumed (info)")):
            r = c.results[name]
            rows.append((f"claim: {label}", f"p50 {r['p50']:.2f} / p99 {r['p99']:.2f} ms",
                         "", ""))
        rows.append(("claim: history / empty, p50", f"{c.ratio_p50:.2f}",
                     f"≤ {CLAIM_RATIO_TARGET}", _verdict(c.ratio_p50 <= CLAIM_RATIO_TARGET)))
        rows.append(("claim: history / empty, p99 (info)", f"{c.ratio_p99:.2f}", "", ""))
    return rows


def _slowest(d: DrainCell) -> str:
    full = d.series[:-1] or d.series  # the last bucket is partial
    at, slowest = min(full, key=lambda point: point[1])
    ratio = slowest / d.first_rate if d.first_rate else 0.0
    return f"{ratio:.2f} ({slowest:,.0f} jobs/s at {at:.0f} s)"


def _jobs_stats(sample: dict[str, Any]) -> dict[str, int]:
    return sample.get("tables", {}).get("jobs", {})


def _peak_dead(stats: list[dict[str, Any]]) -> int:
    return max((_jobs_stats(s).get("dead", 0) for s in stats), default=0)


def _autovacuums(stats: list[dict[str, Any]]) -> int:
    counts = [_jobs_stats(s).get("autovacuum", 0) for s in stats if _jobs_stats(s)]
    return counts[-1] - counts[0] if counts else 0


def render(figures: dict[str, Any]) -> str:
    """The results as markdown: the summary, then each cell's series."""
    m = figures["machine"]
    lines = [
        "# Hot-path figures",
        "",
        f"Run {figures['when']} by `python -m bench.hotpath {' '.join(figures['argv'])}`"
        f" on {figures.get('commit', '?')}.",
        f"Machine: {m['cores']} cores ({m['cpu']}), Python {m['python']}, "
        f"kernel {m['kernel']}; shared with other work, so the figures are noisy. "
        f"Each cell on a fresh private Postgres {figures.get('server_version', '15')} cluster "
        "with the stock postgresql.conf (only listen address, port and socket directory "
        "changed).",
        "",
        "| figure | value | target | verdict |",
        "|---|---|---|---|",
        *(f"| {a} | {b} | {c} | {v} |" for a, b, c, v in summary_rows(figures)),
        "",
        "Load average (1 min) during each cell: " + ", ".join(
            f"{name} mean {figures[name].load['mean']:.2f} / max {figures[name].load['max']:.2f}"
            for name in CELLS if figures.get(name) is not None) + ".",
    ]
    for name, error in figures.get("errors", {}).items():
        lines += ["", f"**{name} failed**: {error}"]
    if (d := figures.get("drain")) is not None:
        lines += ["", f"## drain: completions per {d.bucket:g} s (database clock, from the "
                  "first claim)", "", "| t (s) | jobs/s |", "|---|---|",
                  *(f"| {t:.0f} | {rate:,.0f} |" for t, rate in d.series),
                  "", f"Fill {d.fill_seconds:.1f}s; worker CPU {d.worker_cpu or 0:.1f}s, its "
                  f"Postgres backends {d.postgres_cpu or 0:.1f}s.",
                  "", "### drain: akadze tables every ~10 s (pg_stat_user_tables)", "",
                  "| t (s) | load1 | jobs live (estimate) | jobs dead | jobs autovacuums | "
                  "jobs autoanalyzes | other tables' dead | WAL since (MB) | full-page "
                  "images since | checkpoints | vacuuming now |",
                  "|---|---|---|---|---|---|---|---|---|---|---|",
                  *(_stats_line(s, d.stats[0]) for s in d.stats),
                  "", "WAL, full-page images and checkpoints are counted from the first "
                  "sample (pg_stat_wal, pg_stat_bgwriter); \"vacuuming now\" is "
                  "pg_stat_progress_vacuum at the sample."]
    if (i := figures.get("idle")) is not None:
        lines += ["", f"## idle in transaction: per {i.window:g} s window (t from the "
                  f"producer's start; held {i.warmup:g}-{i.warmup + i.held:g} s)", "",
                  "| t (s) | phase | offered/s | completed/s | depth | pickup p50 / p99 (ms) "
                  "| claims | claim p50 / p99 / max (ms) | loop lag p99 / max (ms) |",
                  "|---|---|---|---|---|---|---|---|---|",
                  *(f"| {w.start:.0f} | {w.phase} | {w.offered:,.0f} | {w.completed:,.0f} | "
                    f"{'n/a' if w.depth is None else f'{w.depth:,}'} | "
                    f"{_ms(w.pickup_p50)} / {_ms(w.pickup_p99)} | {w.claims:,} | "
                    f"{_ms(w.claim_p50)} / {_ms(w.claim_p99)} / {_ms(w.claim_max)} | "
                    f"{_ms(w.lag_p99)} / {_ms(w.lag_max)} |"
                    for w in i.windows),
                  "", "Claim latency: the wall time of each `database.claim_jobs` call in "
                  "the worker (round trip plus the event loop's delay in resuming it). "
                  "Loop lag: how late a 10 ms `asyncio.sleep` in the worker's loop woke "
                  "(the loop's or the machine's busyness, in every claim's figure too). "
                  "Pickup: `started_at - scheduled_at`, database clock."]
    if (c := figures.get("claim")) is not None:
        lines += ["", "## claim cost: `claim_jobs(limit=10)`, ms", "",
                  "| scenario | claims | p50 | p99 | mean |", "|---|---|---|---|---|",
                  *(f"| {name} | {r['claims']} | {r['p50']:.2f} | {r['p99']:.2f} | "
                    f"{r['mean']:.2f} |" for name, r in c.results.items())]
        if c.history_drain:
            h = c.history_drain
            lines += ["", f"The history was drained by `akadze worker --slots "
                      f"{figures['options']['slots']}` at {h['rate']:,.0f} jobs/s "
                      f"(first tenth {h['rate_first'] or 0:,.0f}, last tenth "
                      f"{h['rate_last'] or 0:,.0f}), then `VACUUM ANALYZE`."]
    return "\n".join(lines) + "\n"


def _stats_line(sample: dict[str, Any], first: dict[str, Any]) -> str:
    jobs = _jobs_stats(sample)
    others = sum(t.get("dead", 0) for name, t in sample.get("tables", {}).items()
                 if name != "jobs")
    server, base = sample.get("server") or {}, first.get("server") or {}

    def since(key: str) -> int:
        return int(server.get(key, 0)) - int(base.get(key, 0))

    vacuuming = ", ".join(server.get("vacuuming", [])) or "-"
    return (f"| {sample['t']:.0f} | {sample['load1']:.2f} | {jobs.get('live', 0):,} | "
            f"{jobs.get('dead', 0):,} | {jobs.get('autovacuum', 0)} | "
            f"{jobs.get('autoanalyze', 0)} | {others:,} | {since('wal_bytes') / 1e6:,.0f} | "
            f"{since('wal_fpi'):,} | {since('checkpoints')} | {vacuuming} |")


# --- the command ------------------------------------------------------------------------------

def parse(argv: list[str] | None = None) -> argparse.Namespace:
    """The command's options (``--quick`` shrinks the sizes it does not set explicitly)."""
    parser = argparse.ArgumentParser(prog="python -m bench.hotpath", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true",
                        help="drain 100k, idle 40 s held, claim 100k history (~5 min)")
    parser.add_argument("--only", default=",".join(CELLS),
                        help="comma-separated cells to run (drain,idle,claim)")
    parser.add_argument("--drain-jobs", type=int, help="default 1,000,000 (quick 100,000)")
    parser.add_argument("--idle-seconds", type=float, help="held phase, default 150 (quick 40)")
    parser.add_argument("--idle-warmup", type=float, default=30.0)
    parser.add_argument("--idle-after", type=float, default=30.0)
    parser.add_argument("--idle-rate", type=float, default=800.0)
    parser.add_argument("--claim-history", type=int,
                        help="finished jobs, default 1,000,000 (quick 100,000)")
    parser.add_argument("--claim-due", type=int, default=10_000)
    parser.add_argument("--claims", type=int, default=300, help="claims per scenario")
    parser.add_argument("--slots", type=int, default=64)
    parser.add_argument("--window", type=float, default=10.0,
                        help="seconds per window of the series and samples")
    parser.add_argument("--pg-bin", type=Path, default=DEFAULT_PG_BIN)
    parser.add_argument("--results", type=Path, default=DEFAULT_RESULTS)
    parser.add_argument("--run-dir", type=Path)
    options = parser.parse_args(argv)
    options.argv = list(argv if argv is not None else sys.argv[1:])
    if options.drain_jobs is None:
        options.drain_jobs = 100_000 if options.quick else 1_000_000
    if options.idle_seconds is None:
        options.idle_seconds = 40.0 if options.quick else 150.0
    if options.claim_history is None:
        options.claim_history = 100_000 if options.quick else 1_000_000
    options.cells = [name.strip() for name in options.only.split(",") if name.strip()]
    unknown = set(options.cells) - set(CELLS)
    if unknown:
        parser.error(f"unknown cells: {', '.join(sorted(unknown))}")
    if options.run_dir is None:
        options.run_dir = Path(tempfile.gettempdir()) / (
            "akadze-hotpath-" + dt.datetime.now().strftime("%Y%m%d-%H%M%S"))
    return options


def _commit() -> str:
    with contextlib.suppress(OSError):
        done = procs.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"],
                         log=Path(os.devnull), timeout=10)
        return done.stdout.strip() or "?"
    return "?"


def run(options: argparse.Namespace) -> tuple[int, dict[str, Any]]:
    """Every chosen cell, each on its own cluster; (exit code, figures)."""
    run_dir: Path = options.run_dir
    run_dir.mkdir(parents=True, exist_ok=True)

    def log(message: str) -> None:
        print(f"[hotpath {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)

    figures: dict[str, Any] = {
        "when": dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "argv": options.argv, "machine": machine(), "commit": _commit(),
        "options": {"slots": options.slots}, "errors": {}}
    for name in options.cells:
        log(f"cell {name}: load {procs.load_average()}")
        try:
            with cluster(options.pg_bin, log) as server:
                figures["server_version"] = db.server_facts(server.url())["server_version"]
                if name == "drain":
                    figures[name] = drain_cell(server, options.drain_jobs, options.slots,
                                               options.window, run_dir, log)
                elif name == "idle":
                    figures[name] = idle_cell(
                        server, options.idle_rate, options.idle_warmup, options.idle_seconds,
                        options.idle_after, options.slots, options.window, run_dir, log)
                else:
                    figures[name] = claim_cell(server, options.claim_due,
                                               options.claim_history, options.claims,
                                               options.slots, run_dir, log)
        except Exception as exc:  # one failed cell is reported; the others still run
            figures["errors"][name] = f"{type(exc).__name__}: {exc}"
            log(f"cell {name} failed: {exc}")
    text = render(figures)
    print(text)
    options.results.write_text(text)
    raw = {key: asdict(value) if hasattr(value, "__dataclass_fields__") else value
           for key, value in figures.items()}
    (run_dir / "hotpath.json").write_text(json.dumps(raw, indent=1, default=str))
    log(f"results: {options.results}; logs and raw figures: {run_dir}")
    return (1 if figures["errors"] else 0), figures


def main(argv: list[str] | None = None) -> int:
    """``python -m bench.hotpath``."""
    procs.install_cleanup()
    code, _ = run(parse(argv))
    return code


if __name__ == "__main__":
    raise SystemExit(main())
