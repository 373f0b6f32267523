"""The schedule API: ``remaining_estimate`` and ``is_due`` of crontab, schedule and solar,
against Celery 5.7 on thousands of random cases (one Celery subprocess for all of them), and
what they do without Celery to compare with."""

from __future__ import annotations

import json
import random
import subprocess
import sys
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any
from zoneinfo import ZoneInfo

import pytest

from akadze_compat import Celery
from akadze_compat.exceptions import ImproperlyConfigured
from akadze_compat.schedules import crontab, schedstate, schedule, solar
from tests.compat import differential
from tests.compat.schedule_api_oracle import evaluate
from tests.compat.test_schedules import (
    ZONES,
    _python_value,
    _random_fields,
    _sample_instants,
    _transitions,
)

UTC = timezone.utc
ORACLE = Path(__file__).with_name("schedule_api_oracle.py")
NOWHERE = "postgresql://nobody@127.0.0.1:1/nowhere"


def utc(*parts: int) -> datetime:
    return datetime(*parts, tzinfo=UTC)  # type: ignore[misc]


def _has_ephem() -> bool:
    try:
        import ephem  # noqa: F401
    except ImportError:
        return False
    return True


# --- the cases --------------------------------------------------------------------------------


def _as_case_instant(rng: random.Random, moment: datetime, zone: str) -> dict[str, Any]:
    """``moment`` as the schedule would be handed it: aware in the app's zone, in UTC (both
    kinds), in another zone, or naive (read as UTC)."""
    kind = rng.random()
    if kind < 0.45:
        return {"iso": moment.isoformat(), "zone": zone}
    if kind < 0.6:
        return {"iso": moment.isoformat(), "zone": "utc"}
    if kind < 0.7:
        return {"iso": moment.isoformat(), "zone": "UTC"}
    if kind < 0.85:
        return {"iso": moment.isoformat(), "zone": rng.choice(ZONES)}
    return {"iso": moment.astimezone(UTC).replace(tzinfo=None).isoformat(), "zone": None}


def _later(rng: random.Random, moment: datetime, scale: float) -> datetime:
    """A ``now`` some time around ``moment``: just before, just after, or much later."""
    kind = rng.random()
    if kind < 0.15:
        offset = -rng.uniform(0, scale / 4)
    elif kind < 0.5:
        offset = rng.uniform(0, scale)
    elif kind < 0.8:
        offset = rng.uniform(scale * 0.9, scale * 1.1)
    else:
        offset = rng.uniform(0, scale * 40)
    return moment + timedelta(seconds=round(offset, 6))


def _crontab_cases(rng: random.Random, count: int) -> list[dict[str, Any]]:
    cases: list[dict[str, Any]] = []
    while len(cases) < count:
        near_jumps = rng.random() < 0.4
        fields = _random_fields(rng, near_jumps)
        try:
            crontab(**{name: _python_value(v) for name, v in fields.items()})
        except Exception:
            continue
        spec: dict[str, Any] = {"kind": "crontab", "fields": fields}
        if rng.random() < 0.1 and all(isinstance(v, str) for v in fields.values()):
            spec = {"kind": "crontab", "from_string": " ".join(
                str(fields.get(name, "*")) for name in
                ("minute", "hour", "day_of_month", "month_of_year", "day_of_week"))}
        zone = rng.choice(ZONES[1:] if near_jumps else ZONES)
        deadline = rng.choice([None, None, None, 0, 30, 3600, 86400])
        for last in _sample_instants(rng, ZoneInfo(zone), 2):
            for ask in ("remaining_estimate", "is_due"):
                now = _later(rng, last, rng.choice([60, 3600, 86400, 7 * 86400]))
                cases.append({"schedule": spec, "zone": zone, "deadline": deadline,
                              "ask": ask, "last_run_at": _as_case_instant(rng, last, zone),
                              "now": _as_case_instant(rng, now, zone)})
    return cases


INTERVALS = [0.5, 1, 30, 59.5, 60, 61, 90, 300, 899.5, 3599, 3600, 5400, 7200, 21600,
             86399, 86400, 90000, 2 * 86400, 7 * 86400, 0, -5]


def _interval_cases(rng: random.Random, count: int) -> list[dict[str, Any]]:
    cases: list[dict[str, Any]] = []
    while len(cases) < count:
        seconds = rng.choice(INTERVALS) if rng.random() < 0.7 else round(
            rng.uniform(0.001, 3 * 86400), rng.choice([0, 3, 6]))
        relative = rng.random() < 0.6
        zone = rng.choice(ZONES)
        spec = {"kind": "schedule", "seconds": seconds, "relative": relative}
        for last in _sample_instants(rng, ZoneInfo(zone), 2):
            for ask in ("remaining_estimate", "is_due"):
                now = _later(rng, last, max(abs(seconds), 1))
                cases.append({"schedule": spec, "zone": zone, "ask": ask,
                              "last_run_at": _as_case_instant(rng, last, zone),
                              "now": _as_case_instant(rng, now, zone)})
    return cases


