#!/usr/bin/env python3
"""akadze adapter for the hardbyte/postgresql-job-queue-benchmarking harness.

One long-running process, the harness's subprocess contract (CONTRIBUTING_ADAPTERS.md):
environment in (DATABASE_URL, PRODUCER_MODE, PRODUCER_RATE, WORKER_COUNT, ...), a descriptor
line and then one JSON sample per metric every SAMPLE_EVERY_S on stdout, logs on stderr,
exit 0 within 5 s of SIGTERM.

It uses akadze's public API only: ``akadze_core.App`` (``migrate``), ``App.task``,
``Task.enqueue_many_async`` (the bulk insert: one multi-row INSERT per call) and
``Worker``. The one piece of SQL is the observer's depth probe (``queue_depth``: queued jobs
of the bench queue), as the harness's other Python adapters read their own tables.

- Pickup latency (``claim_p*_ms``): from the producer's wall clock when the job's row was
  built to the start of its body, kept in a bounded-memory histogram (3 significant
  figures, one per second, the last 30 s merged for each sample).
- Producer pacing: ``PRODUCER_PACING=harness`` (the harness default) takes ``ENQUEUE <n>``
  tokens from stdin; ``adapter`` paces locally, crediting ``rate x real elapsed time`` (the
  contract's normative loop) and reading ``PRODUCER_RATE_CONTROL_FILE`` each tick, so the
  harness's high-load phases change the offered rate; ``PRODUCER_MODE=depth-target`` keeps
  ``TARGET_DEPTH`` jobs queued.
- The producer has its own ``App`` (and so its own pool): the worker's start replaces its
  app's pool in the loop it runs in, and an enqueue that waits for the old pool then fails
  (issue 21, item 4). Two apps sidestep that without touching akadze.
- ``Worker.run()`` returns 1 when the database was gone longer than ``heartbeat_ttl``, as
  the seeds require; a deployment restarts it from its supervisor. This process plays the
  supervisor: it logs the exit on stderr and starts a new ``Worker`` (the count is the
  ``worker_restarts`` sample).
"""

from __future__ import annotations

import asyncio
import bisect
import collections
import datetime as dt
import json
import logging
import math
import os
import signal
import sys
import time
from typing import Any
from urllib.parse import urlparse

import psycopg

from akadze_core import App, Worker

SYSTEM = "akadze"
QUEUE = "pgjqb_bench"
TASK_NAME = "pgjqb_job"
EVENT_TABLES = ["akadze.jobs", "akadze.workers"]
# Metrics that describe one global observation: only replica 0 emits them.
OBSERVER_METRICS = frozenset({"queue_depth", "producer_target_rate"})


def env_int(key: str, default: int) -> int:
    """An integer environment variable, or ``default`` when unset or empty."""
    value = os.environ.get(key)
    return int(value) if value not in (None, "") else default


def instance_id() -> int:
    """The harness's replica index (0 for single-replica runs)."""
    return env_int("BENCH_INSTANCE_ID", 0)


def now_iso() -> str:
    """UTC now, milliseconds, ``Z`` suffix, as every adapter stamps its samples."""
    return (dt.datetime.now(dt.timezone.utc).isoformat(timespec="milliseconds")
            .replace("+00:00", "Z"))


def emit(record: dict[str, Any]) -> None:
    """One JSON line on stdout, stamped with the replica index."""
    record.setdefault("instance_id", instance_id())
    sys.stdout.write(json.dumps(record) + "\n")
    sys.stdout.flush()


def read_producer_rate(default: int) -> int:
    """The offered rate now: the harness's control file (high-load phases rewrite it)."""
    control_file = os.environ.get("PRODUCER_RATE_CONTROL_FILE")
    if not control_file:
        return default
    try:
        with open(control_file) as fh:
            return int(float(fh.read().strip()))
    except (OSError, ValueError):
        return default


