"""The pgjqb harness's adapter contract (CONTRIBUTING_ADAPTERS.md), once for our adapters.

A subclass of ``LongHorizon`` says how its system migrates, bulk-inserts, runs and stops
its consumer and counts its queue; this module does the rest the same way for each:

- environment in (DATABASE_URL, PRODUCER_MODE, PRODUCER_RATE, PRODUCER_BATCH_MAX/MS,
  TARGET_DEPTH, WORKER_COUNT, JOB_PAYLOAD_BYTES, JOB_WORK_MS, SAMPLE_EVERY_S,
  BENCH_INSTANCE_ID, PRODUCER_RATE_CONTROL_FILE, PRODUCER_PACING);
- a descriptor line, then every SAMPLE_EVERY_S (aligned to the wall clock) one JSON record
  per metric on stdout: ``claim_p50/p95/p99_ms`` (rolling 30 s), ``enqueue_rate``,
  ``completion_rate``, ``queue_depth`` (replica 0 only), ``producer_target_rate``;
- pickup latency (the producer's wall clock when the rows were built to the body's start)
  in a bounded-memory histogram, 3 significant figures, one per second;
- producer pacing: ``PRODUCER_PACING=harness`` reads ``ENQUEUE <n>`` tokens from stdin;
  otherwise the offered rate (re-read from the control file, so high-load phases raise it)
  is credited on real elapsed time, the contract's normative loop; ``depth-target`` keeps
  TARGET_DEPTH jobs queued;
- SIGTERM: stop the consumer, flush, exit 0 within 5 s.
"""

from __future__ import annotations

import asyncio
import bisect
import collections
import datetime as dt
import json
import math
import os
import signal
import sys
import time
from typing import Any
from urllib.parse import urlparse

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


def db_name(url: str, default: str) -> str:
    """The database name of ``url`` (no query string, no credentials)."""
    return (urlparse(url).path or "/").lstrip("/") or default


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
    """One ``Histogram`` per second; ``window()`` merges the last ``keep_s`` seconds."""

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


