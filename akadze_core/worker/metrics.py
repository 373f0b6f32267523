"""``akadze worker --metrics-port``: the worker's own Prometheus series and its ``/metrics``.

The worker counts what it did in process (prometheus_client's counters and histograms, a
few microseconds per job): runs by outcome, the enqueue-to-start latency of each claim and
the run time of each run. Its ``/metrics`` adds what it holds right now and, read from the
database at each scrape on one pooled connection, the fleet's series of
``akadze_core.ops.metrics`` (jobs per queue and state, oldest job age, live workers); the
recent-window histograms are the dashboard's, not repeated here.

The HTTP server is a small asyncio one on the worker's event loop: GET (or HEAD) of
``/metrics``, one request per connection. It binds 127.0.0.1 unless told otherwise.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractAsyncContextManager
from typing import TYPE_CHECKING, Any, Protocol

from prometheus_client import (
    PLATFORM_COLLECTOR,
    PROCESS_COLLECTOR,
    CollectorRegistry,
    Counter,
    Histogram,
)
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector

from ..model.errors import AkadzeError
from ..model.outcomes import RETRY, SNOOZE, UNSTARTED, Outcome
from ..ops.metrics import BUCKETS, CONTENT_TYPE, exposition, read_database
from ..store.deadlines import within

if TYPE_CHECKING:
    from ..app import App
    from .run_log import Run

logger = logging.getLogger("akadze.worker")


class MeteredWorker(Protocol):
    """What the series read of the worker they count (a ``akadze_core.Worker``; named
    here so this module need not import the worker)."""

    app: App

    @property
    def name(self) -> str:
        """The worker's name."""

    @property
    def worker_id(self) -> int | None:
        """Its id in akadze.workers (None until registered)."""

    @property
    def queues(self) -> list[str]:
        """The queues it claims from."""

    @property
    def slots(self) -> dict[str, int]:
        """Its concurrent runs per queue."""

#: The outcome label of a written run, by the state the write left the job in (a run put
#: back in the queue is told apart by its outcome kind).
_FINAL = {"succeeded": "succeeded", "failed": "failed", "cancelled": "cancelled"}
_REQUEUED = {RETRY: "retried", SNOOZE: "snoozed"}
#: Seconds a scrape may wait for a pooled connection and for the database's answer.
DATABASE_TIMEOUT = 5.0
#: The database's series are read at most this often (seconds) however often the worker is
#: scraped: a fleet of workers scraped every second costs the database one read per worker
#: and this interval, and they are gauges of the whole fleet that the dashboard serves too.
DATABASE_INTERVAL = 5.0
#: Seconds a client has to send its request line and headers.
REQUEST_TIMEOUT = 5.0


class MetricsUnavailable(AkadzeError):
    """``--metrics-port`` was asked for but cannot be served (the port is taken, or the
    ``metrics`` extra is not installed); the message says which."""


