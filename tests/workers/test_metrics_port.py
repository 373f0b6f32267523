"""``akadze worker --metrics-port``: the real command serves /metrics, and what it says
matches what was enqueued, run, retried and failed (parsed with prometheus_client's own
parser, as a scraper reads it)."""

from __future__ import annotations

import socket
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from prometheus_client.parser import text_string_to_metric_families

from akadze_core import App
from akadze_core.worker.metrics import DATABASE_INTERVAL
from tests.workers import metrics_app
from tests.workers.support import WorkerProcess, free_port, wait_until

pytestmark = pytest.mark.slow

APP = "tests.workers.metrics_app:app"

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


@pytest.fixture
def app(database_url: str) -> Iterator[App]:
    """The test module's App on this test's database (used to enqueue)."""
    metrics_app.app.set_database_url(database_url)
    yield metrics_app.app
    metrics_app.app.close()


def scrape(port: int, path: str = "/metrics") -> tuple[int, str, str]:
    """(status, content type, body) of one GET."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=10) as response:
            return response.status, response.headers["Content-Type"], response.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.headers["Content-Type"], exc.read().decode()


def samples(text: str) -> Samples:
    """Every sample of the exposition, by (name, labels)."""
    return {(sample.name, frozenset(sample.labels.items())): sample.value
            for family in text_string_to_metric_families(text) for sample in family.samples}


def value(found: Samples, name: str, **labels: str) -> float | None:
    return found.get((name, frozenset(labels.items())))


def test_the_worker_serves_counts_latency_and_run_time_of_what_it_ran(
        app: App, database_url: str, db: psycopg.Connection, tmp_path: Path) -> None:
    port = free_port()
    # Waiting in a queue nobody serves since a minute ago (database clock), and one not due.
    db.execute("INSERT INTO akadze.jobs (task, queue, scheduled_at) SELECT 'metrics.ok', "
               "'idle', now() - interval '60 seconds' FROM generate_series(1, 3)")
    metrics_app.ok.configure(queue="work", delay=3600).enqueue()
    for _ in range(5):
        metrics_app.ok.configure(queue="work").enqueue()
    for _ in range(3):
        metrics_app.refuse.configure(queue="work").enqueue()
    for _ in range(2):
        metrics_app.flaky.configure(queue="work").enqueue()
    for _ in range(2):
        metrics_app.slow.configure(queue="work").enqueue(seconds=0.3)
    worker = WorkerProcess(database_url, tmp_path / "worker.log",
                           ["worker", APP, "-q", "work", "--slots", "4", "--poll-interval",
                            "0.1", "--metrics-port", str(port)], module="akadze_core.cli.main")
    try:
        worker.wait_log(f"metrics on http://127.0.0.1:{port}/metrics")
        worker.wait_started()
        wait_until(lambda: db.execute(
            "SELECT count(*) FROM akadze.jobs WHERE queue = 'work' "
            "AND state IN ('succeeded', 'failed')").fetchone()[0] == 12, what="12 jobs done")

        def counted() -> bool:
            # Outcomes are written in batches (until the last one is counted), and the
            # database's series are read at most every DATABASE_INTERVAL seconds.
            found = samples(scrape(port)[2])
            return value(found, "akadze_job_runs_total", queue="work", task="metrics.flaky",
                         outcome="failed") == 2 and value(
                found, "akadze_jobs", queue="work", state="failed") == 5
        wait_until(counted, timeout=DATABASE_INTERVAL + 20, what="the last outcome counted")
        status, content_type, text = scrape(port)
        assert status == 200 and content_type.startswith("text/plain; version=0.0.4")
        found = samples(text)

        def runs(task: str, outcome: str) -> float | None:
            return value(found, "akadze_job_runs_total", queue="work", task=task,
                         outcome=outcome)
        assert runs("metrics.ok", "succeeded") == 5
        assert runs("metrics.slow", "succeeded") == 2
        assert runs("metrics.refuse", "failed") == 3
        assert runs("metrics.flaky", "retried") == 2
        assert runs("metrics.flaky", "failed") == 2
        assert runs("metrics.ok", "failed") is None
        # Every claim: 5 + 2 + 3 and the flaky jobs' two attempts each.
        assert value(found, "akadze_job_wait_seconds_count", queue="work") == 14
        assert value(found, "akadze_job_run_seconds_count", queue="work",
                     task="metrics.slow") == 2
        assert value(found, "akadze_job_run_seconds_bucket", queue="work",
                     task="metrics.slow", le="0.25") == 0
        assert value(found, "akadze_job_run_seconds_sum", queue="work",
                     task="metrics.slow") >= 0.6
        assert value(found, "akadze_job_run_seconds_bucket", queue="work",
                     task="metrics.ok", le="0.25") == 5
        # The database's side, as of this scrape.
        assert value(found, "akadze_database_up") == 1
        assert value(found, "akadze_jobs", queue="work", state="failed") == 5
        assert value(found, "akadze_jobs", queue="work", state="scheduled") == 1
        assert value(found, "akadze_jobs", queue="work", state="queued") == 0
        assert value(found, "akadze_jobs", queue="idle", state="queued") == 3
        assert value(found, "akadze_queue_oldest_job_age_seconds", queue="idle") >= 60
        assert value(found, "akadze_queue_oldest_job_age_seconds", queue="work") == 0
        assert value(found, "akadze_queue_workers", queue="work") == 1
        assert value(found, "akadze_queue_workers", queue="idle") == 0
        assert value(found, "akadze_workers_live") == 1
        assert value(found, "akadze_worker_slots", queue="work") == 4
        assert value(found, "akadze_worker_running_jobs", queue="work") == 0
        assert value(found, "akadze_worker_pending_outcomes") == 0
        assert ("process_resident_memory_bytes", frozenset()) in found
        # Nothing but /metrics (and its index) is served.
        assert scrape(port, "/nothing")[0] == 404
    finally:
        worker.stop()


def test_a_port_already_taken_stops_the_worker_with_one_clear_line(
        database_url: str, tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        worker = WorkerProcess(database_url, tmp_path / "worker.log",
                               ["worker", APP, "--metrics-port", str(port)],
                               module="akadze_core.cli.main")
        try:
            code, _ = worker.wait_exit(30)
        finally:
            worker.stop()
    assert code == 1
    assert f"cannot serve metrics on 127.0.0.1:{port}" in worker.log()
    assert "Traceback" not in worker.log()
