"""``akadze_core.ops.metrics``: what the dashboard's /metrics says of a table whose rows are
known, read back with prometheus_client's parser; and that no statement of a scrape scans
the jobs table."""

from __future__ import annotations

import psycopg
import pytest
from prometheus_client.parser import text_string_to_metric_families

from akadze_core import App
from akadze_core.ops import metrics
from akadze_core.store.queries import query

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


def parse(body: bytes) -> Samples:
    return {(sample.name, frozenset(sample.labels.items())): sample.value
            for family in text_string_to_metric_families(body.decode())
            for sample in family.samples}


def value(found: Samples, name: str, **labels: str) -> float | None:
    return found.get((name, frozenset(labels.items())))


def insert(db: psycopg.Connection, rows: int, *, task: str = "t", queue: str = "a",
           state: str = "queued", scheduled: str = "0", started: str | None = None,
           finished: str | None = None, worker_id: int | None = None) -> None:
    """``rows`` jobs; the times are intervals before the database's now() (negative: later)."""
    db.execute(
        "INSERT INTO akadze.jobs (task, queue, state, scheduled_at, started_at, finished_at, "
        "worker_id) SELECT %(task)s, %(queue)s, %(state)s, "
        "now() - %(scheduled)s::interval, now() - %(started)s::interval, "
        "now() - %(finished)s::interval, %(worker_id)s FROM generate_series(1, %(rows)s)",
        {"task": task, "queue": queue, "state": state, "scheduled": scheduled,
         "started": started, "finished": finished, "worker_id": worker_id, "rows": rows})


def worker(db: psycopg.Connection, queues: list[str], heartbeat_ago: str) -> None:
    db.execute("INSERT INTO akadze.workers (name, hostname, pid, queues, heartbeat_ttl, "
               "heartbeat_at) VALUES ('w', 'h', 1, %s, interval '30 seconds', "
               "now() - %s::interval)", (queues, heartbeat_ago))


@pytest.fixture
def known(db: psycopg.Connection) -> None:
    """Queue a: 4 due (two of them since 2 minutes), 2 not due, 1 running; queue b: what
    finished in the last minutes, and one succeeded an hour ago; a live worker on a and a
    dead one on c."""
    insert(db, 2, scheduled="10 seconds")
    insert(db, 2, scheduled="120 seconds")
    insert(db, 2, scheduled="-1 hour")
    insert(db, 1, state="running", scheduled="5 seconds", started="4 seconds", worker_id=1)
    insert(db, 3, task="t.fail", queue="b", state="failed", scheduled="14 seconds",
           started="12 seconds", finished="10 seconds")
    insert(db, 2, task="t.ok", queue="b", state="succeeded", scheduled="10.32 seconds",
           started="10.3 seconds", finished="10 seconds")
    insert(db, 1, task="t.ok", queue="b", state="cancelled", scheduled="20 seconds",
           finished="20 seconds")
    insert(db, 1, task="t.ok", queue="b", state="succeeded", scheduled="1 hour",
           started="1 hour", finished="1 hour")
    worker(db, ["a"], "1 second")
    worker(db, ["c"], "1 hour")
    db.execute("ANALYZE akadze.jobs")


