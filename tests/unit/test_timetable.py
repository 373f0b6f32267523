"""The runtime schedules' timetable: which ticks come due when, without a database."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from typing import Any

from akadze_core.schedules.timetable import Timetable

T0 = datetime(2030, 1, 1, 12, 0, 0, tzinfo=timezone.utc)
MINUTE = timedelta(minutes=1)


def row(name: str, spec: str = "every 60s", *, version: int = 1, paused: bool = False,
        last_tick: datetime = T0) -> dict[str, Any]:
    return {"name": name, "spec": spec, "version": version, "paused": paused,
            "last_tick": last_tick}


def test_a_loaded_schedule_comes_due_at_its_next_tick_and_then_the_following() -> None:
    table = Timetable()
    table.load([row("a", last_tick=T0 + timedelta(seconds=10))], T0 + timedelta(seconds=10))
    assert table.next_fire() == T0 + MINUTE
    assert table.take_due(T0 + timedelta(seconds=59)) == []
    [due] = table.take_due(T0 + MINUTE)
    assert (due.name, due.version, due.tick, due.following) == ("a", 1, T0 + MINUTE,
                                                                T0 + 2 * MINUTE)
    assert due.tick_text == "2030-01-01T12:01:00+00:00"
    assert table.next_fire() is None  # out of the heap until given back
    table.advance([due])
    assert table.next_fire() == T0 + 2 * MINUTE


def test_a_tick_after_the_stored_last_tick_is_due_at_once_and_only_the_latest() -> None:
    table = Timetable()
    now = T0 + timedelta(minutes=90, seconds=5)
    table.load([row("behind", last_tick=T0)], now)
    [due] = table.take_due(now)
    assert due.tick == T0 + timedelta(minutes=90)  # 89 missed ticks skipped
    assert due.following == T0 + timedelta(minutes=91)


def test_a_stalled_pass_enqueues_the_latest_tick_not_every_missed_one() -> None:
    table = Timetable()
    table.load([row("a")], T0)
    [due] = table.take_due(T0 + timedelta(minutes=5, seconds=1))
    assert (due.tick, due.following) == (T0 + 5 * MINUTE, T0 + 6 * MINUTE)


def test_put_back_keeps_the_tick_for_the_next_pass() -> None:
    table = Timetable()
    table.load([row("a")], T0)
    due = table.take_due(T0 + MINUTE)
    table.put_back(due)
    assert [tick.tick for tick in table.take_due(T0 + MINUTE)] == [T0 + MINUTE]


def test_paused_removed_and_changed_schedules_leave_no_live_tick() -> None:
    table = Timetable()
    table.load([row("paused", paused=True), row("removed"), row("changed")], T0)
    table.drop(["removed"])
    table.load([row("changed", "every 120s", version=2)], T0)
    assert [(due.name, due.version) for due in table.take_due(T0 + 2 * MINUTE)] == \
        [("changed", 2)]
    assert len(table) == 2 and table.versions() == {"paused": 1, "changed": 2}


def test_a_tick_given_back_for_an_outdated_version_is_ignored() -> None:
    table = Timetable()
    table.load([row("a")], T0)
    due = table.take_due(T0 + MINUTE)
    table.load([row("a", version=2, last_tick=T0 + MINUTE)], T0 + MINUTE)
    table.advance(due)  # the version-1 tick: load already put version 2 in place
    assert [(tick.version, tick.tick) for tick in table.take_due(T0 + 10 * MINUTE)] == \
        [(2, T0 + 10 * MINUTE)]


def test_many_schedules_on_one_trigger_share_its_evaluation() -> None:
    table = Timetable()
    table.load([row(f"s{number}") for number in range(1000)], T0)
    due = table.take_due(T0 + MINUTE, limit=300)
    assert len(due) == 300 and len(table.take_due(T0 + MINUTE)) == 700
    assert {tick.following for tick in due} == {T0 + 2 * MINUTE}


def test_cron_specs_in_their_time_zone() -> None:
    table = Timetable()
    table.load([row("berlin", "cron 0 13 * * * tz=Europe/Berlin")], T0)
    assert table.next_fire() == datetime(2030, 1, 2, 12, 0, tzinfo=timezone.utc)


def test_a_row_whose_spec_does_not_parse_is_left_out() -> None:
    table = Timetable()
    table.load([row("broken", "sometimes"), row("fine")], T0)
    assert table.versions() == {"fine": 1}


def test_stale_and_fingerprint_compare_with_the_stored_versions() -> None:
    table = Timetable()
    table.load([row("a", version=3), row("b", version=5)], T0)
    assert table.fingerprint() == (2, 8, 5)
    assert table.stale({"a": 3, "b": 6, "c": 7}) == (["b", "c"], [])
    assert table.stale({"a": 3}) == ([], ["b"])


def test_stale_heap_items_are_compacted() -> None:
    table = Timetable()
    for version in range(1, 3000):
        table.load([row("a", "every 3600s", version=version)], T0)
    assert len(table._heap) < 2000  # the point of the test
