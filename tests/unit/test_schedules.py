"""Declaring schedules and deciding what a check does: pure logic, no database.

An App with an unreachable URL is fine here: nothing connects until a job is enqueued.
"""

from __future__ import annotations

import json
import uuid
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest

from akadze_core import App, Cron, Every, InvalidArgs, Schedule, ScheduleSpec
from akadze_core.schedules.scheduler import (
    MAX_CHECK_INTERVAL,
    MIN_CHECK_INTERVAL,
    next_check_in,
    plan,
)

UTC = timezone.utc
NOW = datetime(2024, 5, 10, 12, 7, 30, tzinfo=UTC)


@pytest.fixture
def app() -> App:
    return App("postgresql://nobody@127.0.0.1:1/none")


# --- declaring -----------------------------------------------------------------------------------

def test_every_way_to_declare_holds_the_keywords_in_one_spec(app: App) -> None:
    @app.task("report.build", queue="reports")
    def build(kind: str) -> None: ...

    options: dict[str, Any] = {
        "trigger": Every(timedelta(hours=1)), "args": {"kind": "daily"}, "queue": "q",
        "priority": 2, "max_attempts": 4, "expires": 60, "meta": {"m": 1}, "task_ids": True}
    spec = ScheduleSpec(**options)
    declared = [app.add_schedule("a", build, **options), build.schedule("b", **options),
                app.declare_schedule("c", build, spec),
                Schedule.declare(app, "d", build, **options),
                Schedule.from_spec(app, "e", "report.build", spec)]
    assert {s.name for s in declared} == {"a", "b", "c", "d", "e"}
    assert len({(s.task, s.trigger, tuple(s.args.items()), s.queue, s.priority,
                 s.max_attempts, s.expires, tuple(s.meta.items()), s.task_ids)
                for s in declared}) == 1
    assert declared[0].expires == timedelta(seconds=60) and declared[0].task_ids
    with pytest.raises(ValueError, match="already declared"):
        app.declare_schedule("c", build, spec)


def test_add_schedule_with_a_task_object_takes_its_defaults(app: App) -> None:
    @app.task("report.build", queue="reports", priority=3, max_attempts=5)
    def build(kind: str) -> None: ...

    schedule = app.add_schedule("reports.nightly", build, trigger="0 3 * * *",
                                args={"kind": "daily"})
    assert isinstance(schedule, Schedule)
    assert app.schedules == {"reports.nightly": schedule}
    assert schedule.trigger.spec == "cron 0 3 * * * tz=UTC"
    tick = datetime(2024, 5, 10, 3, tzinfo=UTC)
    request = schedule.request(app, tick)
    assert (request.task, request.queue, request.priority, request.max_attempts) == \
        ("report.build", "reports", 3, 5)
    assert json.loads(request.args) == {"kind": "daily"}
    assert request.expires_at is None and request.scheduled_at is None and request.delay == 0
    assert json.loads(request.meta) == {"schedule": "reports.nightly",
                                        "tick": "2024-05-10T03:00:00+00:00"}


def test_task_ids_give_every_job_its_own_uuid4(app: App) -> None:
    plain = app.add_schedule("plain", "report.build", trigger=Every(60), meta={"a": 1})
    tagged = app.add_schedule("tagged", "report.build", trigger=Every(60), meta={"a": 1},
                              task_ids=True)
    assert "task_id" not in json.loads(plain.request(app, NOW).meta)
    ids = [json.loads(tagged.request(app, NOW).meta)["task_id"] for _ in range(3)]
    assert all(uuid.UUID(task_id).version == 4 for task_id in ids) and len(set(ids)) == 3
    assert {key: value for key, value in json.loads(tagged.request(app, NOW).meta).items()
            if key != "task_id"} == json.loads(plain.request(app, NOW).meta) | {
                "schedule": "tagged"}
    assert tagged != plain and tagged.task_ids and not plain.task_ids


def test_explicit_options_win_and_expiry_counts_from_the_tick(app: App) -> None:
    app.task("report.build", queue="reports")(lambda: None)
    schedule = app.add_schedule(
        "reports.hourly", "report.build", trigger=Every(timedelta(hours=1)), queue="urgent",
        priority=-1, max_attempts=1, expires=timedelta(minutes=10),
        meta={"owner": "ops", "schedule": "overridden"})
    tick = datetime(2024, 5, 10, 12, tzinfo=UTC)
    request = schedule.request(app, tick)
    assert (request.queue, request.priority, request.max_attempts) == ("urgent", -1, 1)
    assert request.expires_at == tick + timedelta(minutes=10)
    assert json.loads(request.meta) == {"owner": "ops", "schedule": "reports.hourly",
                                        "tick": "2024-05-10T12:00:00+00:00"}
    assert schedule.request(app, tick).expires_at == schedule.request(app, tick).expires_at
    assert app.add_schedule("float", "x", trigger=Every(5), expires=90).expires == \
        timedelta(seconds=90)


