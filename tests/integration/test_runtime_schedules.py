"""Runtime schedules on real Postgres: stored, changed, paused, resumed and removed while
workers run, each tick enqueued once across workers, joining the caller's transaction,
refusing bad input, and the ``akadze schedules`` subcommands.

What happened is read from the database. A change is "taken in" when a job reflects it;
the tests wait generously for that, and check the guarantees that hold at once: after a
pause, change or removal commits, no job of the old definition is inserted any more (the
tick statement re-reads the row's version and paused flag under its lock).
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator
from datetime import datetime, timedelta
from typing import Any

import psycopg
import pytest
from click.testing import CliRunner, Result

from akadze_core import App, Cron, Every, InvalidArgs, Scheduler, Worker
from akadze_core.cli.main import cli
from akadze_core.schedules import scheduler as schedules
from akadze_core.store import ticks
from tests.integration.outcome_helpers import FAST, running, wait_until
from tests.integration.schedule_helpers import check, db_now, jobs, rewind, schedule_row

HOUR = timedelta(hours=1)


# --- helpers -------------------------------------------------------------------------------------

@pytest.fixture
def notify_only(monkeypatch: pytest.MonkeyPatch) -> None:
    """No poll fallback during the test: a worker can learn of a change only by NOTIFY."""
    monkeypatch.setattr(schedules, "RUNTIME_POLL_INTERVAL", 3600.0)


@pytest.fixture
async def apps(database_url: str) -> AsyncIterator[list[App]]:
    made: list[App] = []
    yield made
    for app in made:
        await app.close_async()


# --- what one pass does --------------------------------------------------------------------------

async def test_a_due_tick_enqueues_one_job_with_the_stored_fields(
    app: App, db: psycopg.Connection, database_url: str
) -> None:
    app.task("report.build", queue="reports", priority=2, max_attempts=4)(lambda kind: kind)
    stored = app.runtime_schedules.add(
        "reports.hourly", "report.build", trigger=Every(HOUR), args={"kind": "daily"},
        priority=5, expires=timedelta(minutes=30), meta={"owner": "ops"})
    # The defaults were resolved from the task when stored.
    assert (stored.queue, stored.priority, stored.max_attempts) == ("reports", 5, 4)
    assert (stored.trigger, stored.paused, stored.last_run) == ("every 3600s", False, None)
    await check(app, database_url)
    assert jobs(db) == []  # a new schedule first runs at its next tick

    rewind(db, "reports.hourly", HOUR)
    with psycopg.connect(database_url, autocommit=True) as listener:
        listener.execute("LISTEN akadze_jobs")
        await check(app, database_url)
        heard = [notify.payload for notify in listener.notifies(timeout=2, stop_after=1)]
    assert heard == ["reports"]
    [job] = jobs(db)
    tick = Every(HOUR).latest(db_now(db))
    assert (job["task"], job["queue"], job["args"], job["priority"], job["max_attempts"]) == \
        ("report.build", "reports", {"kind": "daily"}, 5, 4)
    assert job["expires_at"] == tick + timedelta(minutes=30)
    assert datetime.fromisoformat(job["meta"].pop("tick")) == tick
    assert job["meta"] == {"owner": "ops", "schedule": "reports.hourly"}
    assert app.runtime_schedules.get("reports.hourly").last_run == tick  # type: ignore[union-attr]

    await check(app, database_url)
    assert len(jobs(db)) == 1


async def test_after_downtime_only_the_latest_missed_tick_runs(
    app: App, db: psycopg.Connection, database_url: str
) -> None:
    app.runtime_schedules.add("minutely", "t", trigger=Cron("* * * * *"))
    rewind(db, "minutely", timedelta(days=3))
    scheduler = Scheduler(app)
    await check(app, database_url, scheduler)
    await check(app, database_url, scheduler)
    [job] = jobs(db)
    assert datetime.fromisoformat(job["meta"]["tick"]) == Cron("* * * * *").latest(db_now(db)) \
        or db_now(db).second < 2  # the minute may just have turned


async def test_a_boundary_pass_leaves_evaluating_the_tick_after_to_a_later_pass(
    app: App, db: psycopg.Connection, monkeypatch: pytest.MonkeyPatch
) -> None:
    trigger = Cron("*/2 * * * *", timezone="Europe/Berlin")
    for number in range(3):
        app.runtime_schedules.add(f"berlin{number}", "t", trigger=trigger)
    scheduler = Scheduler(app)
    async with await app.connections.connect_async(autocommit=True) as connection:
        now = await ticks.schedule_clock(connection)
        await scheduler._runtime_due(connection, now)  # loads the timetable
        boundary = trigger.next(now)
        wait = await scheduler._runtime_due(connection, boundary + timedelta(milliseconds=50))
        assert len(jobs(db)) == 3 and scheduler.timetable.unprepared
        assert wait <= schedules.RUNTIME_PREPARE_DELAY
        await scheduler._runtime_due(connection, boundary + timedelta(seconds=1))
        assert scheduler.timetable.unprepared  # still in the boundary's seconds
        monkeypatch.setattr(scheduler, "_prepare_after", 0.0)
        await scheduler._runtime_due(connection, boundary + timedelta(seconds=3))
        assert not scheduler.timetable.unprepared
        following = boundary + timedelta(minutes=2)
        assert scheduler.timetable.next_fire() == following
        await scheduler._runtime_due(connection, following + timedelta(milliseconds=50))
    ticked = sorted(datetime.fromisoformat(job["meta"]["tick"]) for job in jobs(db))
    assert ticked == [boundary] * 3 + [following] * 3


async def test_a_scheduler_that_missed_the_notification_finds_the_change_by_polling(
    app: App, db: psycopg.Connection, database_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(schedules, "RUNTIME_POLL_INTERVAL", 0.0)
    scheduler = Scheduler(app)  # never told of any change (no listener): only its poll sees
    await check(app, database_url, scheduler)
    assert len(scheduler.timetable) == 0
    app.runtime_schedules.add("polled", "t", trigger=Every(HOUR))
    await check(app, database_url, scheduler)
    assert scheduler.timetable.versions() == {
        "polled": app.runtime_schedules.get("polled").version}  # type: ignore[union-attr]
    app.runtime_schedules.remove("polled")
    await check(app, database_url, scheduler)
    assert len(scheduler.timetable) == 0


# --- with running workers ------------------------------------------------------------------------

@pytest.mark.usefixtures("notify_only")
async def test_running_workers_take_in_add_change_pause_resume_and_remove(
    app: App, db: psycopg.Connection
) -> None:
    schedules_ = app.runtime_schedules
    async with running(Worker(app, queues=["elsewhere"], **FAST)):
        await asyncio.sleep(0.3)  # started, first pass done: from now on only NOTIFY helps
        schedules_.add("live", "live.task", trigger=Every(1), args={"v": 1}, queue="live")
        await wait_until(lambda: len(jobs(db, "live")) >= 2, timeout=10,
                         what="the added schedule's ticks")

        changed = schedules_.add("live", "live.task", trigger=Every(1), args={"v": 2},
                                 queue="live", replace=True)
        await wait_until(lambda: any(job["args"] == {"v": 2} for job in jobs(db, "live")),
                         timeout=10, what="the changed args")
        assert all(job["args"] == {"v": 2} for job in jobs(db, "live")
                   if job["created_at"] > changed.changed_at)

        assert schedules_.pause("live")
        paused_at = schedules_.get("live").changed_at  # type: ignore[union-attr]
        count = len(jobs(db, "live"))
        await asyncio.sleep(2.5)
        assert len(jobs(db, "live")) == count
        assert not [job for job in jobs(db, "live") if job["created_at"] > paused_at]

        assert schedules_.resume("live")
        resumed_at = schedules_.get("live").changed_at  # type: ignore[union-attr]
        await wait_until(lambda: len(jobs(db, "live")) > count, timeout=10,
                         what="ticks after resume")
        # The ticks missed while paused did not run.
        later = [datetime.fromisoformat(job["meta"]["tick"]) for job in jobs(db, "live")[count:]]
        assert min(later) > resumed_at - timedelta(seconds=1)

        assert schedules_.remove("live")
        removed_at = db_now(db)
        await asyncio.sleep(2.0)
        assert not [job for job in jobs(db, "live") if job["created_at"] > removed_at]
        assert schedule_row(db, "live") is None


async def test_several_workers_enqueue_each_runtime_tick_once(
    apps: list[App], db: psycopg.Connection, database_url: str
) -> None:
    """Four workers' worth (separate apps and pools), 30 one-second schedules."""
    adder = App(database_url)
    apps.append(adder)
    for number in range(30):
        adder.runtime_schedules.add(f"race-{number}", "race.task", trigger=Every(1),
                                    queue="ticks")
    workers = []
    for number in range(4):
        app = App(database_url)
        apps.append(app)
        workers.append(Worker(app, name=f"scheduler-{number}", **FAST))

    def ticks_of_the_slowest() -> int:
        row = db.execute("SELECT min(n) FROM (SELECT count(DISTINCT meta->>'tick') AS n FROM "
                         "akadze.jobs GROUP BY meta->>'schedule') AS t").fetchone()
        return int(row[0]) if row and row[0] is not None else 0

    async with running(workers[0]), running(workers[1]), running(workers[2]), \
            running(workers[3]):
        await wait_until(lambda: ticks_of_the_slowest() >= 4, timeout=20,
                         what="four ticks of every schedule")
    found = [(job["meta"]["schedule"], job["meta"]["tick"]) for job in jobs(db)]
    assert len(found) == len(set(found))
    assert {name for name, _ in found} == {f"race-{number}" for number in range(30)}


