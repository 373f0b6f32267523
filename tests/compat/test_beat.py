"""Celery beat on akadze: beat_schedule and add_periodic_task become core schedules that
every worker enqueues once per tick, run through the same entry as ``delay()``."""

from __future__ import annotations

import asyncio
import itertools
import logging
import types
from collections.abc import AsyncIterator, Iterator
from datetime import datetime, timedelta, timezone
from typing import Any

import psycopg
import pytest
from kombu import Queue

import akadze_core
from akadze_compat import Celery, Task, signature, states
from akadze_compat._triggers import CrontabTrigger, DueTrigger
from akadze_compat.beat import (
    UnsupportedSchedule,
    entry_to_schedule,
    schedule_timezone,
    to_trigger,
)
from akadze_compat.exceptions import ImproperlyConfigured
from akadze_compat.schedules import BaseSchedule, crontab, schedstate, schedule
from akadze_core import Cron, Worker
from tests.compat.signal_recorder import Recorder
from tests.helpers import is_uuid4, run_worker_until

UTC = timezone.utc
#: Declaring schedules never connects: these apps point nowhere on purpose.
NOWHERE = "postgresql://nobody@127.0.0.1:1/nowhere"


@pytest.fixture
def apps() -> Iterator[list[Celery]]:
    """Apps made by a test, closed after it."""
    made: list[Celery] = []
    yield made
    for app in made:
        app.close()


def make(apps: list[Celery], broker: str = NOWHERE, **config: Any) -> Celery:
    app = Celery("proj", broker=broker, set_as_current=False, **config)
    apps.append(app)
    return app


def jobs_of(db: psycopg.Connection, name: str) -> list[tuple[str, str, str]]:
    """(task id, state, tick) of the jobs a schedule enqueued."""
    return db.execute("SELECT meta->>'task_id', state, meta->>'tick' FROM akadze.jobs "
                      "WHERE meta->>'schedule' = %s ORDER BY id", (name,)).fetchall()


# --- beat_schedule in every spelling ------------------------------------------------------------


def test_beat_schedule_setting_becomes_core_schedules(apps: list[Celery]) -> None:
    app = make(apps, task_routes={"proj.report": {"queue": "reports"}}, beat_schedule={
        "morning": {"task": "proj.report", "schedule": crontab(hour=7, minute=30),
                    "args": (1,), "kwargs": {"kind": "daily"},
                    "options": {"priority": 3, "expires": 600}},
        "tick": {"task": "proj.ping", "schedule": 30.0},
    })

    @app.task(name="proj.report", max_retries=5)
    def report(n: int, kind: str) -> None: ...

    @app.task(name="proj.ping", queue="pings", max_retries=None)
    def ping() -> None: ...

    core = app.prepare_worker()
    morning, tick = core.schedules["morning"], core.schedules["tick"]
    assert morning.trigger.spec == "celery-crontab 30 7 * * * tz=UTC"
    assert (morning.task, morning.queue, morning.priority, morning.max_attempts,
            morning.expires) == ("proj.report", "reports", 3, 6, timedelta(seconds=600))
    assert morning.args == {"args": [1], "kwargs": {"kind": "daily"}}
    celery_meta = morning.meta["celery"]
    assert celery_meta["headers"] == {"celery_beat_task": True}
    assert celery_meta["priority"] == 3
    assert "root_id" not in celery_meta and "eta" not in celery_meta  # only what was given
    # The task's own queue beats the routes, as with apply_async; None retries forever.
    assert (tick.trigger.spec, tick.queue, tick.max_attempts) == ("every 30s", "pings",
                                                                 2**31 - 1)