class WorkerMetrics:
    """The in-process series of one ``Worker`` (its own registry, so that two workers in
    one process never share counters) and the server of its ``/metrics``."""

    def __init__(self, worker: MeteredWorker, *, busy: dict[str, int],
                 connection: Callable[[float], AbstractAsyncContextManager[Any]],
                 ready: Callable[[], bool], pending: Callable[[], int]) -> None:
        """``busy``: the worker's runs held per queue (read at each scrape); ``connection``:
        its pooled connections, usable while ``ready()``; ``pending``: its outcomes not yet
        written."""
        self.worker = worker
        self._connection = connection
        self._ready = ready
        self.registry = CollectorRegistry(auto_describe=True)
        self.runs = Counter(
            "akadze_job_runs", "Runs this worker ended, per queue, task and outcome: "
            "succeeded, failed (for good), retried, snoozed, cancelled",
            ["queue", "task", "outcome"], registry=self.registry)
        self.wait = Histogram(
            "akadze_job_wait_seconds", "Enqueue-to-start latency of the jobs this worker "
            "claimed: from when the job was due (its scheduled_at) to its claim, database "
            "clock", ["queue"], buckets=BUCKETS, registry=self.registry)
        self.run_time = Histogram(
            "akadze_job_run_seconds", "Run time of this worker's runs, from the claim to the "
            "end of the body", ["queue", "task"], buckets=BUCKETS, registry=self.registry)
        self.registry.register(_Live(worker, busy, pending))
        # The children by label values: labels() validates and locks on every call (with
        # these the three hooks cost a job about 5 µs on an idle core).
        self._runs: dict[tuple[str, str, str], Any] = {}
        self._waits: dict[str, Any] = {}
        self._run_times: dict[tuple[str, str], Any] = {}
        # The last read of the database's series, and when (monotonic): see DATABASE_INTERVAL.
        self._database_families: list[Metric] = []
        self._database_read_at: float | None = None
        self._database_lock = asyncio.Lock()
        self._server: asyncio.Server | None = None

    # --- what the worker reports ---------------------------------------------------------

    def claimed(self, row: dict[str, Any]) -> None:
        """A job was claimed to run (``row``: the claim's row, both times the database's)."""
        waited = (row["started_at"] - row["scheduled_at"]).total_seconds()
        queue = row["queue"]
        child = self._waits.get(queue)
        if child is None:
            child = self._waits[queue] = self.wait.labels(queue)
        child.observe(max(0.0, waited))

    def ran(self, run: Run, outcome: Outcome | None) -> None:
        """A run's body ended (``outcome`` None: it completed in its own transaction)."""
        if outcome is not None and outcome.kind == UNSTARTED:
            return  # dropped before it started: no run to time
        key = (run.queue, run.task)
        child = self._run_times.get(key)
        if child is None:
            child = self._run_times[key] = self.run_time.labels(*key)
        child.observe(time.monotonic() - run.started)
        if outcome is None:
            self._count(run, "succeeded")

    def written(self, batch: Any, rows: list[dict[str, Any]],
                finished: dict[tuple[int, int], Run]) -> None:
        """A batch of outcomes was written: count each by what it made of its job (an
        outcome the fencing rejected, or a run never started, counts nothing)."""
        changed = {(row["id"], row["run_count"]): row["state"] for row in rows}
        for outcome in batch:
            key = (outcome.job_id, outcome.run_count)
            state, run = changed.get(key), finished.get(key)
            if state is None or run is None:
                continue
            label = _FINAL.get(state) or _REQUEUED.get(outcome.kind)
            if label is not None:
                self._count(run, label)

    def _count(self, run: Run, outcome: str) -> None:
        key = (run.queue, run.task, outcome)
        child = self._runs.get(key)
        if child is None:
            child = self._runs[key] = self.runs.labels(*key)
        child.inc()

    # --- /metrics ---------------------------------------------------------------------------

    async def render(self) -> bytes:
        """This worker's series, then the database's (no recent window), those read at most
        every ``DATABASE_INTERVAL`` seconds."""
        async with self._database_lock:  # concurrent scrapes share one read
            read_at = self._database_read_at
            if read_at is None or time.monotonic() - read_at >= DATABASE_INTERVAL:
                self._database_families = await self._database()
                self._database_read_at = time.monotonic() if self._database_families else None
        return exposition(self._database_families, self.registry, PROCESS_COLLECTOR,
                          PLATFORM_COLLECTOR)

    async def _database(self) -> list[Metric]:
        if not self._ready():
            return []  # starting or stopped: nothing to read with
        try:
            # The worker's pool (its connection budget), a connection never found dead.
            async with self._connection(DATABASE_TIMEOUT) as connection:
                return await within(DATABASE_TIMEOUT, connection, read_database(
                    self.worker.app, connection, recent=False), "the metrics scrape")
        except Exception as exc:  # a pool timeout, no answer: the scrape goes on without
            logger.warning("metrics: no database connection for the scrape (%s)",
                           type(exc).__name__)
            up = GaugeMetricFamily("akadze_database_up",
                                   "1 when this scrape could read the akadze schema, else 0")
            up.add_metric([], 0)
            return [up]

    async def serve(self, port: int, address: str) -> None:
        """Start listening; raises ``MetricsUnavailable`` when the address cannot be bound."""
        try:
            self._server = await asyncio.start_server(self._handle, address, port,
                                                      reuse_address=True)
        except OSError as exc:
            raise MetricsUnavailable(
                f"cannot serve metrics on {address}:{port}: {exc.strerror or exc}") from None
        bound = self._server.sockets[0].getsockname()
        logger.info("metrics on http://%s/metrics", _host_port(bound))

    async def close(self) -> None:
        """Stop listening (a scrape in flight is cut short)."""
        if self._server is not None:
            self._server.close()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._server.wait_closed(), 1.0)
            self._server = None

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), REQUEST_TIMEOUT)
            method, path = _request_line(head)
            if method not in ("GET", "HEAD"):
                status, body, content_type = "405 Method Not Allowed", b"GET only\n", "text/plain"
            elif path == "/metrics":
                status, body, content_type = "200 OK", await self.render(), CONTENT_TYPE
            elif path == "/":
                status, body, content_type = "200 OK", b"akadze worker: /metrics\n", "text/plain"
            else:
                status, body, content_type = "404 Not Found", b"not found\n", "text/plain"
            writer.write(f"HTTP/1.1 {status}\r\nContent-Type: {content_type}\r\n"
                         f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n".encode())
            if method != "HEAD":
                writer.write(body)
            await writer.drain()
        except (asyncio.TimeoutError, asyncio.IncompleteReadError, asyncio.LimitOverrunError,
                ConnectionError, ValueError):
            pass  # a client that sent no request, half of one, or a malformed one
        finally:
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()


class _Live(Collector):
    """What the worker holds at the moment of the scrape."""

    def __init__(self, worker: MeteredWorker, busy: dict[str, int], pending: Callable[[], int]
                 ) -> None:
        self.worker = worker
        self.busy = busy
        self.pending = pending

    def collect(self) -> Iterator[Metric]:
        worker = self.worker
        running = GaugeMetricFamily("akadze_worker_running_jobs", "Jobs this worker holds "
                                    "(running, or claimed ahead and waiting to start)",
                                    labels=["queue"])
        slots = GaugeMetricFamily("akadze_worker_slots", "Concurrent runs this worker takes "
                                  "per queue", labels=["queue"])
        for queue in worker.queues:
            running.add_metric([queue], self.busy.get(queue, 0))
            slots.add_metric([queue], worker.slots[queue])
        pending = GaugeMetricFamily("akadze_worker_pending_outcomes", "Outcomes waiting to "
                                    "be written to the database")
        pending.add_metric([], self.pending())
        info = GaugeMetricFamily("akadze_worker_info", "This worker: its name, id in "
                                 "akadze.workers (empty until registered), host and pid",
                                 labels=["name", "worker_id", "hostname", "pid"])
        worker_id = "" if worker.worker_id is None else str(worker.worker_id)
        info.add_metric([worker.name, worker_id, socket.gethostname(), str(os.getpid())], 1)
        yield from (running, slots, pending, info)


def _request_line(head: bytes) -> tuple[str, str]:
    """The method and path (without its query) of an HTTP request head."""
    method, target, _version = head.split(b"\r\n", 1)[0].decode("latin-1").split(" ", 2)
    return method, target.split("?", 1)[0]


def _host_port(address: Any) -> str:
    host, port = address[0], address[1]
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


__all__ = ["MetricsUnavailable", "WorkerMetrics"]
