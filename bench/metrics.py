"""What a Prometheus scrape costs, behind 1,000,000 jobs.

Its own database (``<bench database>_metrics``): ``jobs`` rows (``failed`` of them failed,
2,000 cancelled, a backlog of 5,000 queued and 1,000 scheduled in 8 queues nobody serves, the
rest succeeded over the past week, the newest 30,000 of them in the last five minutes, so
that the recent window's cap binds), then VACUUM ANALYZE as autovacuum would.

1. ``akadze_core.ops.metrics.render_metrics`` (the dashboard's ``/metrics``), timed in process:
   ``renders`` calls after 5 warm-ups, the server's whole time (queries and exposition).
2. Claims with and without scrapes: one ``akadze worker --slots 10 --metrics-port P`` drains
   ``drain_jobs`` no-ops of its own queue per phase, in two turns: without scrapes, then
   with a scrape of its ``/metrics`` and a ``render_metrics`` every second, and so on; the
   figure is each phase's jobs / (last outcome - first claim), database clock. A third
   phase in each turn, without ``--metrics-port``, shows what the counting itself costs.
"""

from __future__ import annotations

import asyncio
import socket
import statistics
import threading
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

import psycopg

from akadze_core import App
from akadze_core.ops.metrics import exposition, read_database, render_metrics

from . import db, procs
from .apps.core_app import NOOP
from .core import percentile, worker_argv
from .drain import REPO_ROOT, worker_env

QUEUE = "metrics-drain"
WARM_UP = 5
#: The issue's figure for /metrics: server time on the 1,000,000-job table.
RENDER_TARGET_MS = 50.0
#: "No load on the claim path": the scraped phases' rate at least this share of the others'.
CLAIM_RATIO_TARGET = 0.95

FILL = """
INSERT INTO akadze.jobs (task, queue, args, state, scheduled_at, attempt, run_count,
                         errors, result, created_at, started_at, finished_at)
SELECT 'bench.t' || (g %% 40), 'q' || (g %% 8), jsonb_build_object('n', g), s.state,
       CASE WHEN s.state = 'queued' AND g > %(jobs)s - 1000 THEN now() + interval '1 hour'
            ELSE s.created END,
       1, 1,
       CASE WHEN s.state = 'failed' THEN jsonb_build_array(jsonb_build_object(
           'type', 'ValueError', 'message', 'bad input', 'attempt', 1)) ELSE '[]' END,
       CASE WHEN s.state = 'succeeded' THEN jsonb_build_object('ok', g) END,
       s.created,
       CASE WHEN s.state <> 'queued' THEN s.created + interval '0.05 seconds' END,
       CASE WHEN s.state <> 'queued' THEN s.created + interval '0.2 seconds' END
FROM generate_series(1, %(jobs)s) AS g
CROSS JOIN LATERAL (SELECT
    CASE WHEN g > %(jobs)s - 6000 THEN 'queued'
         WHEN g %% (%(jobs)s / %(failed)s) = 0 THEN 'failed'
         WHEN g %% 500 = 1 THEN 'cancelled'
         ELSE 'succeeded' END AS state,
    -- The newest 30,000 in the last five minutes, the rest over the week before.
    CASE WHEN g > %(jobs)s - 36000
         THEN now() - (%(jobs)s - g) * (interval '300 seconds' / 36000)
         ELSE now() - interval '300 seconds'
              - (%(jobs)s - 36000 - g) * (interval '7 days' / %(jobs)s) END AS created
) AS s
"""


@dataclass
class Phase:
    """One drain: whether it was scraped (and whether the port was on), and its rate."""

    scraped: bool
    port: bool
    rate: float
    scrapes: int = 0
    scrape_ms: list[float] = field(default_factory=list)


@dataclass
class MetricsResult:
    """What the workload measured (milliseconds, jobs/s)."""

    jobs: int
    failed: int
    renders: int
    render_p50: float
    render_p99: float
    render_max: float
    body_bytes: int
    render_cpu_client: float    # CPU of one render: the Python side (ms)
    render_cpu_postgres: float  # ... and its Postgres backend's
    drain_jobs: int
    phases: list[Phase]

    def rate(self, scraped: bool) -> float:
        """The mean rate of the phases with the port on, scraped or not."""
        return statistics.mean(p.rate for p in self.phases if p.port and p.scraped == scraped)

    @property
    def ratio(self) -> float:
        return self.rate(True) / self.rate(False)

    @property
    def no_port_rate(self) -> float | None:
        rates = [p.rate for p in self.phases if not p.port]
        return statistics.mean(rates) if rates else None

    @property
    def worker_scrape_p50(self) -> float | None:
        values = [value for p in self.phases for value in p.scrape_ms]
        return percentile(values, 0.5) if values else None


