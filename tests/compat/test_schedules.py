"""akadze_compat.schedules: Celery's crontab/schedule parsing and semantics, their triggers,
beat entries, and a differential run against real Celery's ``crontab``."""

from __future__ import annotations

import functools
import json
import random
import subprocess
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any
from zoneinfo import ZoneInfo

import pytest

from akadze_compat.schedules import (
    ParseException,
    crontab,
    crontab_parser,
    maybe_schedule,
    schedule,
    solar,
)
from akadze_core import Every
from tests.compat import differential

UTC = timezone.utc
ORACLE = Path(__file__).with_name("crontab_oracle.py")
FIELDS = ("minute", "hour", "day_of_week", "day_of_month", "month_of_year")


def utc(*parts: int) -> datetime:
    return datetime(*parts, tzinfo=UTC)  # type: ignore[misc]


# --- parsing ------------------------------------------------------------------------------


def test_day_of_week_names_numbers_and_wrapping_ranges() -> None:
    assert crontab(day_of_week="mon-fri").day_of_week == {1, 2, 3, 4, 5}
    assert crontab(day_of_week="sun").day_of_week == {0}
    assert crontab(day_of_week="sat-sun").day_of_week == {6, 0}
    assert crontab(day_of_week="fri-mon").day_of_week == {5, 6, 0, 1}
    assert crontab(day_of_week="Thursday,SAT").day_of_week == {4, 6}
    assert crontab(day_of_week="*/2").day_of_week == {0, 2, 4, 6}
    with pytest.raises(ValueError, match="Invalid end range: 7 > 6"):
        crontab(day_of_week="7")  # unlike Vixie cron, 7 is not Sunday
    with pytest.raises(ValueError, match="Invalid crontab pattern"):
        crontab(day_of_week=7)


def test_steps_lists_ranges_and_names_in_other_fields() -> None:
    assert crontab(minute="*/15").minute == {0, 15, 30, 45}
    assert crontab(minute="0-30/10,59").minute == {0, 10, 20, 30, 59}
    assert crontab(minute="50-10/7").minute == {50, 57, 4}  # the step walks the wrapped range
    assert crontab(hour="0,8-17/2").hour == {0, 8, 10, 12, 14, 16}
    assert crontab(day_of_month="*/10").day_of_month == {1, 11, 21, 31}
    assert crontab(month_of_year="nov-feb").month_of_year == {11, 12, 1, 2}
    assert crontab(month_of_year="jan,JULY").month_of_year == {1, 7}
    assert crontab(minute={5, 10}).minute == {5, 10}
    assert crontab(minute=range(0, 60, 20)).minute == {0, 20, 40}
    assert crontab(minute="1-5/2/9").minute == {1, 3, 5}  # Celery ignores what follows


def test_a_single_field_leaves_the_others_at_every_value() -> None:
    seven = crontab(hour=7)
    assert seven.hour == {7}
    assert seven.minute == set(range(60))
    assert seven.day_of_month == set(range(1, 32))
    assert seven.trigger().next(utc(2024, 5, 1, 7, 10, 30)) == utc(2024, 5, 1, 7, 11)
    assert seven.trigger().next(utc(2024, 5, 1, 7, 59)) == utc(2024, 5, 2, 7, 0)