async def test_the_dashboard_render_counts_ages_workers_and_the_recent_window(
        app: App, known: None) -> None:
    body, content_type = await metrics.render_metrics(app)
    assert content_type == "text/plain; version=0.0.4; charset=utf-8"
    found = parse(body)
    assert value(found, "akadze_database_up") == 1
    expected = {("a", "queued"): 4, ("a", "scheduled"): 2, ("a", "running"): 1,
                ("a", "failed"): 0, ("b", "failed"): 3, ("b", "cancelled"): 1,
                ("b", "queued"): 0}
    for (queue, state), jobs in expected.items():
        assert value(found, "akadze_jobs", queue=queue, state=state) == jobs, (queue, state)
    assert value(found, "akadze_jobs_estimated", state="succeeded") == 3
    assert value(found, "akadze_jobs_estimated", state="queued") == 6
    assert 120 <= value(found, "akadze_queue_oldest_job_age_seconds", queue="a") < 180
    assert value(found, "akadze_queue_workers", queue="a") == 1
    assert value(found, "akadze_queue_workers", queue="c") is None  # its worker is dead
    assert value(found, "akadze_workers_live") == 1
    assert value(found, "akadze_workers_registered") == 2
    # The window holds the last 5 minutes: not the job of an hour ago.
    assert value(found, "akadze_recent_jobs_finished", queue="b", task="t.ok",
                 state="succeeded") == 2
    assert value(found, "akadze_recent_jobs_finished", queue="b", task="t.fail",
                 state="failed") == 3
    assert value(found, "akadze_recent_jobs_finished", queue="b", task="t.ok",
                 state="cancelled") == 1
    # Waits: 0.02 s twice, 2 s three times; the cancelled job never started.
    assert value(found, "akadze_recent_job_wait_seconds_bucket", queue="b", le="0.01") == 0
    assert value(found, "akadze_recent_job_wait_seconds_bucket", queue="b", le="0.025") == 2
    assert value(found, "akadze_recent_job_wait_seconds_bucket", queue="b", le="1") == 2
    assert value(found, "akadze_recent_job_wait_seconds_bucket", queue="b", le="2.5") == 5
    assert value(found, "akadze_recent_job_wait_seconds_bucket", queue="b", le="+Inf") == 5
    assert value(found, "akadze_recent_job_wait_seconds_gcount", queue="b") == 5
    assert value(found, "akadze_recent_job_wait_seconds_gsum", queue="b") == pytest.approx(6.04)
    # Run times: t.ok 0.3 s twice, t.fail 2 s three times.
    assert value(found, "akadze_recent_job_run_seconds_bucket", task="t.ok", le="0.25") == 0
    assert value(found, "akadze_recent_job_run_seconds_bucket", task="t.ok", le="0.5") == 2
    assert value(found, "akadze_recent_job_run_seconds_bucket", task="t.fail", le="1") == 0
    assert value(found, "akadze_recent_job_run_seconds_bucket", task="t.fail",
                 le="2.5") == 3
    assert value(found, "akadze_recent_job_run_seconds_gsum", task="t.fail") == \
        pytest.approx(6.0)


async def test_a_count_stops_at_the_cap_and_the_cap_is_exported(
        app: App, known: None, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(metrics, "COUNT_CAP", 3)
    found = parse((await metrics.render_metrics(app))[0])
    assert value(found, "akadze_jobs_count_limit") == 3
    # queued and scheduled are one state in the table: 3 of its 6 rows are read.
    assert (value(found, "akadze_jobs", queue="a", state="queued")
            + value(found, "akadze_jobs", queue="a", state="scheduled")) == 3
    assert value(found, "akadze_jobs", queue="b", state="failed") == 3


async def test_a_database_that_cannot_be_read_says_so_in_one_gauge(
        app: App, database_url: str) -> None:
    connection = await psycopg.AsyncConnection.connect(database_url, autocommit=True)
    await connection.close()
    families = await metrics.read_database(app, connection)
    found = parse(metrics.exposition(families))
    assert found == {("akadze_database_up", frozenset()): 0}


@pytest.mark.parametrize("name", ["metrics_job_counts", "metrics_state_estimates",
                                  "metrics_queues", "metrics_workers", "metrics_recent"])
def test_no_statement_of_a_scrape_scans_the_jobs_table(db: psycopg.Connection,
                                                        name: str) -> None:
    """Behind 20,000 succeeded jobs (analyzed), every count and probe goes through an index."""
    insert(db, 20_000, state="succeeded", scheduled="1 day", started="1 day",
           finished="1 day")
    insert(db, 200, queue="b", state="failed", scheduled="1 day", started="1 day",
           finished="1 day")
    insert(db, 300, scheduled="1 minute")
    insert(db, 10, state="running", started="1 second", worker_id=1)
    db.execute("VACUUM ANALYZE akadze.jobs")
    params = {"cap": metrics.COUNT_CAP, "groups": metrics.PRIORITY_GROUPS,
              "window": metrics.RECENT_WINDOW, "bounds": list(metrics.BUCKETS)}
    plan = "\n".join(row[0] for row in db.execute("EXPLAIN " + query(name), params))
    assert "Seq Scan on jobs" not in plan, plan