def metrics_workload(admin: str, base_name: str, *, jobs: int, failed: int, renders: int,
                     drain_jobs: int, run_dir: Path) -> MetricsResult:
    """Fill, time ``render_metrics``, then the drains (see the module's docstring)."""
    name = f"{base_name}_metrics"
    url = db.recreate(admin, name)
    try:
        _fill(url, jobs, failed)
        times, size, client_ms, server_ms = asyncio.run(_renders(url, renders))
        phases = []
        for number, (scraped, port) in enumerate(
                [(False, True), (True, True), (False, False)] * 2):
            phases.append(_phase(url, drain_jobs, scraped=scraped, port=port,
                                 log=run_dir / f"metrics-drain-{number}.log"))
    finally:
        db.drop(admin, name)
    return MetricsResult(jobs=jobs, failed=failed, renders=len(times),
                         render_p50=percentile(times, 0.5), render_p99=percentile(times, 0.99),
                         render_max=max(times), body_bytes=size, render_cpu_client=client_ms,
                         render_cpu_postgres=server_ms, drain_jobs=drain_jobs,
                         phases=phases)


def _fill(url: str, jobs: int, failed: int) -> None:
    with psycopg.connect(url, autocommit=True) as connection:
        connection.execute("SET synchronous_commit = off")
        connection.execute(FILL, {"jobs": jobs, "failed": failed})
        connection.execute("VACUUM ANALYZE akadze.jobs")


async def _renders(url: str, count: int) -> tuple[list[float], int, float, float]:
    """Wall times of ``render_metrics`` (ms), the body's size, then the CPU one render
    costs this process and its Postgres backend (ms, means over ``count`` more renders
    on one connection: ``read_database`` and ``exposition``, what ``render_metrics`` runs
    on a pooled one). On a loaded host the wall time is mostly waiting for a core; the CPU
    is what the render itself spends."""
    app = App(url)
    try:
        times, size = [], 0
        for number in range(WARM_UP + count):
            started = time.perf_counter()
            body, _ = await render_metrics(app)
            spent = (time.perf_counter() - started) * 1000
            if number >= WARM_UP:
                times.append(spent)
                size = len(body)
        async with await psycopg.AsyncConnection.connect(url, autocommit=True) as connection:
            backend = connection.info.backend_pid
            await read_database(app, connection)
            client, server = time.process_time(), procs.cpu_seconds(backend) or 0.0
            for _ in range(count):
                exposition(await read_database(app, connection))
            client_ms = (time.process_time() - client) * 1000 / count
            server_ms = ((procs.cpu_seconds(backend) or 0.0) - server) * 1000 / count
        return times, size, client_ms, server_ms
    finally:
        await app.close_async()


def _phase(url: str, jobs: int, *, scraped: bool, port: bool, log: Path) -> Phase:
    """Drain ``jobs`` no-ops of QUEUE with one worker, scraped every second or not."""
    with psycopg.connect(url, autocommit=True) as connection:
        connection.execute("DELETE FROM akadze.jobs WHERE queue = %s", (QUEUE,))
        connection.execute("VACUUM ANALYZE akadze.jobs")
        connection.execute(
            "INSERT INTO akadze.jobs (task, queue, args) SELECT %s, %s, '{}'"
            " FROM generate_series(1, %s)", (NOOP, QUEUE, jobs))
    metrics_port = _free_port()
    argv = [*worker_argv(url, 10), "-q", QUEUE, "--log-level", "WARNING"]
    if port:
        argv += ["--metrics-port", str(metrics_port)]
    process = procs.start(argv, log=log, env=worker_env(url), cwd=REPO_ROOT)
    phase = Phase(scraped=scraped, port=port, rate=0.0)
    stop = threading.Event()
    scraper = threading.Thread(target=_scrape_every_second,
                               args=(url, metrics_port, phase, stop), daemon=True)
    try:
        if scraped:
            scraper.start()
        with psycopg.connect(url, autocommit=True) as connection:
            if not procs.wait_until(lambda: _drained(connection), timeout=900, interval=0.5):
                raise RuntimeError(f"the metrics drain did not finish: see {log}")
            row = connection.execute(
                "SELECT count(*), extract(epoch FROM max(finished_at) - min(started_at))"
                " FROM akadze.jobs WHERE queue = %s AND state = 'succeeded'",
                (QUEUE,)).fetchone()
    finally:
        stop.set()
        if scraper.is_alive():
            scraper.join(10)
        procs.stop(process)
    assert row is not None
    phase.rate = float(row[0]) / float(row[1])
    return phase


def _drained(connection: psycopg.Connection) -> bool:
    row = connection.execute(
        "SELECT NOT EXISTS (SELECT 1 FROM akadze.jobs WHERE state = 'queued' AND queue = %s)"
        " AND NOT EXISTS (SELECT 1 FROM akadze.jobs WHERE state = 'running' AND queue = %s)",
        (QUEUE, QUEUE)).fetchone()
    return bool(row and row[0])


def _scrape_every_second(url: str, port: int, phase: Phase, stop: threading.Event) -> None:
    """The worker's /metrics and the dashboard's render_metrics, once a second each."""
    app = App(url)
    loop = asyncio.new_event_loop()
    try:
        while not stop.is_set():
            started = time.perf_counter()
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics",
                                            timeout=5) as response:
                    response.read()
                phase.scrape_ms.append((time.perf_counter() - started) * 1000)
                phase.scrapes += 1
            except OSError:
                pass  # not listening yet
            loop.run_until_complete(render_metrics(app))
            stop.wait(max(0.0, 1.0 - (time.perf_counter() - started)))
    finally:
        loop.run_until_complete(app.close_async())
        loop.close()


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])
