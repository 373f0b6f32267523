"""Answer crontab questions with real Celery, for ``test_schedules.py``'s differential tests.

Run under Celery's interpreter: reads one JSON document on stdin, prints one on stdout.
Field values travel as JSON: a string, an int, a float, null, or ``{"set": [...]}`` /
``{"list": [...]}`` for those Python types.

"The next run after instant X" is asked the way beat asks it: ``remaining_delta(X)`` is
what ``remaining_estimate(last_run_at=X)`` subtracts ``now`` from, i.e. it gives the date
beat will run the entry next when it last ran at X; ``last_run_at + delta`` is that date
(``last_run_at`` comes back converted to the schedule's zone), converted to UTC. That is
Celery's answer for any X, including an X that is not a tick. ``orbit`` asks instead what
beat does while running continuously: start three hours earlier and follow run after run.
"""

from __future__ import annotations

import json
import sys
import traceback
from datetime import datetime, timedelta, timezone
from typing import Any

import celery
from celery import Celery
from celery.schedules import crontab, schedule

_apps: dict[str, Celery] = {}


def _app(zone: str) -> Celery:
    if zone not in _apps:
        app = Celery(set_as_current=False)
        app.conf.timezone = zone
        app.conf.enable_utc = True
        _apps[zone] = app
    return _apps[zone]


def _value(value: Any) -> Any:
    if isinstance(value, dict):
        return set(value["set"]) if "set" in value else list(value["list"])
    return value


def _build(case: dict[str, Any], app: Celery | None = None) -> crontab:
    if "from_string" in case:
        made = crontab.from_string(case["from_string"])
        made.app = app
        return made
    return crontab(**{name: _value(v) for name, v in case["fields"].items()}, app=app)


def _construct(case: dict[str, Any]) -> dict[str, Any]:
    try:
        made = _build(case)
    except Exception as exc:
        return {"error": type(exc).__name__, "message": str(exc)}
    return {"repr": repr(made), **{name: sorted(getattr(made, name)) for name in (
        "minute", "hour", "day_of_week", "day_of_month", "month_of_year")}}


def _next_after(made: crontab, zone: str, after: datetime) -> datetime:
    last_run_at, delta, _now = made.remaining_delta(after, tz=zone)
    return (last_run_at + delta).astimezone(timezone.utc)


def _next(case: dict[str, Any]) -> dict[str, Any]:
    after = datetime.fromisoformat(case["after"])
    made = _build(case, _app(case["zone"]))
    made.nowfun = lambda: after
    try:
        answer = {"next": _next_after(made, case["zone"], after).isoformat()}
        if case.get("orbit"):
            moment = after - timedelta(hours=3)
            for _ in range(2000):
                moment = _next_after(made, case["zone"], moment)
                if moment > after:
                    break
            answer["orbit"] = moment.isoformat()
        return answer
    except Exception as exc:
        return {"error": type(exc).__name__, "message": str(exc)}


def _interval(seconds: float) -> dict[str, Any]:
    made = schedule(seconds)
    return {"repr": repr(made), "human": made.human_seconds, "seconds": made.seconds,
            "equals_timedelta": made == timedelta(seconds=seconds)}


def main() -> None:
    request = json.load(sys.stdin)
    try:
        answer = {
            "version": celery.__version__,
            "construct": [_construct(case) for case in request.get("construct", [])],
            "next": [_next(case) for case in request.get("next", [])],
            "intervals": [_interval(seconds) for seconds in request.get("intervals", [])],
        }
    except Exception:
        answer = {"oracle_error": traceback.format_exc()}
    json.dump(answer, sys.stdout)


if __name__ == "__main__":
    main()