class LongHorizon:
    """The ``long_horizon`` scenario of one replica; subclasses fill in the system."""

    system = "?"
    event_tables: list[str] = []  # noqa: RUF012 (each subclass sets its own)
    version = "?"

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
        # JOB_PAYLOAD_BYTES is the job's rough size: the padding plus ~64 bytes of fields.
        self.padding = "x" * max(0, env_int("JOB_PAYLOAD_BYTES", 256) - 64)
        self.enqueued = 0
        self.completed = 0
        self.queue_depth = 0
        self.target_rate_now = float(self.producer_rate)
        #: Extra gauges a subclass wants sampled (name -> value), e.g. worker restarts.
        self.gauges: dict[str, float] = {}
        self.latency = RollingHistogram(30)
        self.shutdown = asyncio.Event()
        #: The task running ``consume()`` (set by ``main``).
        self.consumer_task: asyncio.Task[None] | None = None

    # --- what a system provides -----------------------------------------------------------

    async def setup(self) -> None:
        """Apply the system's schema with its own install path."""
        raise NotImplementedError

    async def insert(self, rows: list[dict[str, Any]]) -> None:
        """Insert ``rows`` (job arguments) with the system's documented bulk path."""
        raise NotImplementedError

    async def consume(self) -> None:
        """Run the system's consumer until ``stop_consumer`` (or for ever)."""
        raise NotImplementedError

    async def stop_consumer(self) -> None:
        """Ask the consumer to stop; return when it has (or after ~3 s)."""
        raise NotImplementedError

    async def depth(self) -> int:
        """Queued jobs not yet claimed (the observer's probe)."""
        raise NotImplementedError

    def log_error(self, what: str, exc: BaseException) -> None:
        """One stderr line for a failure (subclasses redact secrets)."""
        first = str(exc).splitlines()[0] if str(exc) else ""
        print(f"[{self.system}] {what}: {type(exc).__name__}: {first}", file=sys.stderr,
              flush=True)

    # --- the job body's part ---------------------------------------------------------------

    async def job_body(self, created_at: float) -> None:
        """Note the pickup latency, sleep JOB_WORK_MS, count one completion."""
        self.latency.record(max(0.0, (time.time() - created_at) * 1000.0))
        if self.work_ms:
            await asyncio.sleep(self.work_ms / 1000.0)
        self.completed += 1

    # --- producer -------------------------------------------------------------------------

    async def _insert(self, count: int, seq: int) -> bool:
        created = time.time()
        rows = [{"seq": seq + i, "created_at": created, "padding": self.padding}
                for i in range(count)]
        try:
            await self.insert(rows)
        except Exception as exc:
            self.log_error("producer insert failed", exc)
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
                if await self._insert(count, seq):
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
                    if await self._insert(batch, seq):
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
                if await self._insert(batch, seq):
                    seq += batch

    # --- observers ------------------------------------------------------------------------

    async def depth_poller(self) -> None:
        """The queue depth every 0.2 s (replica 0 only)."""
        failing = False
        while not self.shutdown.is_set():
            # A failed probe (the database restarting) keeps the last depth; said once.
            try:
                self.queue_depth = await asyncio.wait_for(self.depth(), 5.0)
                failing = False
            except Exception as exc:
                if not failing:
                    self.log_error("depth probe failed", exc)
                failing = True
            await asyncio.sleep(0.2)

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
            metrics: list[tuple[str, float, float]] = [
                ("claim_p50_ms", p50, 30.0),
                ("claim_p95_ms", p95, 30.0),
                ("claim_p99_ms", p99, 30.0),
                ("enqueue_rate", enq_rate, float(every)),
                ("completion_rate", cmp_rate, float(every)),
                ("queue_depth", float(self.queue_depth), 0.0),
                ("producer_target_rate", self.target_rate_now, 0.0),
            ]
            metrics += [(name, float(value), 0.0) for name, value in self.gauges.items()]
            for metric, value, window in metrics:
                if metric in OBSERVER_METRICS and instance_id() != 0:
                    continue
                emit({"t": stamp, "system": self.system, "kind": "adapter",
                      "subject_kind": "adapter", "subject": "", "metric": metric,
                      "value": value, "window_s": window})

    # --- lifecycle ------------------------------------------------------------------------

    async def main(self) -> None:
        """Set up, say who we are, run until SIGTERM, stop within 5 s."""
        await self.setup()
        emit({"kind": "descriptor", "system": self.system, "event_tables": self.event_tables,
              "extensions": [], "version": self.version,
              "schema_version": "the system's own migrations",
              "db_name": db_name(self.url, f"{self.system}_bench"), "started_at": now_iso()})
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(signum, self.shutdown.set)
        consumer = self.consumer_task = asyncio.create_task(self.consume(), name="consumer")
        tasks = [asyncio.create_task(self.producer(), name="producer"),
                 asyncio.create_task(self.sampler(), name="sampler")]
        if instance_id() == 0:
            tasks.append(asyncio.create_task(self.depth_poller(), name="depth"))
        await self.shutdown.wait()
        for task in tasks:
            task.cancel()
        try:
            await asyncio.wait_for(self.stop_consumer(), 4.0)
        except Exception as exc:
            self.log_error("stopping the consumer", exc)
        consumer.cancel()
        await asyncio.gather(consumer, *tasks, return_exceptions=True)
        print(f"[{self.system}] long_horizon: shutdown signal received", file=sys.stderr,
              flush=True)


def run(bench: type[LongHorizon]) -> None:
    """Entry point of an adapter: the long_horizon scenario, then exit 0 at once."""
    scenario = os.environ.get("SCENARIO", "long_horizon")
    if scenario != "long_horizon":
        raise SystemExit(f"{bench.system} adapter: SCENARIO={scenario!r} is not implemented "
                         "(only long_horizon)")
    asyncio.run(bench().main())
    # Nothing is left to flush (stdout is flushed per line), and a thread still finishing
    # a call must not hold the exit past the contract's 5 s.
    sys.stdout.flush()
    os._exit(0)