def test_celery_namespace_and_django_time_zone(apps: list[Celery]) -> None:
    settings = types.SimpleNamespace(
        TIME_ZONE="America/New_York", CELERY_TASK_DEFAULT_QUEUE="work",
        CELERY_BEAT_SCHEDULE={"weekly": {
            "task": "proj.weekly", "schedule": crontab(hour=7, minute=30, day_of_week="mon")}})
    app = make(apps)
    app.config_from_object(settings, namespace="CELERY")

    @app.task(name="proj.weekly")
    def weekly() -> None: ...

    trigger = app.prepare_worker().schedules["weekly"].trigger
    assert trigger.spec == "celery-crontab 30 7 * * 1 tz=America/New_York"
    # Monday 1 July 2024, 07:30 in New York (EDT, UTC-4).
    assert trigger.next(datetime(2024, 7, 1, tzinfo=UTC)) == datetime(2024, 7, 1, 11, 30,
                                                                      tzinfo=UTC)
    # In January (EST, UTC-5) the same wall time is an hour later in UTC.
    assert trigger.next(datetime(2024, 1, 1, tzinfo=UTC)) == datetime(2024, 1, 1, 12, 30,
                                                                      tzinfo=UTC)
    assert app.core.schedules["weekly"].queue == "work"


def test_old_celerybeat_schedule_name_and_timezone_setting(apps: list[Celery]) -> None:
    old_config = types.ModuleType("old_celeryconfig")
    old_config.CELERYBEAT_SCHEDULE = {  # type: ignore[attr-defined]
        "nightly": {"task": "proj.nightly", "schedule": crontab.from_string("0 3 * * *")}}
    old_config.CELERY_TIMEZONE = "Europe/Berlin"  # type: ignore[attr-defined]
    app = make(apps)
    app.config_from_object(old_config)

    @app.task(name="proj.nightly")
    def nightly() -> None: ...

    trigger = app.prepare_worker().schedules["nightly"].trigger
    assert trigger.spec == "celery-crontab 0 3 * * * tz=Europe/Berlin"
    assert trigger.next(datetime(2024, 7, 1, tzinfo=UTC)) == datetime(2024, 7, 1, 1,
                                                                      tzinfo=UTC)


def test_preparing_again_is_idempotent_and_follows_the_setting(
        apps: list[Celery], caplog: pytest.LogCaptureFixture) -> None:
    app = make(apps, beat_schedule={
        "a": {"task": "proj.t", "schedule": 60, "options": {"countdown": 5, "eta": "x"}},
        "b": {"task": "proj.t", "schedule": 120}})

    @app.task(name="proj.t")
    def t() -> None: ...

    with caplog.at_level(logging.WARNING, logger="akadze_compat.beat"):
        core = app.prepare_worker()
        first = core.schedules["a"]
        app.prepare_worker()
    warnings = [r.getMessage() for r in caplog.records]
    assert warnings == ["periodic task 'a': the options countdown, eta do not apply to "
                        "periodic runs and are ignored"]
    assert core.schedules["a"] is first
    app.conf.beat_schedule = {"a": {"task": "proj.t", "schedule": 30}}
    app.prepare_worker()
    assert sorted(core.schedules) == ["a"]
    assert core.schedules["a"].trigger.spec == "every 30s"


def test_entries_that_cannot_run_stop_the_worker_naming_them(apps: list[Celery]) -> None:
    app = make(apps, beat_schedule={"never": {"task": "proj.t", "schedule": BaseSchedule()}})

    @app.task(name="proj.t")
    def t(x: int) -> None: ...

    with pytest.raises(UnsupportedSchedule, match=r"'never'.*no is_due") as caught:
        app.prepare_worker()
    assert isinstance(caught.value, NotImplementedError)
    assert isinstance(caught.value, ImproperlyConfigured)  # the CLI prints it as one line
    app.conf.beat_schedule = {"bad-args": {"task": "proj.t", "schedule": 5, "args": (1, 2)}}
    with pytest.raises(ImproperlyConfigured, match=r"'bad-args'.*argument"):
        app.prepare_worker()
    app.conf.beat_schedule = {"not-json": {"task": "proj.t", "schedule": 5,
                                           "args": (object(),)}}
    with pytest.raises(ImproperlyConfigured, match="'not-json'"):
        app.prepare_worker()
    app.conf.beat_schedule = {"pickle": {"task": "proj.t", "schedule": 5, "args": (1,),
                                         "options": {"serializer": "pickle"}}}
    with pytest.raises(ImproperlyConfigured, match=r"'pickle'.*serializer"):
        app.prepare_worker()


# --- add_periodic_task and signatures ----------------------------------------------------------