@pytest.mark.parametrize(("fields", "error", "message"), [
    ({"minute": 60}, ValueError, "Valid range is 0-59. '60' was found"),
    ({"minute": "60"}, ValueError, "Invalid end range: 60 > 59."),
    ({"day_of_month": "0"}, ValueError, "Invalid beginning range: 0 < 1."),
    ({"month_of_year": "sun"}, ValueError, "Invalid beginning range: 0 < 1."),
    ({"minute": "*/0"}, ValueError, "slice step cannot be zero"),
    ({"minute": "1-5/x"}, ValueError, "invalid literal for int"),
    ({"minute": "foo"}, ValueError, "Invalid weekday literal 'foo'."),
    ({"minute": "*/"}, ParseException, "empty filter"),
    ({"minute": "99-5/"}, ParseException, "empty filter"),
    ({"minute": "1,,2"}, ParseException, "empty part"),
    ({"minute": "-1"}, ParseException, "negative numbers not supported"),
    ({"hour": None}, TypeError, "int, str, or an iterable type"),
    ({"hour": 1.5}, TypeError, "int, str, or an iterable type"),
    ({"day_of_month": 30, "month_of_year": 2}, ValueError, "never occurs in"),
    ({"minute": [1.5]}, TypeError, "must be integers"),  # Celery accepts it, then fails later
    ({"surprise": 1}, TypeError, "unexpected keyword argument 'surprise'"),
])
def test_invalid_fields(fields: dict[str, Any], error: type[Exception], message: str) -> None:
    with pytest.raises(error, match=message.replace(".", r"\.").replace("*", r"\*")):
        crontab(**fields)


def test_parse_exception_is_not_a_value_error_as_in_celery() -> None:
    assert not issubclass(ParseException, ValueError)
    assert crontab_parser.ParseException is ParseException
    assert crontab_parser(31, 1).parse("*/3") == set(range(1, 32, 3))


def test_leap_day_is_valid_and_fires_in_leap_years_only() -> None:
    leap = crontab(minute=0, hour=0, day_of_month=29, month_of_year=2).trigger()
    assert leap.next(utc(2024, 3, 1)) == utc(2028, 2, 29)
    assert leap.next(utc(2096, 3, 1)) == utc(2104, 2, 29)  # 2100 is not a leap year


def test_from_string_orig_repr_and_equality() -> None:
    made = crontab.from_string("*/5 7 1 jan mon-fri")
    assert (made.minute, made.hour, made.day_of_month) == (set(range(0, 60, 5)), {7}, {1})
    assert (made.month_of_year, made.day_of_week) == ({1}, {1, 2, 3, 4, 5})
    assert (made._orig_minute, made._orig_day_of_week) == ("*/5", "mon-fri")
    assert repr(made) == "<crontab: */5 7 1 jan mon-fri (m/h/dM/MY/d)>"
    assert made == crontab(minute=range(0, 60, 5), hour="7", day_of_week="1-5",
                           day_of_month=1, month_of_year="1")
    assert made != crontab.from_string("*/5 7 1 jan *")
    assert crontab(nowfun=datetime.now) != crontab()
    for bad in ("* * * *", "*  * * * *", "0 7 * * * *"):
        with pytest.raises(ValueError, match="values to unpack"):
            crontab.from_string(bad)


def test_expression_and_spec_are_stable_text() -> None:
    made = crontab(minute="0,15,30,45", hour="9-17", day_of_week="mon-fri")
    assert made.expression == "0,15,30,45 9-17 * * 1-5"
    assert made.trigger("Europe/Paris").spec == (
        "celery-crontab 0,15,30,45 9-17 * * 1-5 tz=Europe/Paris")
    assert made.trigger(timezone.utc).spec.endswith("tz=UTC")


def test_triggers_refuse_what_cannot_run() -> None:
    with pytest.raises(ValueError, match="unknown time zone 'Mars/Olympus'"):
        crontab().trigger("Mars/Olympus")
    with pytest.raises(ValueError, match="never runs: its minute set is empty"):
        crontab(minute=[]).trigger()  # Celery accepts it, then fails when beat computes


# --- crontab ticks -------------------------------------------------------------------------


def test_day_of_month_and_day_of_week_must_both_match() -> None:
    friday_13 = crontab(minute=0, hour=0, day_of_month=13, day_of_week="fri").trigger()
    assert friday_13.next(utc(2024, 1, 1)) == utc(2024, 9, 13)
    assert friday_13.latest(utc(2024, 9, 12)) == utc(2023, 10, 13)