class Histogram:
    """Counts of values kept to 3 significant figures (HDR's precision): memory is bounded
    by the number of distinct 3-figure values (~900 per decade), not by the samples."""

    def __init__(self) -> None:
        self.counts: collections.Counter[int] = collections.Counter()
        self.total = 0

    @staticmethod
    def _key(value_us: int) -> int:
        if value_us < 1000:
            return value_us
        step = 10 ** (int(math.log10(value_us)) - 2)
        return value_us // step * step

    def record(self, value_ms: float) -> None:
        """Add one value (milliseconds; stored in microseconds)."""
        self.counts[self._key(max(0, round(value_ms * 1000)))] += 1
        self.total += 1

    def merge(self, other: Histogram) -> None:
        """Add every count of ``other``."""
        self.counts.update(other.counts)
        self.total += other.total

    def percentiles(self, *qs: float) -> list[float]:
        """The values (ms) at quantiles ``qs`` (0..1); zeros when empty."""
        if not self.total:
            return [0.0 for _ in qs]
        keys = sorted(self.counts)
        cumulative: list[int] = []
        running = 0
        for key in keys:
            running += self.counts[key]
            cumulative.append(running)
        out = []
        for q in qs:
            rank = max(1, math.ceil(q * self.total))
            out.append(keys[bisect.bisect_left(cumulative, rank)] / 1000.0)
        return out


class RollingHistogram:
    """One ``Histogram`` per wall-clock second; ``window(s)`` merges the last ``s`` seconds."""

    def __init__(self, keep_s: int = 30) -> None:
        self.keep_s = keep_s
        self.seconds: collections.deque[tuple[int, Histogram]] = collections.deque()

    def record(self, value_ms: float) -> None:
        """Add one value to the current second."""
        second = int(time.monotonic())
        if not self.seconds or self.seconds[-1][0] != second:
            self.seconds.append((second, Histogram()))
            while self.seconds and self.seconds[0][0] <= second - self.keep_s - 1:
                self.seconds.popleft()
        self.seconds[-1][1].record(value_ms)

    def window(self) -> Histogram:
        """The merged histogram of the last ``keep_s`` seconds."""
        cutoff = int(time.monotonic()) - self.keep_s
        merged = Histogram()
        for second, hist in self.seconds:
            if second > cutoff:
                merged.merge(hist)
        return merged


