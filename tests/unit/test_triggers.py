"""Triggers as pure functions of time: cron (croniter + zoneinfo) and epoch-aligned intervals."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from zoneinfo import ZoneInfo

import pytest

from akadze_core import Cron, Every, Trigger
from akadze_core.schedules.triggers import EPOCH, as_trigger, parse_spec

UTC = timezone.utc


def utc(*parts: int) -> datetime:
    return datetime(*parts, tzinfo=UTC)  # type: ignore[misc]


def ticks(trigger: Trigger, start: datetime, count: int) -> list[datetime]:
    """The first ``count`` ticks after ``start``."""
    found = []
    for _ in range(count):
        start = trigger.next(start)
        found.append(start)
    return found


def check_consistent(trigger: Trigger, start: datetime, end: datetime, step: timedelta) -> None:
    """latest(at) <= at < next(at), with no tick in between, at every step of the range."""
    at = start
    while at < end:
        latest, following = trigger.latest(at), trigger.next(at)
        assert latest is not None
        assert latest <= at < following, at
        assert trigger.next(latest) == following, at
        assert trigger.latest(following) == following, at
        at += step


# --- cron in UTC ---------------------------------------------------------------------------------

def test_cron_latest_and_next_in_utc() -> None:
    daily = Cron("0 3 * * *")
    assert daily.latest(utc(2024, 5, 10, 12)) == utc(2024, 5, 10, 3)
    assert daily.latest(utc(2024, 5, 10, 2, 59, 59)) == utc(2024, 5, 9, 3)
    assert daily.next(utc(2024, 5, 10, 12)) == utc(2024, 5, 11, 3)
    # A tick is its own latest tick, and next() is strictly after it.
    assert daily.latest(utc(2024, 5, 10, 3)) == utc(2024, 5, 10, 3)
    assert daily.next(utc(2024, 5, 10, 3)) == utc(2024, 5, 11, 3)
    assert daily.latest(utc(2024, 5, 10, 3) + timedelta(microseconds=1)) == utc(2024, 5, 10, 3)


def test_cron_returns_aware_utc_and_takes_naive_as_utc() -> None:
    every_minute = Cron("* * * * *")
    latest = every_minute.latest(datetime(2024, 5, 10, 12, 0, 30))
    assert latest == utc(2024, 5, 10, 12)
    assert latest is not None and latest.utcoffset() == timedelta(0)
    berlin = datetime(2024, 5, 10, 14, 0, 30, tzinfo=ZoneInfo("Europe/Berlin"))
    assert every_minute.latest(berlin) == utc(2024, 5, 10, 12)
    assert every_minute.next(berlin).tzinfo == UTC


def test_cron_aliases() -> None:
    assert Cron("@hourly").latest(utc(2024, 5, 10, 12, 59)) == utc(2024, 5, 10, 12)
    assert Cron("@daily").next(utc(2024, 5, 10, 12)) == utc(2024, 5, 11)


def test_cron_sixth_field_is_seconds() -> None:
    every_15s = Cron("* * * * * */15")
    assert every_15s.latest(utc(2024, 5, 10, 12, 0, 7)) == utc(2024, 5, 10, 12, 0, 0)
    assert every_15s.next(utc(2024, 5, 10, 12, 0, 7)) == utc(2024, 5, 10, 12, 0, 15)
    assert ticks(every_15s, utc(2024, 5, 10, 12, 0, 50), 2) == [
        utc(2024, 5, 10, 12, 1, 0), utc(2024, 5, 10, 12, 1, 15)]
    assert Cron("30 9 * * * 20").latest(utc(2024, 5, 10, 10)) == utc(2024, 5, 10, 9, 30, 20)


def test_day_or_is_vixie_by_default_and_and_when_false() -> None:
    # Day of month 1 and Monday, from Monday 2024-01-01.
    either = Cron("0 0 1 * mon")
    both = Cron("0 0 1 * mon", day_or=False)
    assert ticks(either, utc(2024, 1, 1), 3) == [utc(2024, 1, 8), utc(2024, 1, 15),
                                                 utc(2024, 1, 22)]
    assert ticks(both, utc(2024, 1, 1), 2) == [utc(2024, 4, 1), utc(2024, 7, 1)]
    assert both.latest(utc(2024, 3, 31)) == utc(2024, 1, 1)
    assert either.spec != both.spec


# --- time zones and daylight saving time --------------------------------------------------------

def test_cron_runs_on_the_wall_clock_of_its_zone() -> None:
    berlin = Cron("0 3 * * *", timezone="Europe/Berlin")
    assert berlin.latest(utc(2024, 1, 15, 12)) == utc(2024, 1, 15, 2)   # CET, +01:00
    assert berlin.latest(utc(2024, 7, 15, 12)) == utc(2024, 7, 15, 1)   # CEST, +02:00
    new_york = Cron("0 9 * * 1-5", timezone=ZoneInfo("America/New_York"))
    assert new_york.next(utc(2024, 7, 12, 14)) == utc(2024, 7, 15, 13)  # Fri 14Z -> Mon 9 EDT


def test_new_york_spring_forward_keeps_the_wall_time() -> None:
    # 2024-03-10 02:00 EST -> 03:00 EDT: a 09:00 job moves from 14:00Z to 13:00Z.
    nine = Cron("0 9 * * *", timezone="America/New_York")
    assert ticks(nine, utc(2024, 3, 8, 15), 3) == [
        utc(2024, 3, 9, 14), utc(2024, 3, 10, 13), utc(2024, 3, 11, 13)]
    # 02:30 does not exist that day: it runs at the first instant after the gap.
    half_past_two = Cron("30 2 * * *", timezone="America/New_York")
    assert half_past_two.next(utc(2024, 3, 9, 12)) == utc(2024, 3, 10, 7)  # 03:00 EDT


def test_berlin_spring_forward_gap() -> None:
    # 2024-03-31 02:00 CET -> 03:00 CEST.
    hourly = Cron("0 * * * *", timezone="Europe/Berlin")
    # 01:00 CET, then 03:00 CEST: one hour apart in real time, the wall's 02:00 never came.
    assert ticks(hourly, utc(2024, 3, 30, 23, 30), 3) == [
        utc(2024, 3, 31, 0), utc(2024, 3, 31, 1), utc(2024, 3, 31, 2)]
    gap = Cron("30 2 * * *", timezone="Europe/Berlin")
    assert gap.latest(utc(2024, 3, 31, 5)) == utc(2024, 3, 31, 1)  # at 03:00 CEST
    assert gap.next(utc(2024, 3, 31, 5)) == utc(2024, 4, 1, 0, 30)


def test_berlin_fall_back_repeats_the_wall_hour() -> None:
    # 2024-10-27 03:00 CEST -> 02:00 CET: the wall's 02:xx happens twice.
    hourly = Cron("0 * * * *", timezone="Europe/Berlin")
    assert ticks(hourly, utc(2024, 10, 26, 23, 30), 3) == [
        utc(2024, 10, 27, 0), utc(2024, 10, 27, 1), utc(2024, 10, 27, 2)]
    # croniter fires a wall time that happens twice at both of its instants (documented).
    twice = Cron("30 2 * * *", timezone="Europe/Berlin")
    assert ticks(twice, utc(2024, 10, 26, 12), 3) == [
        utc(2024, 10, 27, 0, 30), utc(2024, 10, 27, 1, 30), utc(2024, 10, 28, 1, 30)]
    assert twice.latest(utc(2024, 10, 27, 1)) == utc(2024, 10, 27, 0, 30)
    # A time outside the repeated hour runs once.
    assert ticks(Cron("0 3 * * *", timezone="Europe/Berlin"), utc(2024, 10, 26, 12), 2) == [
        utc(2024, 10, 27, 2), utc(2024, 10, 28, 2)]


@pytest.mark.parametrize("expression", ["0 * * * *", "*/30 * * * *", "30 2 * * *",
                                        "15 1-3 * * *"])
@pytest.mark.parametrize("zone", ["Europe/Berlin", "America/New_York"])
def test_latest_and_next_agree_across_dst_days(expression: str, zone: str) -> None:
    cron = Cron(expression, timezone=zone)
    step = timedelta(minutes=7, seconds=13)
    check_consistent(cron, utc(2024, 3, 9, 20), utc(2024, 3, 11, 12), step)
    check_consistent(cron, utc(2024, 10, 26, 20), utc(2024, 10, 27, 12), step)
    check_consistent(cron, utc(2024, 11, 2, 20), utc(2024, 11, 3, 12), step)


def test_cron_never_returns_a_tick_out_of_order_over_a_year() -> None:
    cron = Cron("30 2 * * *", timezone="Europe/Berlin")
    found = ticks(cron, utc(2024, 1, 1), 370)
    assert found == sorted(set(found))


# --- intervals -----------------------------------------------------------------------------------

def test_every_ticks_at_multiples_since_the_epoch() -> None:
    five = Every(timedelta(minutes=5))
    assert five.latest(utc(2024, 5, 10, 12, 7, 30)) == utc(2024, 5, 10, 12, 5)
    assert five.next(utc(2024, 5, 10, 12, 7, 30)) == utc(2024, 5, 10, 12, 10)
    assert five.latest(utc(2024, 5, 10, 12, 5)) == utc(2024, 5, 10, 12, 5)
    assert five.next(utc(2024, 5, 10, 12, 5)) == utc(2024, 5, 10, 12, 10)
    seven = Every(7)
    assert seven.latest(EPOCH + timedelta(seconds=100)) == EPOCH + timedelta(seconds=98)
    assert seven.latest(EPOCH - timedelta(seconds=1)) == EPOCH - timedelta(seconds=7)
    # Deterministic: two triggers made at different times agree on every tick.
    assert Every(timedelta(hours=1)).latest(utc(2024, 5, 10, 12, 30)) == utc(2024, 5, 10, 12)


def test_every_is_exact_to_the_microsecond() -> None:
    half = Every(0.5)
    assert half.latest(utc(2024, 5, 10, 12, 0, 0) + timedelta(microseconds=499_999)) == \
        utc(2024, 5, 10, 12)
    assert half.next(utc(2024, 5, 10, 12)) == utc(2024, 5, 10, 12) + timedelta(milliseconds=500)
    odd = Every(timedelta(seconds=1, microseconds=3))
    at = utc(2031, 1, 1, 0, 0, 0)
    assert (odd.latest(at) - EPOCH) % odd.interval == timedelta(0)
    check_consistent(odd, at, at + timedelta(seconds=30), timedelta(milliseconds=337))


def test_every_naive_input_is_utc() -> None:
    assert Every(60).latest(datetime(2024, 5, 10, 12, 0, 30)) == utc(2024, 5, 10, 12)


# --- validation ----------------------------------------------------------------------------------

@pytest.mark.parametrize("expression", [
    "", "* * *", "* * * * * * *", "61 * * * *", "* 24 * * *", "* * 32 * *", "* * * 13 *",
    "* * * * 8", "* * * * * 61", "foo bar baz qux quux", "H * * * *", "@reboot",
])
def test_bad_cron_raises_value_error(expression: str) -> None:
    with pytest.raises(ValueError, match="cron expression"):
        Cron(expression)


def test_cron_that_never_matches_raises() -> None:
    with pytest.raises(ValueError, match="never matches"):
        Cron("0 0 30 2 *")


def test_cron_needs_a_string() -> None:
    with pytest.raises(ValueError, match="string"):
        Cron(5)  # type: ignore[arg-type]


@pytest.mark.parametrize("zone", ["Mars/Olympus_Mons", "", "../etc/passwd", 3])
def test_unknown_time_zone_raises(zone: object) -> None:
    with pytest.raises(ValueError, match="zone"):
        Cron("0 3 * * *", timezone=zone)  # type: ignore[arg-type]


@pytest.mark.parametrize("interval", [0, -1, timedelta(0), timedelta(seconds=-5),
                                      timedelta(microseconds=0.4), 0.0000001])
def test_non_positive_interval_raises(interval: object) -> None:
    with pytest.raises(ValueError, match="positive"):
        Every(interval)  # type: ignore[arg-type]


@pytest.mark.parametrize("interval", ["5", None, True])
def test_interval_must_be_a_duration(interval: object) -> None:
    with pytest.raises(ValueError, match="timedelta or seconds"):
        Every(interval)  # type: ignore[arg-type]


# --- specs ---------------------------------------------------------------------------------------

def test_specs_are_pinned() -> None:
    """Stored in akadze.schedules: changing their format would reset every schedule."""
    assert Cron("0 3 * * *").spec == "cron 0 3 * * * tz=UTC"
    assert Cron("0 3 * * *", "Europe/Berlin", day_or=False).spec == \
        "cron 0 3 * * * tz=Europe/Berlin day_or=false"
    assert Every(timedelta(minutes=5)).spec == "every 300s"
    assert Every(0.25).spec == "every 0.25s"
    assert Every(timedelta(days=7)).spec == "every 604800s"


def test_specs_are_stable_and_change_with_the_ticks() -> None:
    assert Cron("0  3 * * *").spec == Cron(" 0 3 * * * ").spec
    assert Cron("0 3 * * *", ZoneInfo("Europe/Berlin")).spec == \
        Cron("0 3 * * *", "Europe/Berlin").spec
    assert Cron("0 3 * * *", timezone=UTC).spec == Cron("0 3 * * *").spec
    assert Every(300).spec == Every(timedelta(minutes=5)).spec == Every(300.0).spec
    assert len({Cron("0 3 * * *").spec, Cron("0 4 * * *").spec,
                Cron("0 3 * * *", "Europe/Berlin").spec,
                Cron("0 3 * * *", day_or=False).spec, Every(300).spec, Every(301).spec}) == 6


def test_as_trigger() -> None:
    assert as_trigger("0 3 * * *").spec == "cron 0 3 * * * tz=UTC"
    every = Every(5)
    assert as_trigger(every) is every

    class Custom:
        spec = "custom"

        def latest(self, at: datetime) -> datetime | None:
            return None

        def next(self, after: datetime) -> datetime:
            return after + timedelta(days=1)

    custom = Custom()
    assert as_trigger(custom) is custom
    with pytest.raises(ValueError, match="trigger"):
        as_trigger(timedelta(minutes=5))  # type: ignore[arg-type]


@pytest.mark.parametrize("trigger", [
    Cron("0 3 * * *", "Europe/Berlin"), Cron("@daily"), Cron("*/15 * * * * 30", day_or=False),
    Cron("0 0 * * *", timezone(timedelta(hours=-2, minutes=-30))), Cron("0 0 * * *", UTC),
    Every(0.5), Every(timedelta(days=2)), Every(timedelta(microseconds=1)), Every(60),
])
def test_a_spec_parses_back_into_the_same_trigger(trigger: Cron | Every) -> None:
    parsed = parse_spec(trigger.spec)
    assert parsed.spec == trigger.spec
    start = utc(2030, 3, 30, 23, 59, 59)
    assert ticks(parsed, start, 5) == ticks(trigger, start, 5)
    assert as_trigger(trigger.spec).spec == trigger.spec


@pytest.mark.parametrize(("spec", "message"), [
    ("every 60", "invalid trigger spec"), ("every -5s", "invalid trigger spec"),
    ("every 0s", "interval must be positive"), ("cron 0 3 * * *", "invalid trigger spec"),
    ("cron 0 3 * * * tz=Mars/Base", "unknown time zone"),
    ("cron 0 99 * * * tz=UTC", "invalid cron expression"), ("hourly", "invalid trigger spec"),
])
def test_a_spec_that_names_no_trigger_is_refused(spec: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        parse_spec(spec)