def test_the_app_zone_decides_the_wall_clock() -> None:
    seven = crontab(minute=0, hour=7).trigger("America/New_York")
    assert seven.next(utc(2024, 7, 1)) == utc(2024, 7, 1, 11)  # EDT
    assert seven.next(utc(2024, 12, 1)) == utc(2024, 12, 1, 12)  # EST


def test_a_time_skipped_by_spring_forward_fires_once_an_hour_late() -> None:
    at_230 = crontab(minute=30, hour=2).trigger("Europe/Paris")
    assert at_230.next(utc(2024, 3, 30, 23)) == utc(2024, 3, 31, 1, 30)  # 03:30 CEST
    assert at_230.latest(utc(2024, 3, 31, 1, 29)) == utc(2024, 3, 30, 1, 30)
    # Beat runs the first skipped tick and goes on from there: one run, not six.
    every_10 = crontab(minute="*/10", hour=2).trigger("Europe/Paris")
    assert every_10.next(utc(2024, 3, 30, 23)) == utc(2024, 3, 31, 1, 0)  # 03:00 CEST
    assert every_10.next(utc(2024, 3, 31, 1, 0)) == utc(2024, 4, 1, 0, 0)
    assert every_10.latest(utc(2024, 3, 31, 1, 55)) == utc(2024, 3, 31, 1, 0)


def test_a_repeated_time_fires_on_its_first_occurrence_only() -> None:
    at_230 = crontab(minute=30, hour=2).trigger("Europe/Paris")
    assert at_230.next(utc(2024, 10, 27)) == utc(2024, 10, 27, 0, 30)  # 02:30 CEST
    assert at_230.next(utc(2024, 10, 27, 0, 30)) == utc(2024, 10, 28, 1, 30)
    hourly = crontab(minute=30).trigger("Europe/Paris")
    assert hourly.next(utc(2024, 10, 27, 0, 30)) == utc(2024, 10, 27, 2, 30)
    assert hourly.latest(utc(2024, 10, 27, 1, 45)) == utc(2024, 10, 27, 0, 30)


def _sample_instants(rng: random.Random, zone: ZoneInfo, count: int) -> list[datetime]:
    instants = []
    for _ in range(count):
        kind = rng.random()
        if kind < 0.4:
            base = _transitions(zone.key, rng.randint(2000, 2040)) or [utc(2024, 1, 1)]
            moment = rng.choice(base) + timedelta(seconds=rng.randint(-3 * 3600, 3 * 3600))
        elif kind < 0.6:
            month = rng.randint(1, 12)
            start = datetime(rng.randint(2000, 2040), month, 1, tzinfo=zone)
            moment = start + timedelta(minutes=rng.randint(-150, 90))
        elif kind < 0.7:
            year, day = rng.choice([(2024, 28), (2024, 29), (2100, 28), (2000, 29), (2023, 28)])
            moment = datetime(year, 2, day, tzinfo=zone) + timedelta(minutes=rng.randint(0, 2880))
        else:
            moment = utc(2000, 1, 1) + timedelta(seconds=rng.randint(0, 40 * 365 * 86400))
        if rng.random() < 0.5:
            moment += timedelta(seconds=rng.randint(0, 59), microseconds=rng.randint(0, 999999))
        instants.append(moment.astimezone(UTC))
    return instants


@pytest.mark.parametrize("zone", ["Europe/Paris", "Australia/Lord_Howe", "America/Santiago"])
def test_latest_and_next_describe_one_set_of_ticks(zone: str) -> None:
    rng = random.Random(zone)
    specs = ["30 2 * * *", "*/10 1-3 * * *", "0,45 * * * *", "15 0,2,3 * * sun", "* 2 * * *",
             "0 0 * * *", "59 23 31 * *"]
    for text in specs:
        trigger = crontab.from_string(text).trigger(zone)
        for moment in _sample_instants(rng, ZoneInfo(zone), 30):
            following, previous = trigger.next(moment), trigger.latest(moment)
            assert previous is not None
            assert previous <= moment < following, (text, moment)
            assert trigger.next(previous) == following, (text, moment)
            assert trigger.latest(following) == following
            assert trigger.latest(following - timedelta(microseconds=1)) == previous