SOLAR_PLACES = [(48.85, 2.35), (-33.87, 151.21), (69.65, 18.96), (78.22, 15.65), (0, 0),
                (-77.85, 166.67), (40.71, -74.0), (64.15, -21.94), (89.9, 0)]


def _solar_cases(rng: random.Random, count: int) -> list[dict[str, Any]]:
    cases: list[dict[str, Any]] = []
    events = sorted(solar.EVENTS)
    while len(cases) < count:
        lat, lon = rng.choice(SOLAR_PLACES)
        spec = {"kind": "solar", "event": rng.choice(events), "lat": lat, "lon": lon}
        zone = rng.choice(ZONES)
        last = utc(2000, 1, 1) + timedelta(seconds=rng.randint(0, 40 * 365 * 86400))
        for ask in ("remaining_estimate", "is_due"):
            now = _later(rng, last, rng.choice([3600, 86400, 2 * 86400]))
            cases.append({"schedule": spec, "zone": zone, "ask": ask,
                          "last_run_at": _as_case_instant(rng, last, zone),
                          "now": _as_case_instant(rng, now, zone)})
    return cases


def _cases() -> dict[str, list[dict[str, Any]]]:
    rng = random.Random(20260517)
    cases = {"crontab": _crontab_cases(rng, 4000), "schedule": _interval_cases(rng, 3000)}
    # Instants right at clock changes, where the wall-clock arithmetic differs most.
    around: list[dict[str, Any]] = []
    for zone in ZONES[1:]:
        for year in rng.sample(range(2000, 2041), 4):
            for jumped in _transitions(zone, year):
                for _ in range(3):
                    last = jumped + timedelta(seconds=rng.randint(-5400, 5400))
                    spec: dict[str, Any] = rng.choice([
                        {"kind": "crontab", "fields": {"minute": rng.choice(
                            ["0", "30", "*/15", "*"]), "hour": rng.choice(["*", "1-3", "2"])}},
                        {"kind": "schedule", "seconds": rng.choice(
                            [60, 900, 1800, 3600, 7200, 86400]), "relative": True},
                    ])
                    for ask in ("remaining_estimate", "is_due"):
                        now = last + timedelta(seconds=rng.randint(-600, 7200))
                        around.append({"schedule": spec, "zone": zone, "ask": ask,
                                       "last_run_at": _as_case_instant(rng, last, zone),
                                       "now": _as_case_instant(rng, now, zone)})
    cases["clock changes"] = around
    if _has_ephem():
        cases["solar"] = _solar_cases(rng, 400)
    return cases


@pytest.fixture(scope="module")
def celery_answers() -> dict[str, Any]:
    python = differential.celery_python()
    if not Path(python).is_file():
        pytest.skip(differential.no_celery_reason(python))
    cases = _cases()
    flat = [case for group in cases.values() for case in group]
    completed = subprocess.run([python, str(ORACLE), "celery"], input=json.dumps({"cases": flat}),
                               capture_output=True, text=True, timeout=300, check=False,
                               cwd=differential.REPOSITORY)
    if "No module named 'celery'" in completed.stderr:
        pytest.skip(f"{python} cannot import celery")
    assert completed.returncode == 0, completed.stderr[-3000:]
    reply = json.loads(completed.stdout)
    assert "oracle_error" not in reply, reply.get("oracle_error")
    if not reply["version"].startswith(differential.CELERY_SERIES):
        pytest.skip(f"Celery {reply['version']}; these tests compare with "
                    f"{differential.CELERY_SERIES}x")
    answers = iter(reply["answers"])
    return {"cases": cases, "ephem": reply["ephem"],
            "answers": {name: [next(answers) for _ in group] for name, group in cases.items()}}


def _compare(celery_answers: dict[str, Any], group: str, minimum: int) -> None:
    cases = celery_answers["cases"][group]
    theirs = celery_answers["answers"][group]
    ours = evaluate("akadze_compat", cases)
    mismatches = [(case, mine, their) for case, mine, their in zip(cases, ours, theirs,
                                                                   strict=True)
                  if mine != their]
    assert not mismatches, f"{len(mismatches)} of {len(cases)} differ; first: {mismatches[:3]}"
    answered = [answer for answer in theirs if not isinstance(answer, dict)]
    assert len(answered) >= minimum, (group, len(answered))
    due = [answer for answer in answered if isinstance(answer, list)]
    if due:  # the cases reach both outcomes
        assert any(answer[0] for answer in due) and not all(answer[0] for answer in due)


def test_crontab_matches_celery(celery_answers: dict[str, Any]) -> None:
    _compare(celery_answers, "crontab", 3900)


def test_interval_schedule_matches_celery(celery_answers: dict[str, Any]) -> None:
    _compare(celery_answers, "schedule", 2500)


def test_clock_changes_match_celery(celery_answers: dict[str, Any]) -> None:
    _compare(celery_answers, "clock changes", 200)


