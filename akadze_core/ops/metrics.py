"""Prometheus metrics read from the database: what ``/metrics`` of the dashboard serves
(``render_metrics``) and the database half of ``akadze worker --metrics-port``.

Every series is cheap to scrape on a table of millions of jobs: counts come from partial
indexes read up to a cap (``COUNT_CAP``) or from the planner's statistics, the oldest job's
age from a loose index scan, the recent latency and run-time histograms from the jobs
finished in the last ``RECENT_WINDOW`` seconds (at most ``RECENT_CAP`` per state), so a
scrape never scans the table. Ages are computed by the database, on its clock. The names
and what each means: migration_guide/metrics.md.

The exposition is prometheus_client's (the ``metrics`` extra): the text format 0.0.4.
"""

from __future__ import annotations

import logging
from collections import defaultdict
from collections.abc import Iterable, Iterator, Sequence
from typing import TYPE_CHECKING, Any

import psycopg
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import GaugeHistogramMetricFamily, GaugeMetricFamily
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector

from ..model.errors import AkadzeError
from ..store import database

if TYPE_CHECKING:
    from ..app import App

logger = logging.getLogger("akadze.metrics")

#: The content type of every metrics response: the text format 0.0.4, which every Prometheus
#: (and every scraper speaking its format) reads; prometheus_client writes it.
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
#: Histogram buckets (seconds) of the enqueue-to-start latency and of the run time: from a
#: warm worker's few milliseconds to an hour-long job or backlog.
BUCKETS: tuple[float, ...] = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
                              30.0, 60.0, 300.0, 900.0, 3600.0)
#: The most index entries one scrape reads per state for ``akadze_jobs`` (a larger backlog
#: reads as this many; ``akadze_jobs_count_limit`` exports it). Index-only, 100,000 entries
#: cost Postgres about 10 ms.
COUNT_CAP = 100_000
#: The most (queue, priority) pairs the oldest-job probe visits (one index probe each).
PRIORITY_GROUPS = 1000
#: The window (seconds) of the dashboard's recent histograms and finished counts.
RECENT_WINDOW = 300.0
#: The most jobs per final state the recent window reads (the newest ones): enough for a
#: histogram, and 5,000 rows cost Postgres about 5 ms.
RECENT_CAP = 5_000
#: The states ``akadze_jobs`` reports per queue; each is exported, 0 included, for every
#: queue seen, so that a drained queue reads 0 instead of vanishing.
COUNTED_STATES = ("waiting", "queued", "scheduled", "running", "failed", "cancelled")

# The GROUPING() bitmask of each grouping set of metrics_recent (queue, task, state,
# wait_bucket, run_bucket: a bit is set for each column not grouped on).
_BY_TASK, _WAIT, _RUN = 0b00011, 0b01101, 0b10110


class _Families(Collector):
    """A collector that yields families made beforehand (one render)."""

    def __init__(self, families: Iterable[Metric]) -> None:
        self._families = list(families)

    def collect(self) -> Iterator[Metric]:
        return iter(self._families)