# --- interval schedules --------------------------------------------------------------------


def test_interval_schedule_repr_equality_and_trigger() -> None:
    assert repr(schedule(60)) == "<freq: 1.00 minute>"
    assert repr(schedule(timedelta(hours=1.5))) == "<freq: 1.50 hours>"
    assert schedule(0.001).human_seconds == "now"
    assert schedule(30) == schedule(timedelta(seconds=30)) == timedelta(seconds=30)
    trigger = schedule(300).trigger()
    assert isinstance(trigger, Every)
    assert trigger.next(utc(2024, 1, 1, 10, 7)) == utc(2024, 1, 1, 10, 10)
    for bad in (0, -5, None):
        with pytest.raises(ValueError, match="positive"):
            schedule(bad).trigger()


@pytest.mark.parametrize(("interval", "zone", "spec"), [
    (timedelta(hours=1), "Asia/Kolkata", "celery-crontab 0 * * * * tz=Asia/Kolkata"),
    (timedelta(minutes=90), "UTC", "celery-crontab 0 * * * * tz=UTC"),  # rounded to the hour
    (timedelta(hours=6), "Europe/Paris", "celery-crontab 0 0,6,12,18 * * * tz=Europe/Paris"),
    (timedelta(minutes=15, seconds=20), "UTC", "celery-crontab 0,15,30,45 * * * * tz=UTC"),
    (timedelta(days=1, hours=5), "Europe/Paris", "celery-crontab 0 0 * * * tz=Europe/Paris"),
    (timedelta(minutes=7), "UTC", "every 420s"),
    (timedelta(days=2), "UTC", "every 172800s"),
    (timedelta(seconds=30), "UTC", "every 30s"),
])
def test_relative_schedules_align_to_the_clock(interval: timedelta, zone: str,
                                                spec: str) -> None:
    assert schedule(interval, relative=True).trigger(zone).spec == spec


def test_maybe_schedule() -> None:
    assert maybe_schedule(None) is None
    assert maybe_schedule(10) == schedule(10)
    assert maybe_schedule(timedelta(minutes=1), relative=True).relative is True
    made = crontab()
    assert maybe_schedule(made, app="app") is made and made.app == "app"


def test_solar_is_checked_like_celery() -> None:
    sunrise = solar("sunrise", 48.85, 2.35)
    assert (sunrise.event, sunrise.lat, sunrise.lon) == ("sunrise", 48.85, 2.35)
    assert (sunrise.method, sunrise.use_center) == ("next_rising", False)
    with pytest.raises(ValueError, match="event"):
        solar("teatime", 0, 0)
    with pytest.raises(ValueError, match="latitude"):
        solar("sunset", 91, 0)
    with pytest.raises(ValueError, match="longitude"):
        solar("sunset", 0, -181)


def test_the_module_exports_celerys_names() -> None:
    import akadze_compat.schedules as module

    for name in ("ParseException", "schedule", "crontab", "crontab_parser", "maybe_schedule",
                 "solar", "BaseSchedule"):
        assert name in module.__all__ and hasattr(module, name)
    assert all(issubclass(cls, module.BaseSchedule) for cls in (schedule, crontab, solar))


def test_the_base_schedule_leaves_polling_to_subclasses() -> None:
    from akadze_compat.schedules import BaseSchedule

    with pytest.raises(NotImplementedError):
        BaseSchedule().is_due(utc(2024, 1, 1))
    with pytest.raises(NotImplementedError):
        BaseSchedule().remaining_estimate(utc(2024, 1, 1))


# --- differential against real Celery ------------------------------------------------------