async def test_concurrent_batches_for_the_same_ticks_insert_each_job_once(
    app: App, db: psycopg.Connection, database_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Three statements a pass, so the workers' overlapping batches meet mid-pass.
    monkeypatch.setattr(schedules, "RUNTIME_BATCH", 70)
    for number in range(200):
        app.runtime_schedules.add(f"batch-{number:03}", "t", trigger=Every(HOUR))
    connections = [await psycopg.AsyncConnection.connect(database_url, autocommit=True)
                   for _ in range(8)]
    try:
        for round_number in range(1, 4):
            db.execute("UPDATE akadze.schedules SET last_tick = last_tick - interval '1 hour'")
            await asyncio.gather(*(Scheduler(app).enqueue_due(connection)
                                   for connection in connections))
            assert len(jobs(db)) == 200 * round_number
    finally:
        for connection in connections:
            await connection.close()
    per_schedule = db.execute("SELECT count(DISTINCT meta->>'schedule') FROM akadze.jobs")
    assert per_schedule.fetchone() == (200,)


# --- the caller's transaction --------------------------------------------------------------------

@pytest.mark.usefixtures("notify_only")
async def test_session_joins_the_callers_transaction(
    app: App, db: psycopg.Connection, database_url: str
) -> None:
    with psycopg.connect(database_url) as connection:
        app.runtime_schedules.add("tx", "t", trigger=Every(1), session=connection)
        assert app.runtime_schedules.get("tx", session=connection) is not None
        connection.rollback()
    assert app.runtime_schedules.get("tx") is None

    async with await psycopg.AsyncConnection.connect(database_url) as connection:
        await app.runtime_schedules.add_async("tx", "t", trigger=Every(1), session=connection)
        await connection.rollback()
        await app.runtime_schedules.add_async("kept", "t", trigger=Every(1), session=connection)
        await app.runtime_schedules.pause_async("kept", session=connection)
        await connection.commit()
    assert [entry.name for entry in await app.runtime_schedules.list_async()] == ["kept"]
    assert (await app.runtime_schedules.get_async("kept")).paused  # type: ignore[union-attr]

    with psycopg.connect(database_url) as connection:
        assert app.runtime_schedules.resume("kept", session=connection)
        connection.rollback()
    assert app.runtime_schedules.get("kept").paused  # type: ignore[union-attr]

    with pytest.raises(TypeError, match="_async"):
        async with await psycopg.AsyncConnection.connect(database_url) as connection:
            app.runtime_schedules.add("x", "t", trigger=Every(1),
                                      session=connection)  # type: ignore[arg-type]


async def test_a_rolled_back_add_notifies_no_one(app: App, database_url: str) -> None:
    with psycopg.connect(database_url, autocommit=True) as listener:
        listener.execute("LISTEN akadze_schedules")
        with psycopg.connect(database_url) as connection:
            app.runtime_schedules.add("ghost", "t", trigger=Every(1), session=connection)
            connection.rollback()
        assert list(listener.notifies(timeout=0.5, stop_after=1)) == []
        app.runtime_schedules.add("seen", "t", trigger=Every(1))
        assert [n.payload for n in listener.notifies(timeout=2, stop_after=1)] == ["seen"]


# --- refusals ------------------------------------------------------------------------------------

async def test_bad_input_raises_a_clear_error_and_stores_nothing(app: App) -> None:
    @app.task("typed.task")
    def typed(count: int) -> int:
        return count

    class Custom:
        spec = "custom"

        def latest(self, at: datetime) -> datetime | None: ...

        def next(self, after: datetime) -> datetime: ...

    add = app.runtime_schedules.add
    refusals: list[tuple[type[Exception], str, dict[str, Any]]] = [
        (ValueError, "invalid cron expression", {"trigger": "61 * * * *"}),
        (ValueError, "unknown time zone", {"trigger": "cron * * * * * tz=Mars/Base"}),
        (ValueError, "interval must be positive", {"trigger": "every 0s"}),
        (ValueError, "must be a Cron or an Every", {"trigger": Custom()}),
        (InvalidArgs, "JSON", {"trigger": Every(1), "args": {"when": object()}}),
        (ValueError, "args must be a mapping", {"trigger": Every(1), "args": [1]}),
        (ValueError, "max_attempts", {"trigger": Every(1), "max_attempts": 0}),
        (ValueError, "priority must be an int", {"trigger": Every(1), "priority": "high"}),
        (ValueError, "expires must be positive", {"trigger": Every(1), "expires": -5}),
    ]
    for error, message, kwargs in refusals:
        with pytest.raises(error, match=message):
            add("bad", "t", **kwargs)
    with pytest.raises(TypeError):
        add("bad", typed, trigger=Every(1), args={"counts": 1})
    with pytest.raises(ValueError, match="schedule name"):
        add("", "t", trigger=Every(1))
    app.add_schedule("in.code", "t", trigger=Every(1))
    with pytest.raises(ValueError, match="declared in code by this app"):
        add("in.code", "t", trigger=Every(1))
    assert app.runtime_schedules.list() == []

    add("once", "t", trigger=Every(1))
    with pytest.raises(ValueError, match="exists already"):
        add("once", "t", trigger=Every(2))
    assert app.runtime_schedules.get("once").trigger == "every 1s"  # type: ignore[union-attr]
    assert not app.runtime_schedules.pause("nothing")
    assert not app.runtime_schedules.remove("nothing")


async def test_a_code_schedules_name_is_taken_over_only_when_asked(
    apps: list[App], db: psycopg.Connection, database_url: str,
    caplog: pytest.LogCaptureFixture
) -> None:
    deploy = App(database_url)
    apps.append(deploy)
    deploy.add_schedule("shared", "code.task", trigger=Every(HOUR))
    await check(deploy, database_url)  # its state row now exists
    operator = App(database_url)
    apps.append(operator)
    with pytest.raises(ValueError, match="code schedule's"):
        operator.runtime_schedules.add("shared", "runtime.task", trigger=Every(HOUR))
    operator.runtime_schedules.add("shared", "runtime.task", trigger=Every(HOUR), replace=True)

    caplog.set_level(logging.WARNING, logger="akadze.schedules")
    rewind(db, "shared", HOUR)
    scheduler = Scheduler(deploy)
    await check(deploy, database_url, scheduler)
    await check(deploy, database_url, scheduler)
    assert [job["task"] for job in jobs(db)] == ["runtime.task"]
    warnings = [r.getMessage() for r in caplog.records if "declared in code" in r.getMessage()]
    assert len(warnings) == 1 and "'shared'" in warnings[0]


# --- akadze schedules ----------------------------------------------------------------------------

def run(database_url: str, *args: str) -> Result:
    return CliRunner().invoke(cli, ["--database-url", database_url, *args],
                              env={"AKADZE_DATABASE_URL": None})


def test_cli_adds_pauses_resumes_and_removes(database_url: str, db: psycopg.Connection) -> None:
    added = run(database_url, "schedules", "add", "nightly", "--task", "reports.build",
                "--cron", "0 3 * * *", "--tz", "Europe/Berlin", "--args", '{"kind": "d"}',
                "--queue", "night", "--priority", "2", "--max-attempts", "5",
                "--expires", "3600", "--meta", '{"by": "ops"}')
    assert added.exit_code == 0, added.output
    assert added.stdout.startswith("schedule nightly added: reports.build at cron 0 3 * * * "
                                   "tz=Europe/Berlin, queue night (next run ")
    row = schedule_row(db, "nightly")
    assert row is not None
    assert (row["source"], row["task"], row["args"], row["queue"], row["priority"],
            row["max_attempts"], row["expires"], row["meta"], row["paused"]) == \
        ("runtime", "reports.build", {"kind": "d"}, "night", 2, 5, timedelta(hours=1),
         {"by": "ops"}, False)
    every = run(database_url, "schedules", "add", "poll", "--task", "poll.run", "--every", "60")
    assert every.exit_code == 0, every.output

    assert run(database_url, "schedules", "pause", "poll").stdout == "schedule poll paused\n"
    entries = json.loads(run(database_url, "schedules", "--json").stdout)
    assert [(e["name"], e["trigger"], e["queue"], e["source"], e["paused"], e["next_run"])
            for e in entries] == [
        ("nightly", "cron 0 3 * * * tz=Europe/Berlin", "night", "runtime", False,
         Cron("0 3 * * *", timezone="Europe/Berlin").next(db_now(db)).isoformat()),
        ("poll", "every 60s", "default", "runtime", True, None)]
    table = run(database_url, "schedules").stdout.splitlines()
    assert table[0].split() == ["NAME", "TASK", "TRIGGER", "QUEUE", "LAST_RUN", "NEXT_RUN"]
    assert table[2].startswith("poll") and table[2].endswith("never     paused")
    # With an app, its code schedules and the runtime ones together, by name.
    both = json.loads(run(database_url, "schedules", "tests.integration.schedules_app:app",
                          "--json").stdout)
    assert [(e["name"], e["source"]) for e in both] == [
        ("nightly", "runtime"), ("poll", "runtime"), ("reports.hourly", "code"),
        ("reports.nightly", "code")]
    assert run(database_url, "schedules", "list", "--json").stdout == \
        run(database_url, "schedules", "--json").stdout

    assert run(database_url, "schedules", "resume", "poll").stdout == "schedule poll resumed\n"
    assert schedule_row(db, "poll")["paused"] is False  # type: ignore[index]
    assert run(database_url, "schedules", "remove", "poll").stdout == "schedule poll removed\n"
    assert schedule_row(db, "poll") is None
    replaced = run(database_url, "schedules", "add", "nightly", "--task", "reports.build",
                   "--every", "300", "--replace")
    assert replaced.exit_code == 0, replaced.output
    assert schedule_row(db, "nightly")["spec"] == "every 300s"  # type: ignore[index]


@pytest.mark.parametrize(("args", "line"), [
    (("add", "x", "--task", "t"), "give exactly one of --cron and --every"),
    (("add", "x", "--task", "t", "--cron", "* * * * *", "--every", "5"),
     "give exactly one of --cron and --every"),
    (("add", "x", "--task", "t", "--every", "5", "--args", "[1]"),
     "--args must be a JSON object"),
    (("add", "x", "--task", "t", "--every", "5", "--args", "{oops"), "--args is not JSON"),
    (("add", "x", "--task", "t", "--cron", "* * * * *", "--tz", "Mars/Base"),
     "unknown time zone 'Mars/Base'"),
    (("add", "x", "--task", "t", "--cron", "99 * * * *"), "invalid cron expression"),
    (("pause", "missing"), "no runtime schedule named 'missing'"),
    (("resume", "missing"), "no runtime schedule named 'missing'"),
    (("remove", "missing"), "no runtime schedule named 'missing'"),
])
def test_cli_refusals_are_one_line_and_store_nothing(
    database_url: str, db: psycopg.Connection, args: tuple[str, ...], line: str
) -> None:
    result = run(database_url, "schedules", *args)
    assert result.exit_code != 0
    [error] = result.stderr.splitlines()
    assert error.startswith("akadze: error: ") and line in error, error
    assert db.execute("SELECT count(*) FROM akadze.schedules").fetchone() == (0,)


async def test_cli_says_a_code_schedule_is_changed_in_the_code(
    database_url: str, app: App
) -> None:
    app.add_schedule("from.code", "t", trigger=Every(HOUR))
    await check(app, database_url)
    result = run(database_url, "schedules", "pause", "from.code")
    assert result.exit_code == 1
    assert result.stderr.splitlines() == [
        "akadze: error: schedule 'from.code' is declared in code, not a runtime schedule: "
        "change it in the code"]


async def test_without_an_app_the_code_schedules_are_named_with_where_to_list_them(
        database_url: str, db: psycopg.Connection) -> None:
    deploy = App(database_url)
    try:
        deploy.add_schedule("beat.cleanup", "tasks.cleanup", trigger=Every(HOUR))
        deploy.add_schedule("beat.nightly", "tasks.report", trigger=Cron("0 3 * * *"))
        await check(deploy, database_url)  # a worker's pass records them in the database
    finally:
        await deploy.close_async()
    hint = ("not listed: beat.cleanup (last run never), beat.nightly (last run never). "
            "Declared in an app's code (add_schedule, declare_schedule, or a Celery app's "
            "beat_schedule and add_periodic_task), they are listed with their app: "
            "`akadze schedules MODULE:APP`, or for a Celery app "
            "`akadze-compat -A proj schedules`.\n")
    listed = run(database_url, "schedules")
    assert (listed.exit_code, listed.stdout, listed.stderr) == (0, "no runtime schedules\n", hint)
    as_json = run(database_url, "schedules", "--json")
    assert (as_json.stdout, as_json.stderr) == ("[]\n", hint)  # stdout stays JSON
    run(database_url, "schedules", "add", "poll", "--task", "poll.run", "--every", "60")
    listed = run(database_url, "schedules")
    assert listed.stdout.splitlines()[1].startswith("poll ") and listed.stderr == hint
    # Named, the app's own are listed, and nothing is said.
    named = run(database_url, "schedules", "tests.integration.schedules_app:app")
    assert named.exit_code == 0 and named.stderr == ""
    # Nothing from code: nothing to say.
    db.execute("DELETE FROM akadze.schedules")
    empty = run(database_url, "schedules")
    assert (empty.stdout, empty.stderr) == ("no schedules\n", "")
