"""The dashboard workload: every page's server time on a big table.

The table is filled in SQL (``dashboard_fill.sql``: 1,000,000 jobs by default, 10,000 of
them failed, finished over the past week, a backlog and running jobs, 8 queues, 40 tasks),
vacuumed and analyzed as autovacuum would leave it. Then each page is requested through
the dashboard's ASGI app in this process (no socket, no browser): the figure is the time
from the request entering the app to its last body byte, the server time. Every page is
warmed once, then timed ``repeats`` times; the row shows the median and the worst.

``python -m bench.dashboard`` runs it alone (``--jobs``, ``--repeats``, ``--keep``).
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg

from . import db

FILL = Path(__file__).with_name("dashboard_fill.sql")
TARGET_MS = 150.0
METRICS_TARGET_MS = 50.0


@dataclass
class PageTime:
    """One page's server times in milliseconds."""

    name: str
    path: str
    status: int
    times: list[float] = field(default_factory=list)

    @property
    def median(self) -> float:
        """The median time."""
        return statistics.median(self.times)

    @property
    def worst(self) -> float:
        """The slowest time."""
        return max(self.times)


@dataclass
class DashboardResult:
    """Every page's times, on a table of ``jobs`` jobs of which ``failed`` failed."""

    jobs: int
    failed: int
    pages: list[PageTime]
    fill_seconds: float


def fill(url: str, jobs: int, failed: int) -> float:
    """Fill ``akadze.jobs`` with ``jobs`` jobs (``failed`` of them failed); seconds taken."""
    started = time.monotonic()
    # 2,000 queued, 500 scheduled and 100 running at a million jobs, in proportion below.
    params = {"jobs": jobs, "failed": failed, "queued": min(2_000, jobs // 500),
              "scheduled": min(500, jobs // 2_000), "running": min(100, jobs // 10_000)}
    with psycopg.connect(url, autocommit=True) as connection:
        connection.execute("TRUNCATE akadze.jobs, akadze.workers RESTART IDENTITY")
        connection.execute(FILL.read_text("utf-8"), params)
        connection.execute(
            "UPDATE akadze.jobs SET scheduled_at = now() + interval '1 hour' WHERE id IN "
            "(SELECT id FROM akadze.jobs WHERE state = 'queued' ORDER BY id LIMIT %(scheduled)s)",
            params)
        connection.execute("INSERT INTO akadze.workers (name, hostname, pid, queues, "
                           "heartbeat_ttl) VALUES ('bench', 'bench', 1, '{q0,q1}', "
                           "interval '30 seconds')")
        connection.execute("VACUUM ANALYZE akadze.jobs")
    return time.monotonic() - started


async def _call(app: Any, path: str) -> tuple[int, float]:
    """GET ``path`` through the ASGI app; (status, milliseconds to the last body byte)."""
    raw_path, _, query = path.partition("?")
    scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1",
             "method": "GET", "scheme": "http", "path": raw_path,
             "raw_path": raw_path.encode(), "query_string": query.encode(), "root_path": "",
             "headers": [(b"host", b"bench")], "client": ("127.0.0.1", 1),
             "server": ("bench", 80)}
    status = 0
    sent = False

    async def receive() -> dict[str, Any]:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": b"", "more_body": False}
        await asyncio.sleep(3600)
        return {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        nonlocal status
        if message["type"] == "http.response.start":
            status = int(message["status"])

    started = time.perf_counter()
    await app(scope, receive, send)
    return status, (time.perf_counter() - started) * 1000


def pages(url: str) -> list[tuple[str, str]]:
    """(name, path) of the pages timed, with ids and times taken from the table."""
    with psycopg.connect(url, autocommit=True) as connection:
        failed_id = connection.execute(
            "SELECT max(id) FROM akadze.jobs WHERE state = 'failed'").fetchone()[0]
        middle = connection.execute("SELECT (min(id) + max(id)) / 2 FROM akadze.jobs"
                                    ).fetchone()[0]
        since, until = connection.execute(
            "SELECT to_char(now() - interval '3 days', 'YYYY-MM-DD\"T\"HH24:MI'), "
            "to_char(now() - interval '2 days', 'YYYY-MM-DD\"T\"HH24:MI')").fetchone()
    return [
        ("overview", "/"),
        ("jobs, no filter", "/jobs"),
        ("jobs, failed", "/jobs?state=failed"),
        ("jobs, failed in one queue", "/jobs?state=failed&queue=q4"),
        ("jobs, a task with no jobs (a whole id window)", "/jobs?task=tasks.none"),
        ("jobs, a page in the middle of the table", f"/jobs?before={middle}"),
        ("jobs, a day three days ago", f"/jobs?since={since}&until={until}"),
        ("jobs, queued", "/jobs?state=queued&queue=q1"),
        ("jobs, find by job id", f"/jobs?find={failed_id}"),
        ("jobs, find a missing task id", "/jobs?find=no-such-task-id"),
        ("a failed job", f"/jobs/{failed_id}"),
        ("workers", "/workers"),
        ("schedules", "/schedules"),
        ("metrics", "/metrics"),
    ]


def time_pages(url: str, repeats: int) -> list[PageTime]:
    """Each page's server times (one warm-up call first)."""
    from akadze_core import App
    from akadze_core.dashboard import create_app

    app = App(url)
    web = create_app(app)

    async def run() -> list[PageTime]:
        found = []
        for name, path in pages(url):
            status, _ = await _call(web, path)
            page = PageTime(name, path, status)
            for _ in range(repeats):
                page.times.append((await _call(web, path))[1])
            found.append(page)
        return found

    try:
        return asyncio.run(run())
    finally:
        web.state.dashboard.close()
        app.close()


def dashboard_workload(url: str, jobs: int, failed: int = 10_000,
                       repeats: int = 10) -> DashboardResult:
    """Fill the table, then time every page."""
    seconds = fill(url, jobs, failed)
    return DashboardResult(jobs, failed, time_pages(url, repeats), seconds)


def describe(result: DashboardResult) -> list[str]:
    """One line per page: median and worst server time against the target."""
    lines = []
    for page in result.pages:
        target = METRICS_TARGET_MS if page.path == "/metrics" else TARGET_MS
        if page.status == 404 and page.path == "/metrics":
            lines.append(f"{page.name}: not available in this build")
            continue
        ok = page.status in (200, 303) and page.worst < target
        lines.append(f"{page.name} ({page.path}, {page.status}): median {page.median:.1f} ms, "
                     f"worst {page.worst:.1f} ms, target < {target:.0f} ms: "
                     f"{'pass' if ok else 'FAIL'}")
    return lines


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m bench.dashboard``: the workload alone, in ``akadze_bench_dashboard``."""
    parser = argparse.ArgumentParser(prog="python -m bench.dashboard", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--jobs", type=int, default=1_000_000)
    parser.add_argument("--failed", type=int, default=10_000)
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--database", default=f"{db.NAME_PREFIX}_dashboard")
    parser.add_argument("--keep", action="store_true", help="keep the database")
    options = parser.parse_args(argv)
    admin = db.admin_url()
    url = db.recreate(admin, options.database)
    try:
        result = dashboard_workload(url, options.jobs, options.failed, options.repeats)
    finally:
        if not options.keep:
            db.drop(admin, options.database)
    print(f"{result.jobs:,} jobs ({result.failed:,} failed), filled in "
          f"{result.fill_seconds:.0f} s")
    for line in describe(result):
        print(line)
    return 0 if all("FAIL" not in line for line in describe(result)) else 1


if __name__ == "__main__":
    raise SystemExit(main())