def test_a_task_name_resolves_when_the_job_is_built(app: App) -> None:
    schedule = app.add_schedule("later", "registered.later", trigger=Every(60))
    assert (schedule.resolved_queue(app), schedule.request(app, NOW).max_attempts) == \
        ("default", 3)
    app.task("registered.later", queue="elsewhere", max_attempts=7)(lambda: None)
    assert schedule.resolved_queue(app) == "elsewhere"
    assert schedule.request(app, NOW).max_attempts == 7


def test_task_schedule_names_the_schedule_after_the_task(app: App) -> None:
    @app.task("cleanup")
    async def cleanup() -> None: ...

    first = cleanup.schedule(trigger=Cron("*/5 * * * *", timezone="Europe/Berlin"))
    second = cleanup.schedule("cleanup.weekly", trigger="0 0 * * 0", args={})
    assert (first.name, first.task, second.name, second.task) == \
        ("cleanup", "cleanup", "cleanup.weekly", "cleanup")
    assert set(app.schedules) == {"cleanup", "cleanup.weekly"}


def test_duplicate_names_raise(app: App) -> None:
    app.add_schedule("dup", "t", trigger=Every(60))
    with pytest.raises(ValueError, match="already declared"):
        app.add_schedule("dup", "other", trigger="* * * * *")
    assert app.schedules["dup"].task == "t"


@pytest.mark.parametrize(("options", "error"), [
    ({"trigger": "61 * * * *"}, ValueError),
    ({"trigger": Cron("* * * * *"), "name": ""}, ValueError),
    ({"trigger": Every(60), "name": "nul\x00"}, ValueError),
    ({"trigger": Every(60), "task": ""}, ValueError),
    ({"trigger": Every(60), "task": 42}, ValueError),
    ({"trigger": Every(60), "queue": ""}, ValueError),
    ({"trigger": Every(60), "max_attempts": 0}, ValueError),
    ({"trigger": Every(60), "priority": "high"}, ValueError),
    ({"trigger": Every(60), "expires": timedelta(0)}, ValueError),
    ({"trigger": Every(60), "expires": -5}, ValueError),
    ({"trigger": Every(60), "args": [1, 2]}, ValueError),
    ({"trigger": Every(60), "args": {"when": datetime(2024, 1, 1)}}, InvalidArgs),
    ({"trigger": Every(60), "args": {"nan": float("nan")}}, InvalidArgs),
    ({"trigger": Every(60), "meta": {"bytes": b"x"}}, InvalidArgs),
    ({"trigger": timedelta(minutes=5)}, ValueError),
    ({"trigger": Every(60), "name": "n" * 256}, InvalidArgs),
    ({"trigger": Every(60), "task": "t" * 256}, InvalidArgs),
    ({"trigger": Every(60), "queue": "q" * 8200}, InvalidArgs),
])
def test_invalid_declarations_raise_at_once(app: App, options: dict[str, Any],
                                            error: type[Exception]) -> None:
    arguments = {"name": "s", "task": "t", **options}
    name, task = arguments.pop("name"), arguments.pop("task")
    with pytest.raises(error):
        app.add_schedule(name, task, **arguments)
    assert app.schedules == {}


# --- what a check does ---------------------------------------------------------------------------

EVERY_5_MIN = Every(timedelta(minutes=5))
LATEST = datetime(2024, 5, 10, 12, 5, tzinfo=UTC)


def state(spec: str, last_tick: datetime) -> dict[str, Any]:
    return {"spec": spec, "last_tick": last_tick}


def test_a_new_schedule_starts_at_its_latest_tick_without_running_it() -> None:
    assert plan(EVERY_5_MIN, None, NOW) == ("start", LATEST)


def test_a_changed_spec_starts_over_without_running() -> None:
    old = state("cron 0 3 * * * tz=UTC", LATEST - timedelta(days=3))
    assert plan(EVERY_5_MIN, old, NOW) == ("reset", LATEST)


def test_a_tick_after_the_stored_one_is_enqueued() -> None:
    previous = state(EVERY_5_MIN.spec, LATEST - timedelta(minutes=5))
    assert plan(EVERY_5_MIN, previous, NOW) == ("enqueue", LATEST)


def test_after_downtime_only_the_latest_missed_tick_runs() -> None:
    long_ago = state(EVERY_5_MIN.spec, LATEST - timedelta(days=30))
    assert plan(EVERY_5_MIN, long_ago, NOW) == ("enqueue", LATEST)