class Bench:
    """The producer, the worker, the depth probe and the sampler of one replica."""

    def __init__(self) -> None:
        self.url = os.environ["DATABASE_URL"]
        self.sample_every_s = max(1, env_int("SAMPLE_EVERY_S", 5))
        self.producer_rate = env_int("PRODUCER_RATE", 800)
        self.producer_mode = os.environ.get("PRODUCER_MODE", "fixed")
        self.pacing = os.environ.get("PRODUCER_PACING", "adapter")
        self.target_depth = env_int("TARGET_DEPTH", 1000)
        self.worker_count = max(1, env_int("WORKER_COUNT", 32))
        self.work_ms = env_int("JOB_WORK_MS", 1)
        self.batch_max = max(1, env_int("PRODUCER_BATCH_MAX", 128))
        self.batch_ms = max(1, env_int("PRODUCER_BATCH_MS", 10))
        self.padding = "x" * max(0, env_int("JOB_PAYLOAD_BYTES", 256) - 64)
        self.enqueued = 0
        self.completed = 0
        self.queue_depth = 0
        self.target_rate_now = float(self.producer_rate)
        self.worker_restarts = 0
        self.latency = RollingHistogram(30)
        self.shutdown = asyncio.Event()
        self.worker: Worker | None = None
        self.producer_app = App(self.url)
        self.worker_app = App(self.url)
        self.producer_task = self.producer_app.task(TASK_NAME, queue=QUEUE)(self.job)
        self.worker_app.task(TASK_NAME, queue=QUEUE)(self.job)

    async def job(self, seq: int, created_at: float, padding: str = "") -> None:
        """The benchmark job: note the pickup latency, sleep JOB_WORK_MS, count it."""
        self.latency.record(max(0.0, (time.time() - created_at) * 1000.0))
        if self.work_ms:
            await asyncio.sleep(self.work_ms / 1000.0)
        self.completed += 1

    # --- producer -------------------------------------------------------------------------

    async def insert(self, count: int, seq: int) -> bool:
        """One bulk insert of ``count`` jobs; False (logged) when it failed."""
        created = time.time()
        rows = [{"seq": seq + i, "created_at": created, "padding": self.padding}
                for i in range(count)]
        try:
            await self.producer_task.enqueue_many_async(rows)
        except Exception as exc:
            print(f"[akadze] producer insert failed: {type(exc).__name__}: "
                  f"{self.producer_app.redact(str(exc).splitlines()[0] if str(exc) else '')}",
                  file=sys.stderr, flush=True)
            await asyncio.sleep(0.1)
            return False
        self.enqueued += count
        # The probe runs every 0.2 s: count our own inserts meanwhile so that depth-target
        # mode does not overshoot on a stale depth.
        self.queue_depth += count
        return True

    async def producer(self) -> None:
        """Offer load as PRODUCER_MODE / PRODUCER_PACING say."""
        loop = asyncio.get_running_loop()
        seq = 0
        if self.producer_mode == "depth-target":
            while not self.shutdown.is_set():
                self.target_rate_now = 0.0
                count = min(self.batch_max, self.target_depth - self.queue_depth)
                if count <= 0:
                    await asyncio.sleep(0.01)
                    continue
                if await self.insert(count, seq):
                    seq += count
            return
        if self.pacing == "harness":
            reader = asyncio.StreamReader()
            await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader),
                                         sys.stdin)
            while not self.shutdown.is_set():
                line = await reader.readline()
                if not line:
                    return
                parts = line.decode("utf-8", "replace").split()
                if len(parts) != 2 or parts[0] != "ENQUEUE" or not parts[1].isdigit():
                    continue
                self.target_rate_now = float(read_producer_rate(self.producer_rate))
                count = int(parts[1])
                while count > 0:
                    batch = min(count, self.batch_max)
                    if await self.insert(batch, seq):
                        seq += batch
                    count -= batch
            return
        # Local pacing: credit the offered rate on real elapsed time (normative), dispatch
        # every whole job of credit in batches of at most batch_max.
        period = self.batch_ms / 1000.0
        credit = 0.0
        last = loop.time()
        while not self.shutdown.is_set():
            sleep_for = period - (loop.time() - last)
            if sleep_for > 0:
                await asyncio.sleep(sleep_for)
            rate = read_producer_rate(self.producer_rate)
            self.target_rate_now = float(rate)
            now = loop.time()
            credit += max(0, rate) * (now - last)
            last = now
            while credit >= 1.0 and not self.shutdown.is_set():
                batch = min(self.batch_max, int(credit))
                credit -= batch
                if await self.insert(batch, seq):
                    seq += batch

    # --- worker ---------------------------------------------------------------------------

    async def run_worker(self) -> None:
        """Run a Worker; start a new one (like a supervisor) when it exits unasked."""
        while not self.shutdown.is_set():
            self.worker = Worker(self.worker_app, queues=[QUEUE], slots=self.worker_count,
                                 schedules=False)
            try:
                code = await self.worker.run()
                reason = f"exit code {code}"
            except Exception as exc:
                reason = f"{type(exc).__name__}: {self.worker_app.redact(str(exc))}"
            if self.shutdown.is_set():
                return
            self.worker_restarts += 1
            print(f"[akadze] worker stopped unasked ({reason}); starting a new one "
                  f"(restart {self.worker_restarts})", file=sys.stderr, flush=True)
            await asyncio.sleep(1.0)

    # --- observers ------------------------------------------------------------------------

    async def depth_poller(self) -> None:
        """Queued jobs of the bench queue, every 0.2 s (replica 0 only)."""
        conn: psycopg.AsyncConnection[Any] | None = None
        while not self.shutdown.is_set():
            try:
                if conn is None or conn.closed:
                    conn = await psycopg.AsyncConnection.connect(self.url, autocommit=True,
                                                                 connect_timeout=5)
                cur = await conn.execute(
                    "SELECT count(*) FROM akadze.jobs WHERE state = 'queued' AND queue = %s",
                    (QUEUE,))
                row = await cur.fetchone()
                self.queue_depth = int(row[0]) if row else 0
            except Exception:
                if conn is not None:
                    await conn.close()
                conn = None
            await asyncio.sleep(0.2)
        if conn is not None:
            await conn.close()

    async def sampler(self) -> None:
        """Every SAMPLE_EVERY_S, aligned to the wall clock, one record per metric."""
        loop = asyncio.get_running_loop()
        every = self.sample_every_s
        await asyncio.sleep(every - (time.time() % every))
        last_enq, last_cmp, last_t = self.enqueued, self.completed, loop.time()
        while not self.shutdown.is_set():
            next_tick = (math.floor(time.time() / every) + 1) * every
            try:
                await asyncio.wait_for(self.shutdown.wait(), next_tick - time.time())
                return
            except asyncio.TimeoutError:
                pass
            now = loop.time()
            elapsed = max(0.001, now - last_t)
            enq_rate = (self.enqueued - last_enq) / elapsed
            cmp_rate = (self.completed - last_cmp) / elapsed
            last_enq, last_cmp, last_t = self.enqueued, self.completed, now
            p50, p95, p99 = self.latency.window().percentiles(0.50, 0.95, 0.99)
            stamp = now_iso()
            for metric, value, window in (
                ("claim_p50_ms", p50, 30.0),
                ("claim_p95_ms", p95, 30.0),
                ("claim_p99_ms", p99, 30.0),
                ("enqueue_rate", enq_rate, float(every)),
                ("completion_rate", cmp_rate, float(every)),
                ("queue_depth", float(self.queue_depth), 0.0),
                ("producer_target_rate", self.target_rate_now, 0.0),
                ("worker_restarts", float(self.worker_restarts), 0.0),
            ):
                if metric in OBSERVER_METRICS and instance_id() != 0:
                    continue
                emit({"t": stamp, "system": SYSTEM, "kind": "adapter",
                      "subject_kind": "adapter", "subject": "", "metric": metric,
                      "value": value, "window_s": window})

    # --- lifecycle ------------------------------------------------------------------------

    async def main(self) -> None:
        """Migrate, say who we are, run until SIGTERM, stop within 5 s."""
        await asyncio.to_thread(self.producer_app.migrate)
        emit({"kind": "descriptor", "system": SYSTEM, "event_tables": EVENT_TABLES,
              "extensions": [], "version": akadze_version(),
              "schema_version": "akadze migrations", "db_name": db_name(self.url),
              "started_at": now_iso()})
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(signum, self.shutdown.set)
        worker = asyncio.create_task(self.run_worker(), name="worker")
        tasks = [asyncio.create_task(self.producer(), name="producer"),
                 asyncio.create_task(self.sampler(), name="sampler")]
        if instance_id() == 0:
            tasks.append(asyncio.create_task(self.depth_poller(), name="depth"))
        await self.shutdown.wait()
        for task in tasks:
            task.cancel()
        if self.worker is not None:
            self.worker.request_stop()
        done, _ = await asyncio.wait({worker}, timeout=3.0)
        if not done and self.worker is not None:
            self.worker.request_stop()  # the second request returns running jobs at once
            await asyncio.wait({worker}, timeout=1.0)
        await asyncio.gather(*tasks, return_exceptions=True)
        print("[akadze] long_horizon: shutdown signal received", file=sys.stderr, flush=True)