@functools.cache
def _transitions(zone: str, year: int) -> list[datetime]:
    """The instants ``zone`` changes its UTC offset in ``year``."""
    tz = ZoneInfo(zone)
    found = []
    day = utc(year, 1, 1)
    while day.year == year:
        following = day + timedelta(days=1)
        if day.astimezone(tz).utcoffset() != following.astimezone(tz).utcoffset():
            low, high = day, following
            while high - low > timedelta(seconds=1):
                middle = low + (high - low) / 2
                same = middle.astimezone(tz).utcoffset() == low.astimezone(tz).utcoffset()
                low, high = (middle, high) if same else (low, middle)
            found.append(high.replace(microsecond=0))
        day = following
    return found


def _anomalous(zone: str, after: datetime) -> bool:
    """Is ``after`` in a repeated hour's second pass, or before a skipped tick fired late?

    There Celery's remaining_delta answers as if beat had just started (re-running a tick,
    or never running the late one); the triggers follow beat's continuous run instead.
    """
    tz = ZoneInfo(zone)
    local = after.astimezone(tz)
    if local.fold:
        return True
    offset = local.utcoffset()
    assert offset is not None
    jump = offset - (after - timedelta(hours=3)).astimezone(tz).utcoffset()  # type: ignore[operator]
    return jump > timedelta(0) and (after - jump).astimezone(tz).utcoffset() != offset


def _python_value(value: Any) -> Any:
    if isinstance(value, dict):
        return set(value["set"]) if "set" in value else list(value["list"])
    return value


def _ours(case: dict[str, Any]) -> crontab:
    if "from_string" in case:
        return crontab.from_string(case["from_string"])
    return crontab(**{name: _python_value(v) for name, v in case["fields"].items()})


def _construct(case: dict[str, Any]) -> dict[str, Any]:
    try:
        made = _ours(case)
    except Exception as exc:
        return {"error": type(exc).__name__, "message": str(exc)}
    return {"repr": repr(made), **{name: sorted(getattr(made, name)) for name in FIELDS}}


DAY_NAMES = ["sun", "mon", "tue", "wed", "thu", "fri", "sat", "Monday", "FRIDAY"]
MONTH_NAMES = ["jan", "feb", "mar", "jun", "sep", "nov", "dec", "January", "AUG"]
LIMITS = {"minute": (0, 59, None), "hour": (0, 23, None), "day_of_week": (0, 6, DAY_NAMES),
          "day_of_month": (1, 31, None), "month_of_year": (1, 12, MONTH_NAMES)}


def _random_part(rng: random.Random, low: int, high: int, names: list[str] | None) -> str:
    kind = rng.random()
    first, last = rng.randint(low, high), rng.randint(low, high)  # last < first wraps
    if names and kind < 0.3:
        if rng.random() < 0.5:
            return rng.choice(names)
        return f"{rng.choice(names)}-{rng.choice(names)}"
    if kind < 0.45:
        return str(first)
    if kind < 0.7:
        return f"{first}-{last}"
    if kind < 0.85:
        return f"{first}-{last}/{rng.randint(1, 7)}"
    return f"*/{rng.randint(1, max(1, (high - low) // 2))}"


def _random_field(rng: random.Random, name: str, star: float) -> Any:
    low, high, names = LIMITS[name]
    kind = rng.random()
    if kind < star:
        return "*"
    if kind < star + 0.1:
        return rng.randint(low, high)
    if kind < star + 0.2:
        values = rng.sample(range(low, high + 1), rng.randint(1, 4))
        return {"set": sorted(values)} if rng.random() < 0.5 else {"list": values}
    return ",".join(_random_part(rng, low, high, names) for _ in range(rng.randint(1, 3)))


def _random_fields(rng: random.Random, near_jumps: bool) -> dict[str, Any]:
    stars = {"minute": 0.15, "hour": 0.2, "day_of_week": 0.6, "day_of_month": 0.6,
             "month_of_year": 0.7}
    fields = {name: _random_field(rng, name, star) for name, star in stars.items()}
    if near_jumps:  # hours around the usual clock changes, so that ticks meet them
        fields["hour"] = rng.choice(["2", "1-3", "*", "2,3", "0-4/2", "3", "0", "23,0,1"])
        if rng.random() < 0.5:
            fields["minute"] = rng.choice(["30", "*/20", "15,45", "0", "*", "*/7", "59"])
    return {name: value for name, value in fields.items() if value != "*"}


