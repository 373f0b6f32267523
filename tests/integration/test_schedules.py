"""Schedules on real Postgres: each tick enqueued once by however many workers, new and
changed schedules not firing for the past, downtime catching up with the latest tick only,
names as data, and ``akadze schedules``.

Time is the database's: instead of waiting for a long trigger's next tick, a test moves the
schedule's stored ``last_tick`` back (as if the workers had been down) and checks again.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator
from dataclasses import replace
from datetime import datetime, timedelta, timezone
from typing import Any

import psycopg
import pytest
from click.testing import CliRunner, Result

from akadze_core import App, Cron, Every, Scheduler, Worker
from akadze_core.cli.main import cli
from tests.integration.outcome_helpers import FAST, running, wait_until
from tests.integration.schedule_helpers import check, db_now, jobs, rewind, schedule_row
from tests.integration.schedules_app import app as cli_schedules_app

HOUR = timedelta(hours=1)
HOSTILE = "x'); DROP TABLE akadze.schedules;--"
CLI_APP = "tests.integration.schedules_app:app"


# --- helpers -------------------------------------------------------------------------------------

@pytest.fixture
async def apps(database_url: str) -> AsyncIterator[list[App]]:
    """Apps on the test database (several deploys, or several worker processes)."""
    made: list[App] = []
    yield made
    for app in made:
        await app.close_async()


def new_app(apps: list[App], database_url: str) -> App:
    app = App(database_url)
    apps.append(app)
    return app


# --- what one check does -------------------------------------------------------------------------

async def test_a_due_tick_enqueues_one_job_with_the_schedule_fields(
    app: App, db: psycopg.Connection, database_url: str
) -> None:
    app.task("report.build", queue="reports", priority=2, max_attempts=4)(lambda kind: kind)
    app.add_schedule("reports.hourly", "report.build", trigger=Every(HOUR),
                     args={"kind": "daily"}, priority=5, expires=timedelta(minutes=30),
                     meta={"owner": "ops"})
    await check(app, database_url)
    started = schedule_row(db, "reports.hourly")
    assert started is not None and started["spec"] == "every 3600s"
    assert started["last_tick"] == Every(HOUR).latest(db_now(db)) and started["last_run"] is None
    assert jobs(db) == []

    rewind(db, "reports.hourly", HOUR)
    with psycopg.connect(database_url, autocommit=True) as listener:
        listener.execute("LISTEN akadze_jobs")
        await check(app, database_url)
        heard = [notify.payload for notify in listener.notifies(timeout=2, stop_after=1)]
    assert heard == ["reports"]
    [job] = jobs(db)
    tick = schedule_row(db, "reports.hourly")["last_tick"]  # type: ignore[index]
    assert tick == started["last_tick"]
    assert (job["task"], job["queue"], job["args"], job["priority"], job["max_attempts"]) == \
        ("report.build", "reports", {"kind": "daily"}, 5, 4)
    assert job["state"] == "queued" and job["scheduled_at"] <= db_now(db)
    assert job["expires_at"] == tick + timedelta(minutes=30)
    assert datetime.fromisoformat(job["meta"].pop("tick")) == tick
    assert job["meta"] == {"owner": "ops", "schedule": "reports.hourly"}
    assert schedule_row(db, "reports.hourly")["last_run"] == tick  # type: ignore[index]

    await check(app, database_url)
    assert len(jobs(db)) == 1


async def test_a_new_schedule_does_not_run_for_ticks_before_it_existed(
    app: App, db: psycopg.Connection, database_url: str
) -> None:
    app.add_schedule("minutely", "t", trigger=Cron("* * * * *"))
    app.add_schedule("yearly", "t", trigger="0 0 1 1 *")
    before = db_now(db)
    wait = await check(app, database_url)
    assert jobs(db) == []
    row = schedule_row(db, "minutely")
    assert row is not None and row["last_run"] is None
    assert before - timedelta(minutes=1) < row["last_tick"] <= db_now(db)
    yearly = schedule_row(db, "yearly")
    assert yearly is not None and yearly["last_tick"].month == 1
    # The worker comes back at the next minute's tick, or within a minute.
    assert 1.0 <= wait <= 60.0


async def test_a_changed_trigger_starts_over_without_running(
    apps: list[App], db: psycopg.Connection, database_url: str
) -> None:
    old_deploy = new_app(apps, database_url)
    old_deploy.add_schedule("report", "t", trigger=Every(HOUR))
    await check(old_deploy, database_url)
    rewind(db, "report", 3 * HOUR)  # a tick of the old trigger is due

    new_deploy = new_app(apps, database_url)
    new_trigger = Cron("0 0 1 1 *", timezone="Europe/Berlin")
    new_deploy.add_schedule("report", "t", trigger=new_trigger)
    await check(new_deploy, database_url)
    assert jobs(db) == []
    row = schedule_row(db, "report")
    assert row is not None and row["spec"] == new_trigger.spec
    assert row["last_tick"] == new_trigger.latest(db_now(db))

    # From then on the new trigger's ticks run as usual.
    await check(new_deploy, database_url)
    assert jobs(db) == []
    rewind(db, "report", timedelta(days=400))
    await check(new_deploy, database_url)
    [job] = jobs(db)
    assert job["meta"]["tick"] == new_trigger.latest(db_now(db)).isoformat()  # type: ignore[union-attr]


async def test_after_downtime_only_the_latest_missed_tick_runs(
    app: App, db: psycopg.Connection, database_url: str
) -> None:
    # Hourly: a tick boundary crossed between the two checks would rightly run a new tick.
    trigger = Every(HOUR)
    app.add_schedule("hourly", "t", trigger=trigger)
    await check(app, database_url)
    rewind(db, "hourly", timedelta(days=3))  # 72 missed ticks
    before = db_now(db)
    await check(app, database_url)
    await check(app, database_url)
    [job] = jobs(db)
    tick = schedule_row(db, "hourly")["last_tick"]  # type: ignore[index]
    assert before - HOUR < tick <= db_now(db)
    assert trigger.latest(tick) == tick
    assert datetime.fromisoformat(job["meta"]["tick"]) == tick


async def test_removed_schedules_stop_and_their_rows_are_left_alone(
    apps: list[App], db: psycopg.Connection, database_url: str
) -> None:
    old_deploy = new_app(apps, database_url)
    old_deploy.add_schedule("kept", "t", trigger=Every(HOUR))
    old_deploy.add_schedule("gone", "t", trigger=Every(HOUR))
    await check(old_deploy, database_url)
    rewind(db, "kept", HOUR)
    rewind(db, "gone", HOUR)
    gone_before = schedule_row(db, "gone")

    new_deploy = new_app(apps, database_url)
    new_deploy.add_schedule("kept", "t", trigger=Every(HOUR))
    await check(new_deploy, database_url)
    assert [job["meta"]["schedule"] for job in jobs(db)] == ["kept"]
    assert schedule_row(db, "gone") == gone_before


async def test_hostile_names_are_stored_literally(
    app: App, db: psycopg.Connection, database_url: str
) -> None:
    names = [HOSTILE, "ünï'cödé \"quoted\" %(name)s {0} \\", "-- comment"]
    for name in names:
        app.add_schedule(name, HOSTILE, trigger=Every(HOUR), queue=name, args={"name": name})
    await check(app, database_url)
    for name in names:
        rewind(db, name, HOUR)
    await check(app, database_url)
    found = {(job["meta"]["schedule"], job["task"], job["queue"], job["args"]["name"])
             for job in jobs(db)}
    assert found == {(name, HOSTILE, name, name) for name in names}
    stored = db.execute("SELECT name FROM akadze.schedules ORDER BY name").fetchall()
    assert sorted(row[0] for row in stored) == sorted(names)
    tables = db.execute("SELECT count(*) FROM pg_tables WHERE schemaname = 'akadze'").fetchone()
    # control_replies, control_requests, jobs, limit_starts, limits, migrations,
    # queue_pauses, repeatable_migrations, saved_groups, schedules, task_id_key, workers:
    # nothing new
    assert tables == (12,)


# --- exactly once under contention ---------------------------------------------------------------

async def race_rounds(app: App, db: psycopg.Connection, url: str, name: str) -> None:
    """Five rounds of twelve connections checking at once after the schedule is rewound an
    hour: each round must add exactly one job."""
    connections = [await psycopg.AsyncConnection.connect(url, autocommit=True)
                   for _ in range(12)]
    try:
        for round_number in range(1, 6):
            rewind(db, name, HOUR)
            await asyncio.gather(*(Scheduler(app).enqueue_due(connection)
                                   for connection in connections))
            assert len(jobs(db)) == round_number
    finally:
        for connection in connections:
            await connection.close()


async def test_concurrent_checks_for_the_same_tick_insert_one_job(
    app: App, db: psycopg.Connection, database_url: str
) -> None:
    app.add_schedule("race", "t", trigger=Every(HOUR))
    await check(app, database_url)
    await race_rounds(app, db, database_url, "race")
    ticks = {job["meta"]["tick"] for job in jobs(db)}
    assert len(ticks) == 1  # the same tick, re-armed by each rewind


class HourAfterTheLastRun:
    """A trigger that decides from the last run, like Celery's is_due: due an hour after
    it, at whatever ``now`` each worker reads (so their ticks differ)."""

    spec = "an hour after the last run"

    def latest(self, at: datetime) -> datetime | None:
        return None

    def latest_after(self, last_tick: datetime, at: datetime) -> datetime | None:
        return at if at - last_tick >= HOUR else None

    def next(self, after: datetime) -> datetime:
        return after + timedelta(seconds=1)


async def test_concurrent_checks_of_a_last_run_trigger_insert_one_job_per_run(
    app: App, db: psycopg.Connection, database_url: str
) -> None:
    """Every check that read the rewound row computes a tick of its own; only the first
    enqueues: for the others the stored last tick moved under them."""
    app.add_schedule("due", "t", trigger=HourAfterTheLastRun())
    await check(app, database_url)
    assert jobs(db) == []  # a new schedule starts from now, as Celery beat's entries do
    await race_rounds(app, db, database_url, "due")
    row = schedule_row(db, "due")
    assert row is not None
    assert row["last_tick"].isoformat() == jobs(db)[-1]["meta"]["tick"]


async def test_a_check_that_waited_for_the_row_lock_inserts_nothing(
    app: App, db: psycopg.Connection, database_url: str
) -> None:
    app.add_schedule("locked", "t", trigger=Every(HOUR))
    await check(app, database_url)
    rewind(db, "locked", HOUR)
    holder = await psycopg.AsyncConnection.connect(database_url)  # one open transaction
    contender = await psycopg.AsyncConnection.connect(database_url, autocommit=True)
    try:
        await Scheduler(app).enqueue_due(holder)  # row locked, job not committed yet
        waiting = asyncio.create_task(Scheduler(app).enqueue_due(contender))
        blocked = ("SELECT count(*) FROM pg_stat_activity "
                   "WHERE pid = %s AND wait_event_type = 'Lock'")
        await wait_until(lambda: db.execute(blocked, (contender.info.backend_pid,)).fetchone()
                         == (1,), what="the contender to wait for the row lock")
        await holder.commit()
        await asyncio.wait_for(waiting, 5)
    finally:
        await holder.close()
        await contender.close()
    assert len(jobs(db)) == 1


async def test_several_workers_enqueue_each_tick_once(
    apps: list[App], db: psycopg.Connection, database_url: str
) -> None:
    """Four worker processes' worth (separate apps, pools and workers), started at once, over
    several ticks of a one-second schedule. No worker serves the schedule's queue: every
    worker schedules, whatever its queues."""
    workers = []
    for number in range(4):
        app = new_app(apps, database_url)
        app.add_schedule("every-second", "tick.task", trigger=Every(1), queue="ticks")
        workers.append(Worker(app, name=f"scheduler-{number}", **FAST))

    def distinct_ticks() -> int:
        row = db.execute("SELECT count(DISTINCT meta->>'tick') FROM akadze.jobs").fetchone()
        return int(row[0]) if row else 0

    async with running(workers[0]), running(workers[1]), running(workers[2]), \
            running(workers[3]):
        await wait_until(lambda: distinct_ticks() >= 4, timeout=15,
                         what="four ticks enqueued")
    found = jobs(db)
    ticks = [job["meta"]["tick"] for job in found]
    assert len(ticks) == len(set(ticks)) >= 4, ticks
    assert {(job["task"], job["queue"], job["state"]) for job in found} == \
        {("tick.task", "ticks", "queued")}
    for tick in map(datetime.fromisoformat, ticks):
        assert tick.microsecond == 0 and tick.utcoffset() == timedelta(0)


async def test_a_worker_runs_what_its_schedule_enqueues(
    app: App, db: psycopg.Connection
) -> None:
    ran: list[str] = []

    @app.task("heartbeat.ping")
    async def ping(source: str) -> str:
        ran.append(source)
        return source

    ping.schedule(trigger=Every(1), args={"source": "schedule"})
    async with running(Worker(app, **FAST)):
        await wait_until(lambda: any(job["state"] == "succeeded" for job in jobs(db)),
                         timeout=10, what="a scheduled job to run")
    assert ran[0] == "schedule"
    assert jobs(db)[0]["meta"]["schedule"] == "heartbeat.ping"


async def test_a_worker_with_schedules_off_leaves_them_alone(
    app: App, db: psycopg.Connection
) -> None:
    app.add_schedule("off", "t", trigger=Every(1))
    async with running(Worker(app, schedules=False, **FAST)):
        started = time.monotonic()
        await wait_until(lambda: time.monotonic() - started > 1.2, what="a little while")
    assert schedule_row(db, "off") is None and jobs(db) == []


# --- akadze schedules ----------------------------------------------------------------------------

def run(*args: str) -> Result:
    return CliRunner().invoke(cli, list(args), env={"AKADZE_DATABASE_URL": None})


async def test_cli_lists_declared_schedules_with_last_and_next_run(
    db: psycopg.Connection, database_url: str
) -> None:
    listed = run("--database-url", database_url, "schedules", CLI_APP, "--json")
    assert listed.exit_code == 0, listed.output
    entries = json.loads(listed.stdout)
    assert [(e["name"], e["task"], e["trigger"], e["queue"], e["last_run"]) for e in entries] \
        == [("reports.hourly", "reports.build", "every 3600s", "reports", None),
            ("reports.nightly", "reports.build", "cron 0 3 * * * tz=Europe/Berlin", "night",
             None)]
    now = db_now(db)
    hourly_next = datetime.fromisoformat(entries[0]["next_run"])
    assert now < hourly_next <= now + HOUR and hourly_next.minute == hourly_next.second == 0
    nightly_next = datetime.fromisoformat(entries[1]["next_run"])
    assert nightly_next == Cron("0 3 * * *", timezone="Europe/Berlin").next(now)

    await check(cli_schedules_app, database_url)
    rewind(db, "reports.hourly", HOUR)
    await check(cli_schedules_app, database_url)
    tick = schedule_row(db, "reports.hourly")["last_tick"]  # type: ignore[index]
    entries = json.loads(run("--database-url", database_url, "schedules", CLI_APP,
                             "--json").stdout)
    assert datetime.fromisoformat(entries[0]["last_run"]) == tick
    assert entries[1]["last_run"] is None

    table = run("--database-url", database_url, "schedules", CLI_APP)
    assert table.exit_code == 0, table.output
    header, hourly, nightly = table.stdout.splitlines()
    assert header.split() == ["NAME", "TASK", "TRIGGER", "QUEUE", "LAST_RUN", "NEXT_RUN"]
    assert hourly.startswith("reports.hourly") and "every 3600s" in hourly
    assert tick.astimezone(timezone.utc).isoformat(sep=" ", timespec="seconds") in hourly
    assert nightly.startswith("reports.nightly") and " never " in nightly
    assert "tz=Europe/Berlin" in nightly and " night " in nightly


def test_cli_with_no_schedules_and_errors(database_url: str) -> None:
    empty = run("--database-url", database_url, "schedules", "tests.integration.cli_app:app")
    assert (empty.exit_code, empty.stdout) == (0, "no schedules\n")
    empty_json = run("--database-url", database_url, "schedules",
                     "tests.integration.cli_app:app", "--json")
    assert json.loads(empty_json.stdout) == []
    missing = run("--database-url", database_url, "schedules", "tests.integration.nope:app")
    assert missing.exit_code == 1
    assert missing.stderr.splitlines() == [
        "akadze: error: cannot import module 'tests.integration.nope': "
        "No module named 'tests.integration.nope'"]


async def test_run_schedules_alone_enqueues_without_a_worker(
    app: App, db: psycopg.Connection
) -> None:
    """The scheduler-only loop (a separate beat process) enqueues ticks and stops on request."""
    from akadze_core import run_schedules

    @app.task("sched.alone")
    def alone() -> None: ...

    app.add_schedule("alone", alone, trigger=Every(1))
    assert app.remove_schedule("missing") is False
    stop = asyncio.Event()
    runner = asyncio.create_task(run_schedules(app, stop))
    for _ in range(300):
        if db.execute("SELECT count(*) FROM akadze.jobs WHERE task = 'sched.alone'").fetchone()[0]:
            break
        await asyncio.sleep(0.02)
    stop.set()
    await asyncio.wait_for(runner, 5)
    count = db.execute("SELECT count(*) FROM akadze.jobs WHERE task = 'sched.alone'").fetchone()[0]
    assert count >= 1
    assert app.remove_schedule("alone") is True and "alone" not in app.schedules


# --- schedule sources --------------------------------------------------------------------------

class ListSource:
    """A ScheduleSource over a list; ``accept`` decides whether each run is kept."""

    check_interval = 1.0

    def __init__(self, schedules: list[Any], accept: bool = True) -> None:
        self.schedules = schedules
        self.accept = accept
        self.seen: list[tuple[str, datetime, int]] = []

    async def load(self, connection: psycopg.AsyncConnection) -> list[Any]:
        return self.schedules

    async def enqueued(self, connection: psycopg.AsyncConnection, schedule: Any,
                       tick: datetime, job_id: int) -> bool:
        # In the enqueue's transaction: the job is there, uncommitted.
        cursor = await connection.execute("SELECT count(*) FROM akadze.jobs WHERE id = %s",
                                          (job_id,))
        assert (await cursor.fetchone()) == (1,)
        assert connection.info.transaction_status == psycopg.pq.TransactionStatus.INTRANS
        self.seen.append((schedule.name, tick, job_id))
        return self.accept


async def test_a_source_schedule_with_since_runs_a_passed_tick_and_records_it(
        app: App, database_url: str, db: psycopg.Connection) -> None:
    # Hourly: a tick boundary crossed between the two checks would rightly run a new tick.
    since = db_now(db) - 2 * HOUR
    declared = app.add_schedule("source.hourly", "t", trigger=Every(HOUR))
    app.remove_schedule("source.hourly")
    source = ListSource([replace(declared, since=since)])
    app.schedule_sources.append(source)
    wait = await check(app, database_url)
    assert wait <= 1.0
    [(name, tick, job_id)] = source.seen
    assert name == "source.hourly" and tick > since
    assert [job["id"] for job in jobs(db)] == [job_id]
    await check(app, database_url)  # the same tick again: nothing
    assert len(jobs(db)) == 1 and len(source.seen) == 1


async def test_a_source_that_withdraws_a_run_leaves_no_job_and_the_tick_untaken(
        app: App, database_url: str, db: psycopg.Connection) -> None:
    declared = app.add_schedule("source.no", "t", trigger=Every(10))
    app.remove_schedule("source.no")
    source = ListSource([replace(declared, since=db_now(db) - HOUR)], accept=False)
    app.schedule_sources.append(source)
    await check(app, database_url)
    await check(app, database_url)
    assert jobs(db) == [] and len(source.seen) == 2  # asked again: the tick is still open
    row = schedule_row(db, "source.no")
    assert row is not None and row["last_run"] is None
    source.accept = True
    await check(app, database_url)
    assert len(jobs(db)) == 1