def exposition(families: Iterable[Metric], *collectors: Collector) -> bytes:
    """The text exposition of ``families`` and then of ``collectors``' families."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Families(families))
    for collector in collectors:
        registry.register(collector)
    return generate_latest(registry)


async def read_database(app: App, connection: psycopg.AsyncConnection | None = None, *,
                        recent: bool = True) -> list[Metric]:
    """The database's metric families (with the recent window when ``recent``), on
    ``connection`` or on a pooled one of ``app``. A database that cannot be read gives
    ``akadze_database_up 0`` and no other family (the error is logged, redacted)."""

    async def read(connection: psycopg.AsyncConnection) -> dict[str, list[dict[str, Any]]]:
        return await database.metrics_snapshot(
            connection, count_cap=COUNT_CAP, priority_groups=PRIORITY_GROUPS,
            recent_window=RECENT_WINDOW if recent else None, recent_cap=RECENT_CAP,
            bounds=BUCKETS)

    up = GaugeMetricFamily("akadze_database_up",
                           "1 when this scrape could read the akadze schema, else 0")
    try:
        rows = await (read(connection) if connection is not None
                      else app.connections.run_pooled_async(read))
    except (psycopg.Error, AkadzeError, OSError) as exc:
        logger.warning("metrics: reading the database failed: %s",
                       app.redact(" ".join(str(exc).split()) or type(exc).__name__))
        up.add_metric([], 0)
        return [up]
    up.add_metric([], 1)
    families = [up, *database_families(rows)]
    if recent:
        families += recent_families(rows["metrics_recent"])
    return families


async def render_metrics(app: App) -> tuple[bytes, str]:
    """The dashboard's ``/metrics``: the database's series and the recent window's
    histograms, as (body, content type) in the Prometheus text format."""
    return exposition(await read_database(app)), CONTENT_TYPE


def database_families(rows: dict[str, list[dict[str, Any]]]) -> list[Metric]:
    """Counts, estimates, oldest ages and workers from ``database.metrics_snapshot``."""
    jobs = GaugeMetricFamily(
        "akadze_jobs", "Jobs per queue and state: waiting, queued (due), scheduled (queued, "
        "not due yet), running, failed, cancelled; exact up to akadze_jobs_count_limit per "
        "state", labels=["queue", "state"])
    queues = rows["metrics_queues"]
    counts: dict[tuple[str, str], int] = {(row["queue"], row["state"]): int(row["jobs"])
                                          for row in rows["metrics_job_counts"]}
    names = sorted({queue for queue, _ in counts} | {row["queue"] for row in queues})
    for queue in names:
        for state in COUNTED_STATES:
            jobs.add_metric([queue, state], counts.get((queue, state), 0))
    limit = GaugeMetricFamily("akadze_jobs_count_limit",
                              "The most jobs akadze_jobs counts per state in one scrape")
    limit.add_metric([], COUNT_CAP)
    estimated = GaugeMetricFamily(
        "akadze_jobs_estimated", "Jobs per state in the whole table, estimated from the "
        "planner's statistics (as of the last ANALYZE, scaled to the table's size)",
        labels=["state"])
    for row in sorted(rows["metrics_state_estimates"], key=lambda row: row["state"]):
        estimated.add_metric([row["state"]], int(row["jobs"]))
    oldest = GaugeMetricFamily(
        "akadze_queue_oldest_job_age_seconds", "How long the oldest due job of the queue "
        "has waited since it was due (0: none waits), on the database clock",
        labels=["queue"])
    served = GaugeMetricFamily("akadze_queue_workers", "Live workers that serve the queue",
                               labels=["queue"])
    for row in queues:
        oldest.add_metric([row["queue"]], float(row["oldest_age"]))
        served.add_metric([row["queue"]], int(row["workers"]))
    workers = rows["metrics_workers"][0]
    live = GaugeMetricFamily("akadze_workers_live", "Workers whose heartbeat is within "
                             "their heartbeat TTL (database clock)")
    live.add_metric([], int(workers["live"]))
    registered = GaugeMetricFamily("akadze_workers_registered", "Rows of akadze.workers, "
                                   "live or not rescued yet")
    registered.add_metric([], int(workers["registered"]))
    return [jobs, limit, estimated, oldest, served, live, registered]


def recent_families(rows: Sequence[dict[str, Any]]) -> list[Metric]:
    """The recent window's finished counts and its two gauge histograms."""
    window = GaugeMetricFamily("akadze_recent_window_seconds",
                               "The window of the akadze_recent_* series")
    window.add_metric([], RECENT_WINDOW)
    finished = GaugeMetricFamily(
        "akadze_recent_jobs_finished", "Jobs that reached a final state in the recent window "
        f"(at most {RECENT_CAP:,} per state), per queue, task and state",
        labels=["queue", "task", "state"])
    waits: dict[str, list[tuple[int, int, float]]] = defaultdict(list)
    runs: dict[str, list[tuple[int, int, float]]] = defaultdict(list)
    for row in rows:
        grouping = row["grouping_id"]
        if grouping == _BY_TASK:
            finished.add_metric([row["queue"], row["task"], row["state"]], int(row["jobs"]))
        elif grouping == _WAIT and row["wait_bucket"] is not None:
            waits[row["queue"]].append((row["wait_bucket"], int(row["jobs"]), row["wait_sum"]))
        elif grouping == _RUN and row["run_bucket"] is not None:
            runs[row["task"]].append((row["run_bucket"], int(row["jobs"]), row["run_sum"]))
    wait = GaugeHistogramMetricFamily(
        "akadze_recent_job_wait_seconds", "Enqueue-to-start latency (from when the job was "
        "due to its start) of the jobs finished in the recent window, per queue",
        labels=["queue"])
    for queue, buckets in sorted(waits.items()):
        wait.add_metric([queue], *_cumulative(buckets))
    run = GaugeHistogramMetricFamily(
        "akadze_recent_job_run_seconds", "Run time (start to finish, database clock) of the "
        "jobs finished in the recent window, per task", labels=["task"])
    for task, buckets in sorted(runs.items()):
        run.add_metric([task], *_cumulative(buckets))
    return [window, finished, wait, run]


def _cumulative(buckets: Iterable[tuple[int, int, float]]
                ) -> tuple[list[tuple[str, float]], float]:
    """Prometheus buckets (cumulative counts per upper bound, +Inf last) and the sum, from
    width_bucket's (bucket, count, sum) rows: bucket i holds [BUCKETS[i-1], BUCKETS[i])."""
    counts = [0] * (len(BUCKETS) + 1)
    total = 0.0
    for bucket, count, value_sum in buckets:
        counts[bucket] += count
        total += float(value_sum or 0.0)
    cumulative, running = [], 0
    for bound, count in zip((*map(_bound, BUCKETS), "+Inf"), counts, strict=True):
        running += count
        cumulative.append((bound, float(running)))
    return cumulative, total


def _bound(value: float) -> str:
    return f"{value:g}"


__all__ = ["BUCKETS", "CONTENT_TYPE", "exposition", "read_database", "render_metrics"]