def test_add_periodic_task_on_after_configure_and_on_after_finalize(
        apps: list[Celery], caplog: pytest.LogCaptureFixture) -> None:
    app = make(apps)

    @app.on_after_configure.connect
    def setup(sender: Celery, **kwargs: Any) -> None:
        sender.add_periodic_task(10.0, hello.s("hello"), name="add every 10")
        sender.add_periodic_task(30.0, hello.s("world"), expires=10)
        sender.add_periodic_task(crontab(hour=7, minute=30, day_of_week=1),
                                 hello.s("Happy Mondays!"))

    @app.on_after_finalize.connect
    def later(sender: Celery, **kwargs: Any) -> None:
        sender.add_periodic_task(timedelta(minutes=1), hello, args=("bare task",),
                                 name="from finalize")
        # Unnamed again: it replaces the entry of the same signature, with a warning.
        sender.add_periodic_task(crontab(hour=8, minute=0, day_of_week=1),
                                 hello.s("Happy Mondays!"))

    @app.task(name="proj.hello")
    def hello(arg: str) -> str:
        return arg

    # Before the configuration is loaded: kept until then, as Celery does.
    key = app.add_periodic_task(60, signature("proj.hello", ("early",)), name="early")
    assert key == "early" and not app.configured
    with caplog.at_level(logging.WARNING, logger="akadze_compat.beat"):
        core = app.prepare_worker()
    assert set(app.conf.beat_schedule) == {
        "early", "add every 10", "proj.hello('world')", "proj.hello('Happy Mondays!')",
        "from finalize"}
    assert set(core.schedules) == set(app.conf.beat_schedule)
    assert "shadowed a previous unnamed periodic task" in caplog.text
    assert core.schedules["add every 10"].args == {"args": ["hello"], "kwargs": {}}
    assert core.schedules["proj.hello('world')"].expires == timedelta(seconds=10)
    assert core.schedules["proj.hello('Happy Mondays!')"].trigger.spec == \
        "celery-crontab 0 8 * * 1 tz=UTC"
    assert core.schedules["from finalize"].args == {"args": ["bare task"], "kwargs": {}}


def test_signatures_are_dicts_like_celerys(apps: list[Celery]) -> None:
    app = make(apps)

    @app.task(name="proj.add")
    def add(x: int, y: int = 0) -> int:
        return x + y

    sig = add.s(2, y=3)
    assert dict(sig) == {"task": "proj.add", "args": (2,), "kwargs": {"y": 3}, "options": {},
                         "subtask_type": None, "immutable": False}
    assert (sig.task, sig.name, sig.args, sig.kwargs, repr(sig)) == (
        "proj.add", "proj.add", (2,), {"y": 3}, "proj.add(2, y=3)")
    assert sig() == 5 and sig.type is add
    partial = add.s(y=1).clone((4,), queue="q")
    assert (partial.args, partial.kwargs, partial.options) == ((4,), {"y": 1}, {"queue": "q"})
    frozen = add.si(1, 1)
    assert frozen.immutable and frozen.clone((9,)).args == (1, 1)
    assert add.signature((1,), {"y": 2}, countdown=5).options == {"countdown": 5}
    assert signature({"task": "proj.add", "args": [1]}, app=app)() == 1
    assert signature(sig) == sig and signature(sig) is not sig
    from akadze_compat import chain, group

    # Canvases compose (tests/compat/test_canvas.py runs them).
    assert isinstance(add.s(1) | add.s(2), chain.__mro__[1])
    assert len(group(add.s(1), add.s(2))) == 2
    assert chain(add.s(1), add.s(2)).tasks == [add.s(1), add.s(2)]


# --- running through a real worker --------------------------------------------------------------


@pytest.fixture
async def live(database_url: str) -> AsyncIterator[list[Celery]]:
    made: list[Celery] = []
    yield made
    for app in made:
        if app._core is not None:
            await app._core.close_async()
        app.close()


