"""Ask ``remaining_estimate`` and ``is_due`` of crontab, schedule and solar, in a batch.

The same code runs under Celery's interpreter (``python schedule_api_oracle.py celery``: a
JSON request on stdin, the answers on stdout) and in-process for akadze_compat
(:func:`evaluate`), so both answer the very same cases.

A case names the schedule (``crontab`` fields or ``from_string``; ``schedule`` seconds and
``relative``; ``solar`` event, lat, lon), the app's ``zone`` and
``beat_cron_starting_deadline``, ``now`` (what ``nowfun`` returns) and ``last_run_at``. An
instant is ``{"iso": text, "zone": name | null}``: the ISO text, converted to that zone when
one is named (``"utc"`` is ``datetime.timezone.utc``), else as written (naive if it has no
offset). An answer is the remaining time in microseconds, or ``[due, next]``, or the error's
type name.
"""

from __future__ import annotations

import importlib
import json
import sys
import traceback
from datetime import datetime, timedelta, timezone
from typing import Any
from zoneinfo import ZoneInfo


def _instant(value: dict[str, Any]) -> datetime:
    moment = datetime.fromisoformat(value["iso"])
    zone = value.get("zone")
    if zone == "utc":
        return moment.astimezone(timezone.utc)
    if zone:
        return moment.astimezone(ZoneInfo(zone))
    return moment


def _field(value: Any) -> Any:
    if isinstance(value, dict):
        return set(value["set"]) if "set" in value else list(value["list"])
    return value


def _micros(delta: timedelta) -> int:
    return (delta.days * 86400 + delta.seconds) * 1_000_000 + delta.microseconds


class Evaluator:
    """Builds apps (one per zone and deadline) and schedules from one package."""

    def __init__(self, package: str) -> None:
        self.package = package
        self.schedules = importlib.import_module(f"{package}.schedules")
        self.celery_class = importlib.import_module(package).Celery
        self.apps: dict[tuple[str, Any], Any] = {}

    def app(self, zone: str, deadline: Any) -> Any:
        key = (zone, deadline)
        if key not in self.apps:
            options = {} if self.package == "celery" else {
                "broker": "postgresql://nobody@127.0.0.1:1/nowhere"}
            app = self.celery_class("oracle", set_as_current=False, **options)
            app.conf.timezone = zone
            app.conf.enable_utc = True
            app.conf.beat_cron_starting_deadline = deadline
            self.apps[key] = app
        return self.apps[key]

    def build(self, case: dict[str, Any]) -> Any:
        app = self.app(case["zone"], case.get("deadline"))
        now = _instant(case["now"])
        options = {"nowfun": lambda: now, "app": app}
        spec = case["schedule"]
        kind = spec["kind"]
        if kind == "crontab":
            if "from_string" in spec:
                made = self.schedules.crontab.from_string(spec["from_string"])
                made.nowfun, made.app = now_function(now), app
                return made
            fields = {name: _field(value) for name, value in spec["fields"].items()}
            return self.schedules.crontab(**fields, **options)
        if kind == "schedule":
            return self.schedules.schedule(spec["seconds"], spec.get("relative", False),
                                           **options)
        return self.schedules.solar(spec["event"], spec["lat"], spec["lon"], **options)

    def answer(self, case: dict[str, Any]) -> Any:
        try:
            made = self.build(case)
            last_run_at = _instant(case["last_run_at"])
            if case["ask"] == "remaining_estimate":
                return _micros(made.remaining_estimate(last_run_at))
            due, wait = made.is_due(last_run_at)
            return [bool(due), float(wait)]
        except Exception as exc:
            return {"error": type(exc).__name__}


def now_function(now: datetime) -> Any:
    return lambda: now


def evaluate(package: str, cases: list[dict[str, Any]]) -> list[Any]:
    """The answers of ``package`` (``celery`` or ``akadze_compat``) to ``cases``."""
    evaluator = Evaluator(package)
    return [evaluator.answer(case) for case in cases]


def main() -> None:
    package = sys.argv[1] if len(sys.argv) > 1 else "celery"
    request = json.load(sys.stdin)
    try:
        version = importlib.import_module(package).__version__ if package == "celery" else ""
        try:
            importlib.import_module("ephem")
            ephem = True
        except ImportError:
            ephem = False
        answer: dict[str, Any] = {"version": version, "ephem": ephem,
                                  "answers": evaluate(package, request["cases"])}
    except Exception:
        answer = {"oracle_error": traceback.format_exc()}
    json.dump(answer, sys.stdout)


if __name__ == "__main__":
    main()