def test_a_tick_already_taken_does_nothing() -> None:
    assert plan(EVERY_5_MIN, state(EVERY_5_MIN.spec, LATEST), NOW) is None
    # A row ahead of the clock (another worker's newer tick) is left alone too.
    assert plan(EVERY_5_MIN, state(EVERY_5_MIN.spec, LATEST + timedelta(minutes=5)), NOW) \
        is None


class NoTicksYet:
    """A custom trigger whose first tick is in the future."""

    spec = "custom first=2030"
    first = datetime(2030, 1, 1, tzinfo=UTC)

    def latest(self, at: datetime) -> datetime | None:
        return self.first if at >= self.first else None

    def next(self, after: datetime) -> datetime:
        return max(self.first, after + timedelta(days=1))


def test_a_trigger_without_a_past_tick_starts_at_now() -> None:
    assert plan(NoTicksYet(), None, NOW) == ("start", NOW)
    assert plan(NoTicksYet(), state("old", NOW - timedelta(days=1)), NOW) == ("reset", NOW)
    assert plan(NoTicksYet(), state(NoTicksYet.spec, NOW), NOW) is None
    first = NoTicksYet.first
    assert plan(NoTicksYet(), state(NoTicksYet.spec, NOW), first) == ("enqueue", first)


class DueAfterAMinute:
    """A trigger told the last run: due a minute after it."""

    spec = "a minute after the last run"

    def latest(self, at: datetime) -> datetime | None:
        return None

    def latest_after(self, last_tick: datetime, at: datetime) -> datetime | None:
        return at if at - last_tick >= timedelta(minutes=1) else None

    def next(self, after: datetime) -> datetime:
        return after + timedelta(seconds=5)


def test_a_last_run_trigger_decides_from_the_stored_tick() -> None:
    trigger = DueAfterAMinute()
    assert plan(trigger, None, NOW) == ("start", NOW)
    assert plan(trigger, state("old", NOW - timedelta(days=1)), NOW) == ("reset", NOW)
    assert plan(trigger, state(trigger.spec, NOW - timedelta(seconds=59)), NOW) is None
    assert plan(trigger, state(trigger.spec, NOW - timedelta(minutes=1)), NOW) == (
        "enqueue", NOW)


def test_next_check_waits_for_the_next_tick_within_bounds() -> None:
    assert next_check_in([Every(60)], NOW) == 30.0
    assert next_check_in([EVERY_5_MIN], NOW) == MAX_CHECK_INTERVAL  # 150 s away: look anyway
    assert next_check_in([Every(timedelta(minutes=5)), Every(20)], NOW) == 10.0
    assert next_check_in([Every(20)], datetime(2024, 5, 10, 12, 0, 19, 500_000, tzinfo=UTC)) \
        == MIN_CHECK_INTERVAL
    assert next_check_in([Cron("0 3 * * *")], NOW) == MAX_CHECK_INTERVAL
    assert next_check_in([], NOW) == MAX_CHECK_INTERVAL


# --- schedules that count from their own instant (since) ------------------------------------------

def test_since_starts_a_new_schedule_at_that_instant_so_a_passed_tick_runs() -> None:
    since = LATEST - timedelta(minutes=2)
    assert plan(EVERY_5_MIN, None, NOW, since) == ("start", since)
    assert plan(EVERY_5_MIN, state(EVERY_5_MIN.spec, since), NOW, since) == ("enqueue", LATEST)


def test_since_after_the_latest_tick_waits_for_the_next_one() -> None:
    since = LATEST + timedelta(seconds=10)  # created, re-enabled or last run after the tick
    assert plan(EVERY_5_MIN, None, NOW, since) == ("start", since)
    # A state row behind since (ticks that passed while a task was disabled) does not run.
    assert plan(EVERY_5_MIN, state(EVERY_5_MIN.spec, LATEST - timedelta(hours=1)), NOW,
                since) is None


def test_a_reset_with_since_never_steps_back_behind_a_tick_already_taken() -> None:
    taken = state("every 60s", LATEST)
    assert plan(EVERY_5_MIN, taken, NOW, LATEST - timedelta(minutes=1)) == ("reset", LATEST)
    assert plan(EVERY_5_MIN, state(EVERY_5_MIN.spec, LATEST), NOW, LATEST) is None
    old = state("every 60s", LATEST - timedelta(minutes=9))
    assert plan(EVERY_5_MIN, old, NOW, LATEST - timedelta(minutes=3)) == \
        ("reset", LATEST - timedelta(minutes=3))