async def test_link_signatures_are_stored_with_the_job(
        live: list[Celery], database_url: str, db: psycopg.Connection) -> None:
    app = make(live, database_url)

    @app.task(name="proj.add")
    def add(x: int, y: int = 0) -> int:
        return x + y

    result = add.s(1).apply_async(link=add.s(10), link_error=[add.si(0)], countdown=60)
    meta, dependents = db.execute(
        "SELECT meta->'celery', dependents FROM akadze.jobs WHERE id = %s",
        (result.job_id,)).fetchone()
    # The callback is a job of its own, waiting for this one (request.callbacks keeps it).
    assert db.execute("SELECT state, task FROM akadze.jobs WHERE id = ANY(%s)",
                      (dependents,)).fetchall() == [("waiting", "proj.add")]
    assert meta["link"] == [{"task": "proj.add", "args": [10], "kwargs": {}, "options": {},
                             "subtask_type": None, "immutable": False}]
    assert meta["link_error"][0]["immutable"] is True
    assert signature(meta["link"][0], app=app)(5) == 15  # partial args go first


async def test_a_periodic_run_goes_through_the_celery_entry(
        live: list[Celery], database_url: str, db: psycopg.Connection) -> None:
    seen: list[dict[str, Any]] = []
    app = make(live, database_url, beat_schedule={
        "every second": {"task": "proj.beat", "schedule": schedule(1.0), "args": (2,),
                         "kwargs": {"y": 3}, "options": {"expires": 30}},
        "past deadline": {"task": "proj.beat", "schedule": 1.0, "args": (0,),
                          "options": {"expires": datetime(2000, 1, 1, tzinfo=UTC)}},
    })

    @app.task(bind=True, name="proj.beat")
    def add(self: Task, x: int, y: int = 0) -> int:
        if not x:
            raise AssertionError("an expired run must not start")
        seen.append({"id": self.request.id, "headers": self.request.headers,
                     "queue": self.request.delivery_info,
                     "expires": self.request.expires, "retries": self.request.retries})
        return x + y

    recorder = Recorder("task_prerun", "task_success", "task_postrun")

    def done() -> bool:
        runs = [jobs_of(db, name) for name in ("every second", "past deadline")]
        return all(jobs and jobs[0][1] in ("succeeded", "cancelled") for jobs in runs)

    worker = Worker(app.prepare_worker(), queues=["celery"], slots=2, poll_interval=0.05)
    try:
        assert await run_worker_until(worker, done, 15) == 0
    finally:
        recorder.close()
    task_id, state, tick = jobs_of(db, "every second")[0]
    assert is_uuid4(task_id) and seen[0]["id"] == task_id  # each run its own uuid4 id
    result = app.AsyncResult(task_id)
    assert (state, result.state, result.result) == ("succeeded", states.SUCCESS, 5)
    assert (result.name, result.args, result.kwargs) == ("proj.beat", [2], {"y": 3})
    assert seen[0]["headers"] == {"celery_beat_task": True} and seen[0]["retries"] == 0
    assert seen[0]["queue"]["queue"] == "celery"
    assert datetime.fromisoformat(seen[0]["expires"]) == \
        datetime.fromisoformat(tick) + timedelta(seconds=30)
    assert recorder.names()[:3] == ["task_prerun", "task_success", "task_postrun"]
    assert recorder.calls[1][1]["result"] == 5
    expired = app.AsyncResult(jobs_of(db, "past deadline")[0][0])
    assert expired.state == states.REVOKED


async def test_several_workers_enqueue_each_tick_once(
        live: list[Celery], database_url: str, db: psycopg.Connection) -> None:
    runs: list[int] = []
    receivers: list[Any] = []  # signals hold receivers weakly, as Celery's do

    def project() -> Celery:
        """One process of the project: its own app, tasks and core app."""
        app = make(live, database_url)

        @app.on_after_configure.connect
        def setup(sender: Celery, **kwargs: Any) -> None:
            sender.add_periodic_task(1.0, tick.s(), name="heartbeat")

        receivers.append(setup)

        @app.task(name="proj.tick")
        def tick() -> None:
            runs.append(1)

        return app

    workers = [Worker(project().prepare_worker(), queues=["celery"], slots=2,
                      poll_interval=0.05) for _ in range(3)]

    def two_ticks_ran() -> bool:
        return sum(state == "succeeded" for _, state, _ in jobs_of(db, "heartbeat")) >= 2

    ran = await asyncio.gather(*(run_worker_until(worker, two_ticks_ran, 15)
                                 for worker in workers))
    assert ran == [0, 0, 0]
    ticks = [tick for _, _, tick in jobs_of(db, "heartbeat")]
    task_ids = [task_id for task_id, _, _ in jobs_of(db, "heartbeat")]
    assert all(map(is_uuid4, task_ids)) and len(set(task_ids)) == len(task_ids)
    assert len(ticks) == len(set(ticks))  # exactly one job per tick, whoever enqueued it
    assert len(runs) >= 2


