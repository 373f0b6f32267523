"""The runtime schedules' timetable: which ticks come due when, without a database."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from typing import Any

import pytest

from akadze_core.schedules.timetable import Timetable
from akadze_core.schedules.triggers import Cron, Every, parse_spec

T0 = datetime(2030, 1, 1, 12, 0, 0, tzinfo=timezone.utc)
MINUTE = timedelta(minutes=1)
ZONES = ("UTC", "Europe/Berlin", "America/New_York", "Asia/Tokyo")


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


def test_stale_bucket_entries_are_compacted() -> None:
    table = Timetable()
    for version in range(1, 3000):
        table.load([row("a", "every 3600s", version=version)], T0)
    assert table._items < 2000 and len(table._instants) < 2000  # the point of the test


def _fire_through(table: Timetable, start: datetime, end: datetime, *,
                  prepare: bool) -> list[tuple[str, datetime]]:
    """Every tick the table gives out from ``start`` to ``end``, passes at each next tick
    (plus 50 ms), advancing each and preparing between passes when ``prepare``."""
    fired: list[tuple[str, datetime]] = []
    now = start
    while (following := table.next_fire()) is not None and following <= end:
        now = following + timedelta(milliseconds=50)
        due = table.take_due(now)
        fired += [(tick.name, tick.tick) for tick in due]
        table.advance(due)
        if prepare:
            while not table.prepare(1.0):
                pass
    return fired


def _reference(spec: str, start: datetime, end: datetime) -> list[datetime]:
    trigger = parse_spec(spec)
    ticks, tick = [], trigger.next(start)
    while tick <= end:
        ticks.append(tick)
        tick = trigger.next(tick)
    return ticks


def test_ticks_moved_on_without_evaluating_match_the_trigger_across_dst_changes() -> None:
    # Berlin falls back on 2030-10-27 (02:00-03:00 local twice) and springs forward on
    # 2030-03-31 (02:00-03:00 skipped); New York on 2030-11-03 and 2030-03-10.
    specs = ["cron 30 * * * * tz=Europe/Berlin", "cron 30 2 * * * tz=Europe/Berlin",
             "cron */20 1-3 * * * tz=America/New_York", "every 5400s"]
    for start in (datetime(2030, 10, 26, 20, tzinfo=timezone.utc),
                  datetime(2030, 3, 30, 20, tzinfo=timezone.utc),
                  datetime(2030, 11, 2, 20, tzinfo=timezone.utc),
                  datetime(2030, 3, 9, 20, tzinfo=timezone.utc)):
        end = start + timedelta(hours=30)
        for prepare in (True, False):
            table = Timetable()
            table.load([row(f"s{number}", spec, last_tick=start)
                        for number, spec in enumerate(specs)], start)
            fired = _fire_through(table, start, end, prepare=prepare)
            for number, spec in enumerate(specs):
                assert [tick for name, tick in fired if name == f"s{number}"] == \
                    _reference(spec, start, end), (spec, start, prepare)


def test_a_boundary_takes_its_ticks_without_evaluating_triggers(
        monkeypatch: pytest.MonkeyPatch) -> None:
    table = Timetable()
    table.load([row(f"every{number}") for number in range(50)]
               + [row(f"cron{number}", f"cron */2 * * * * tz={ZONES[number % 4]}")
                  for number in range(50)], T0)
    assert not table.unprepared  # load computes the tick after the next one too
    table.advance(table.take_due(T0 + MINUTE))
    assert table.prepare(1.0)
    evaluations: list[datetime] = []

    def counting(original: Any) -> Any:
        def evaluate(self: Any, after: datetime) -> datetime:
            evaluations.append(after)
            return original(self, after)  # type: ignore[no-any-return]
        return evaluate

    monkeypatch.setattr(Cron, "next", counting(Cron.next))
    monkeypatch.setattr(Every, "next", counting(Every.next))
    due = table.take_due(T0 + 2 * MINUTE)
    assert len(due) == 100 and evaluations == []
    assert {(tick.tick, tick.following) for tick in due if tick.name == "cron1"} == \
        {(T0 + 2 * MINUTE, T0 + 4 * MINUTE)}
    table.advance(due)
    assert table.unprepared and table.prepare(1.0) and not table.unprepared
    assert len(evaluations) == 5  # once per distinct trigger and tick, not per schedule
    assert {tick.following for tick in table.take_due(T0 + 3 * MINUTE)} == {T0 + 4 * MINUTE}


def test_prepare_stops_after_its_budget_and_resumes() -> None:
    table = Timetable()
    table.load([row(f"s{number}", f"cron {number} * * * * tz=Asia/Tokyo")
                for number in range(60)], T0)
    due = table.take_due(T0 + timedelta(hours=1))
    table.advance(due)
    assert table.prepare(0.0) is False  # one evaluation, then out of budget
    while not table.prepare(0.0):
        pass
    assert not table.unprepared


def test_a_schedule_changed_or_removed_before_it_was_prepared_keeps_its_new_definition() -> None:
    table = Timetable()
    table.load([row("changed"), row("removed"), row("kept")], T0)
    due = table.take_due(T0 + MINUTE)
    table.advance(due)
    assert table.unprepared
    table.load([row("changed", "every 300s", version=2, last_tick=T0 + MINUTE)],
               T0 + MINUTE + timedelta(seconds=5))
    table.drop(["removed"])
    assert table.prepare(1.0)
    due = table.take_due(T0 + 5 * MINUTE + timedelta(seconds=1))
    assert sorted((tick.name, tick.version, tick.tick, tick.following) for tick in due) == [
        ("changed", 2, T0 + 5 * MINUTE, T0 + 10 * MINUTE),
        ("kept", 1, T0 + 5 * MINUTE, T0 + 6 * MINUTE),  # a stalled pass: the latest tick
    ]


def test_a_pass_before_prepare_ran_still_computes_the_following_tick() -> None:
    table = Timetable()
    table.load([row("a", "cron */2 * * * * tz=America/New_York")], T0)
    due = table.take_due(T0 + 2 * MINUTE)
    table.advance(due)  # at T0 + 4 min, its tick after not computed yet
    [due_again] = table.take_due(T0 + 4 * MINUTE)
    assert (due_again.tick, due_again.following) == (T0 + 4 * MINUTE, T0 + 6 * MINUTE)
    table.put_back([due_again])
    assert table.take_due(T0 + 4 * MINUTE)[0].following == T0 + 6 * MINUTE