INVALID_CASES: list[dict[str, Any]] = [{"fields": fields} for fields in [
    {"minute": 60}, {"minute": "60"}, {"minute": "*/0"}, {"minute": "*/"}, {"minute": "1-5/"},
    {"minute": "99-5/"}, {"minute": "99-5/x"}, {"minute": "1-5/x"}, {"minute": "1-5/0"},
    {"minute": "-1"}, {"minute": "-5-10"}, {"minute": "foo"}, {"minute": ""},
    {"minute": "1,,2"}, {"minute": "**"}, {"minute": "*5"}, {"minute": "5-"},
    {"hour": "*-5"}, {"hour": "5-*"}, {"hour": 24}, {"hour": None}, {"hour": 1.5},
    {"day_of_week": 7}, {"day_of_week": "7"}, {"day_of_week": "0-7"}, {"day_of_week": "xyz"},
    {"month_of_year": "sun"}, {"month_of_year": 13}, {"month_of_year": "0"},
    {"day_of_month": 0}, {"day_of_month": 32}, {"day_of_month": "31", "month_of_year": "feb,apr"},
    {"day_of_month": 30, "month_of_year": 2}, {"day_of_month": "30-31", "month_of_year": "2"},
    {"minute": {"list": [0, 60]}}, {"minute": {"set": [-1]}}, {"surprise": 1},
]] + [{"from_string": text} for text in ["* * * *", "*  * * * *", "0 7 * * * *", ""]]

ODD_VALID_CASES: list[dict[str, Any]] = [{"fields": fields} for fields in [
    {"minute": "1-5/2/9"}, {"minute": "5-1"}, {"minute": "50-10/7"}, {"minute": " 5"},
    {"minute": "1_0"}, {"minute": "\u0663"}, {"minute": "*\n"}, {"minute": "monday"},
    {"minute": "mon-fri"}, {"day_of_week": "MON-Fri"}, {"day_of_week": "jan"},
    {"day_of_week": "sat-sun"}, {"day_of_week": "fri-tue/2"}, {"month_of_year": "dec-feb"},
    {"day_of_month": 29, "month_of_year": 2}, {"day_of_month": "31", "month_of_year": "2-3"},
    {"hour": 0, "minute": 0, "day_of_week": 0}, {"minute": {"list": []}},
]] + [{"from_string": text} for text in ["0 7 * * *", "*/5 9-17 * * mon-fri", "0 0 1 jan *",
                                          "30 3 29 2 *", "0 12 13 * fri"]]

ZONES = ["UTC", "Europe/Paris", "America/New_York", "Australia/Sydney", "Australia/Lord_Howe",
         "America/Santiago", "Asia/Kolkata"]
INTERVALS = [0, 0.004, 0.5, 1, 59.999, 60, 90, 3600, 5400, 86400, 2.5 * 86400, -5]