class EverySecondAndAHalf(schedule):
    """A custom schedule, as projects write them: its own is_due on the last run."""

    seen: list[datetime] = []  # noqa: RUF012 - the last runs is_due was asked about

    def is_due(self, last_run_at: datetime) -> schedstate:
        type(self).seen.append(last_run_at)
        elapsed = (self.now() - last_run_at).total_seconds()
        return schedstate(elapsed >= 1.5, max(1.5 - elapsed, 0.1) if elapsed < 1.5 else 1.5)


class DuckSchedule:
    """Not a schedule subclass at all: only is_due and remaining_estimate."""

    def is_due(self, last_run_at: datetime) -> tuple[bool, float]:
        elapsed = (datetime.now(UTC) - last_run_at).total_seconds()
        return elapsed >= 1.5, 0.5

    def remaining_estimate(self, last_run_at: datetime) -> timedelta:
        return last_run_at + timedelta(seconds=1.5) - datetime.now(UTC)

    def __repr__(self) -> str:
        return "<duck every 1.5s>"


async def test_custom_schedules_run_each_due_run_once_across_workers(
        live: list[Celery], database_url: str, db: psycopg.Connection) -> None:
    """Three workers ask the custom schedules' is_due with the last run from the database;
    each due run is enqueued once: consecutive runs are at least the period apart."""
    EverySecondAndAHalf.seen = []
    runs: list[str] = []

    def project() -> Celery:
        app = make(live, database_url, timezone="Europe/Paris", beat_schedule={
            "custom": {"task": "proj.run", "schedule": EverySecondAndAHalf(60),
                       "args": ("custom",)},
            "duck": {"task": "proj.run", "schedule": DuckSchedule(), "args": ("duck",)},
        })

        @app.task(name="proj.run")
        def run(name: str) -> None:
            runs.append(name)

        return app

    workers = [Worker(project().prepare_worker(), queues=["celery"], slots=2,
                      poll_interval=0.05) for _ in range(3)]

    def enough() -> bool:
        return all(sum(state == "succeeded" for _, state, _ in jobs_of(db, name)) >= 3
                   for name in ("custom", "duck"))

    ran = await asyncio.gather(*(run_worker_until(worker, enough, 30) for worker in workers))
    assert ran == [0, 0, 0]
    for name in ("custom", "duck"):
        ticks = [datetime.fromisoformat(tick) for _, _, tick in jobs_of(db, name)]
        gaps = [(later - earlier).total_seconds()
                for earlier, later in itertools.pairwise(ticks)]
        # Never two runs for one due run (a gap near 0). The tick is the database time at
        # the start of a worker's pass, and the pass's is_due calls come a moment later (a
        # few hundred ms on a loaded machine), so a gap may fall short of 1.5 s by as much.
        assert gaps and min(gaps) >= 1.0, (name, gaps)
    assert runs.count("custom") >= 3 and runs.count("duck") >= 3
    # is_due got the last run from the database, aware, in the app's zone.
    assert all(seen.tzinfo is not None and str(seen.tzinfo) == "Europe/Paris"
               for seen in EverySecondAndAHalf.seen)
    ticks = {datetime.fromisoformat(tick) for _, _, tick in jobs_of(db, "custom")}
    assert ticks & set(EverySecondAndAHalf.seen)