def test_solar_matches_celery(celery_answers: dict[str, Any]) -> None:
    if "solar" not in celery_answers["cases"]:
        pytest.skip("ephem is not installed here (pip install 'akadze[solar]')")
    if not celery_answers["ephem"]:
        pytest.skip("ephem is not installed in Celery's interpreter (celery[solar])")
    _compare(celery_answers, "solar", 390)


# --- without Celery ---------------------------------------------------------------------------


@pytest.fixture
def app() -> Any:
    made = Celery("api", broker=NOWHERE, set_as_current=False, timezone="Europe/Paris")
    yield made
    made.close()


def test_crontab_remaining_and_due(app: Any) -> None:
    now = utc(2024, 6, 3, 6, 10)  # 08:10 in Paris, a Monday
    seven = crontab(minute=0, hour=8, nowfun=lambda: now, app=app)
    assert seven.remaining_estimate(utc(2024, 6, 2, 6, 0)) == timedelta(minutes=-10)
    assert seven.is_due(utc(2024, 6, 2, 6, 0)) == schedstate(True, 86400 - 600)
    assert seven.is_due(utc(2024, 6, 3, 6, 0)) == schedstate(False, 86400 - 600)
    assert isinstance(seven.is_due(now), tuple) and seven.is_due(now).next == 86400 - 600
    # A naive last run is UTC; the app's zone decides the wall clock.
    assert seven.remaining_estimate(datetime(2024, 6, 2, 6, 0)) == timedelta(minutes=-10)
    app.conf.beat_cron_starting_deadline = 300  # missed by more than 5 minutes: not due
    assert seven.is_due(utc(2024, 6, 2, 6, 0)) == schedstate(False, 86400 - 600)


def test_interval_remaining_and_due(app: Any) -> None:
    now = utc(2024, 6, 3, 6, 10, 30)
    every = schedule(timedelta(minutes=5), nowfun=lambda: now, app=app)
    assert every.remaining_estimate(utc(2024, 6, 3, 6, 8)) == timedelta(minutes=2, seconds=30)
    assert every.is_due(utc(2024, 6, 3, 6, 5)) == (True, 300.0)
    assert every.is_due(utc(2024, 6, 3, 6, 8)) == (False, 150.0)
    hourly = schedule(timedelta(hours=1), relative=True, nowfun=lambda: now, app=app)
    assert hourly.remaining_estimate(utc(2024, 6, 3, 5, 30)) == timedelta(minutes=-10,
                                                                           seconds=-30)
    assert hourly.is_due(utc(2024, 6, 3, 5, 30)) == (True, 49 * 60 + 30)


def test_now_is_nowfun_else_the_apps_clock(app: Any) -> None:
    made = crontab(app=app)
    assert made.now().tzinfo == ZoneInfo("Europe/Paris")
    assert abs(made.now() - datetime.now(UTC)) < timedelta(seconds=5)
    assert made.tz == ZoneInfo("Europe/Paris")
    assert made.maybe_make_aware(datetime(2024, 1, 1, 12)) == utc(2024, 1, 1, 12)
    assert made.maybe_make_aware(datetime(2024, 1, 1, 12)).tzinfo == ZoneInfo("Europe/Paris")


@pytest.mark.skipif(not _has_ephem(), reason="ephem is not installed (pip install ephem)")
def test_solar_remaining_and_due(app: Any) -> None:
    now = utc(2024, 6, 1, 12)
    sunset = solar("sunset", 48.85, 2.35, nowfun=lambda: now, app=app)
    remaining = sunset.remaining_estimate(utc(2024, 6, 1, 6))
    assert timedelta(hours=7) < remaining < timedelta(hours=8)  # about 21:50 in Paris
    assert sunset.is_due(utc(2024, 6, 1, 6)) == (False, remaining.total_seconds())
    due, wait = sunset.is_due(utc(2024, 5, 31, 12))
    assert due and wait == pytest.approx(remaining.total_seconds(), abs=0.1)  # ephem iterates
    assert repr(sunset) == "<solar: sunset at latitude 48.85, longitude: 2.35>"


def test_solar_without_ephem_fails_with_one_clear_line() -> None:
    """Built and checked without ephem; computing says which package to install."""
    script = (
        "import sys; sys.modules['ephem'] = None\n"
        "from datetime import datetime, timezone\n"
        "from akadze_compat.schedules import solar\n"
        "made = solar('sunrise', 48.85, 2.35)\n"
        "for call in (lambda: made.is_due(datetime.now(timezone.utc)), made.trigger):\n"
        "    try:\n"
        "        call()\n"
        "    except Exception as exc:\n"
        "        print(type(exc).__name__, exc)\n")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          cwd=differential.REPOSITORY, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines == [f"ImproperlyConfigured {solar_message()}"] * 2


def solar_message() -> str:
    from akadze_compat.schedules import EPHEM_MISSING

    assert "\n" not in EPHEM_MISSING and "ephem" in EPHEM_MISSING
    assert issubclass(ImproperlyConfigured, Exception)
    return EPHEM_MISSING