def _next_cases() -> list[dict[str, Any]]:
    rng = random.Random(20240229)
    cases = []
    while len(cases) < 1600:
        near_jumps = rng.random() < 0.4
        fields = _random_fields(rng, near_jumps)
        try:
            crontab(**{name: _python_value(v) for name, v in fields.items()})
        except (ValueError, TypeError, ParseException):
            continue  # the construction differential compares invalid specs
        zone = rng.choice(ZONES[1:] if near_jumps else ZONES)
        for after in _sample_instants(rng, ZoneInfo(zone), 4):
            cases.append({"fields": fields, "zone": zone, "after": after.isoformat(),
                          "orbit": _anomalous(zone, after)})
    # Instants just after a clock jumps forward, where a skipped tick may still fire late.
    for zone in ZONES[1:]:
        for year in rng.sample(range(2000, 2041), 8):
            for jumped in _transitions(zone, year):
                # Every day (or Sundays, when clocks change), often in the hour the clock
                # skips or repeats, so that the change meets ticks.
                before = (jumped - timedelta(minutes=1)).astimezone(ZoneInfo(zone)).hour
                hours = [str(before), str((before + 1) % 24), "1-3", "*", "0-4/2", "23,0,1"]
                fields = {"hour": rng.choice(hours[:2] if rng.random() < 0.6 else hours),
                          "minute": rng.choice(["30", "15,45", "10-50/10", "59", "*/20", "*"]
                                               [:4 if rng.random() < 0.7 else 6]),
                          **({"day_of_week": "sun"} if rng.random() < 0.3 else {})}
                after = jumped + timedelta(seconds=rng.randint(-1200, 2400))
                cases.append({"fields": fields, "zone": zone, "after": after.isoformat(),
                              "orbit": _anomalous(zone, after)})
    return cases


def _celery_answers(request: dict[str, Any]) -> dict[str, Any]:
    python = differential.celery_python()
    if not Path(python).is_file():
        pytest.skip(differential.no_celery_reason(python))
    completed = subprocess.run([python, str(ORACLE)], input=json.dumps(request),
                               capture_output=True, text=True, timeout=120, check=False,
                               cwd=differential.REPOSITORY)
    if "No module named 'celery'" in completed.stderr:
        pytest.skip(f"{python} cannot import celery")
    assert completed.returncode == 0, completed.stderr[-3000:]
    answers: dict[str, Any] = json.loads(completed.stdout)
    assert "oracle_error" not in answers, answers.get("oracle_error")
    if not answers["version"].startswith(differential.CELERY_SERIES):
        pytest.skip(f"Celery {answers['version']}; these tests compare with "
                    f"{differential.CELERY_SERIES}x")
    return answers


@pytest.fixture(scope="module")
def celery_answers() -> dict[str, Any]:
    if not Path(differential.celery_python()).is_file():  # before building the cases
        pytest.skip(differential.no_celery_reason(differential.celery_python()))
    rng = random.Random(7)
    generated = [{"fields": _random_fields(rng, False)} for _ in range(300)]
    request = {"construct": INVALID_CASES + ODD_VALID_CASES + generated,
               "next": _next_cases(), "intervals": INTERVALS}
    return {"request": request, "answers": _celery_answers(request)}


def test_construction_matches_celery(celery_answers: dict[str, Any]) -> None:
    request, answers = celery_answers["request"], celery_answers["answers"]
    for case, theirs in zip(request["construct"], answers["construct"], strict=True):
        assert _construct(case) == theirs, case


def test_next_run_matches_celery(celery_answers: dict[str, Any]) -> None:
    request, answers = celery_answers["request"], celery_answers["answers"]
    compared = {"plain": 0, "orbit": 0}
    for case, theirs in zip(request["next"], answers["next"], strict=True):
        assert "error" not in theirs, (case, theirs)
        after = datetime.fromisoformat(case["after"])
        ours = _ours(case).trigger(case["zone"]).next(after).isoformat()
        if case["orbit"]:
            assert ours == theirs["orbit"], (case, theirs)
            compared["orbit"] += 1
        else:
            assert datetime.fromisoformat(theirs["next"]) > after, (case, theirs)
            assert ours == theirs["next"], (case, theirs)
            compared["plain"] += 1
    assert compared["plain"] > 1000 and compared["orbit"] > 30, compared


def test_interval_reprs_match_celery(celery_answers: dict[str, Any]) -> None:
    for seconds, theirs in zip(INTERVALS, celery_answers["answers"]["intervals"], strict=True):
        made = schedule(seconds)
        assert {"repr": repr(made), "human": made.human_seconds, "seconds": made.seconds,
                "equals_timedelta": made == timedelta(seconds=seconds)} == theirs