def test_which_schedules_run_through_is_due(apps: list[Celery]) -> None:
    app = make(apps)
    assert isinstance(to_trigger(crontab(minute=5)), CrontabTrigger)
    assert isinstance(to_trigger(schedule(5)), akadze_core.Every)

    class Named(crontab):  # a subclass that changes nothing runs on the trigger
        pass

    assert isinstance(to_trigger(Named(minute=5)), CrontabTrigger)
    custom = EverySecondAndAHalf(60)
    trigger = to_trigger(custom, "Europe/Paris", app=app)
    assert isinstance(trigger, DueTrigger) and custom.app is app
    assert trigger.spec == ("celery-is-due tests.compat.test_beat.EverySecondAndAHalf "
                            "<freq: 1.00 minute> tz=Europe/Paris")
    duck = to_trigger(DuckSchedule())
    assert isinstance(duck, DueTrigger)
    assert duck.spec == "celery-is-due tests.compat.test_beat.DuckSchedule <duck every 1.5s> tz=UTC"

    class NoRepr(BaseSchedule):
        def is_due(self, last_run_at: datetime) -> tuple[bool, float]:
            return False, 5.0

    spec = to_trigger(NoRepr()).spec  # the same in every process: no memory address
    assert "0x" not in spec and spec.startswith("celery-is-due ")


# --- entries, normalized ----------------------------------------------------------------------


def test_schedule_timezone_follows_celery() -> None:
    assert schedule_timezone("Europe/Paris", enable_utc=True) == "Europe/Paris"
    assert schedule_timezone(None, enable_utc=True) == "UTC"
    assert schedule_timezone(None, enable_utc=False) is not None
def test_entry_with_crontab_and_options() -> None:
    entry = entry_to_schedule("morning", {
        "task": "proj.tasks.report", "schedule": crontab(hour=7, minute=30),
        "args": (1, 2), "kwargs": {"x": 1},
        "options": {"queue": Queue("reports"), "priority": 5, "expires": 60,
                    "headers": {"h": 1}, "time_limit": 30, "countdown": 5},
    }, "Europe/Paris")
    assert isinstance(entry.trigger, CrontabTrigger)
    assert entry.trigger.spec == "celery-crontab 30 7 * * * tz=Europe/Paris"
    assert entry.add_schedule_kwargs() == {
        "name": "morning", "task": "proj.tasks.report", "trigger": entry.trigger,
        "args": {"args": [1, 2], "kwargs": {"x": 1}}, "queue": "reports", "priority": 5,
        "expires": timedelta(seconds=60),
        "meta": {"celery": {"headers": {"h": 1, "celery_beat_task": True}, "time_limit": 30}},
    }
    assert entry.ignored_options == ("countdown",)


def test_entry_defaults_numbers_relative_and_deadlines() -> None:
    entry = entry_to_schedule("tick", {"task": "t", "schedule": 30.0}, "UTC")
    assert entry.trigger.spec == "every 30s"
    assert (entry.args, entry.kwargs, entry.queue, entry.expires) == ([], {}, None, None)
    assert "queue" not in entry.add_schedule_kwargs()
    relative = entry_to_schedule("r", {"task": "t", "schedule": timedelta(hours=1),
                                       "relative": True}, "UTC")
    assert relative.trigger.spec == "celery-crontab 0 * * * * tz=UTC"
    deadline = entry_to_schedule("d", {"task": "t", "schedule": 5,
                                       "options": {"expires": datetime(2030, 1, 1, 12)}},
                                 "Europe/Paris")
    assert deadline.expires is None
    assert deadline.meta["celery"]["expires"] == "2030-01-01T11:00:00+00:00"
    native = Cron("0 3 * * *")
    assert entry_to_schedule("n", {"task": "t", "schedule": native}).trigger is native
    given = crontab(app="celery app")
    entry_to_schedule("c", {"task": "t", "schedule": given})
    assert given.app == "celery app"  # unlike maybe_schedule, the entry leaves it alone


def test_entries_that_cannot_be_scheduled() -> None:
    with pytest.raises(ValueError, match="no 'task'"):
        entry_to_schedule("x", {"schedule": 5})
    with pytest.raises(ValueError, match="no 'schedule'"):
        entry_to_schedule("x", {"task": "t"})

    class Custom(BaseSchedule):
        pass

    with pytest.raises(NotImplementedError, match="custom schedule Custom has no is_due"):
        to_trigger(Custom())
    with pytest.raises(TypeError, match="must be seconds"):
        to_trigger("every day")