def db_name(url: str) -> str:
    """The database name of ``url`` (no query string, no credentials)."""
    return (urlparse(url).path or "/").lstrip("/") or "akadze_pgjqb_bench"


def akadze_version() -> str:
    """The installed akadze version, else the checkout's git revision, else 'source'."""
    try:
        from importlib.metadata import version

        return version("akadze")
    except Exception:
        pass
    try:
        import subprocess

        here = os.path.dirname(os.path.abspath(__file__))
        out = subprocess.run(["git", "-C", here, "rev-parse", "--short", "HEAD"],
                             capture_output=True, text=True, timeout=5)
        if out.returncode == 0:
            return f"git:{out.stdout.strip()}"
    except Exception:
        pass
    return "source"


def run() -> None:
    """Entry point: the long_horizon scenario (the only one this adapter implements)."""
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr,
                        format="[akadze] %(levelname)s %(name)s: %(message)s")
    scenario = os.environ.get("SCENARIO", "long_horizon")
    if scenario != "long_horizon":
        raise SystemExit(f"akadze adapter: SCENARIO={scenario!r} is not implemented "
                         "(only long_horizon)")
    asyncio.run(Bench().main())
    # Stop at once: nothing is left to flush (stdout is flushed per line), and a worker
    # thread still finishing a sync call must not hold the exit past the 5 s contract.
    sys.stdout.flush()
    os._exit(0)


if __name__ == "__main__":
    run()
