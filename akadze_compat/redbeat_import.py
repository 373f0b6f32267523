"""RedBeat's entries, imported once into akadze's runtime schedules (``akadze-compat
import-redbeat``).

celery-redbeat keeps each entry in Redis: a hash ``<prefix><name>`` whose ``definition``
field is the JSON of ``name``, ``task``, ``args``, ``kwargs``, ``options``, ``schedule`` and
``enabled`` (schedules and datetimes as ``{"__type__": ...}`` objects), listed in the sorted
set ``<prefix>:schedule``; the entries it made from ``beat_schedule`` are named in the set
``<prefix>:statics``. akadze schedules live in Postgres, where every worker reads them and one
transaction decides each tick, so the entries are copied once rather than read in Redis at
every tick: a second store with its own lock and clock is what the move leaves behind.

Imported: the entries added at run time (``RedBeatSchedulerEntry(...).save()``), as runtime
schedules (``akadze schedules list`` shows them; paused when RedBeat's entry is disabled).
Left alone: the ``beat_schedule`` entries (the statics), which the workers already run from
the code; and an entry whose schedule has no runtime form here (a ``solar`` or ``rrule``
schedule, a crontab restricting both day of month and day of week, which Celery matches
together and cron alone), each named with its reason. The definition is parsed as JSON
only: nothing named in it is imported.
"""

from __future__ import annotations

import dataclasses
import importlib
import json
from collections.abc import Mapping
from datetime import datetime, timedelta, timezone
from typing import Any
from zoneinfo import ZoneInfo

from .beat import schedule_arguments, schedule_timezone
from .schedules import crontab, schedule

__all__ = ["Imported", "decode_definition", "import_entries", "redis_url_of", "runtime_trigger"]

#: The entry Celery adds for its result backend's cleanup (RedBeat stores it too).
_BACKEND_CLEANUP = "celery.backend_cleanup"
#: RedBeat's ``redbeat_key_prefix`` default.
DEFAULT_PREFIX = "redbeat:"


class Unsupported(ValueError):
    """An entry that has no runtime schedule form here (its reason)."""


@dataclasses.dataclass
class Imported:
    """What an import did: the names stored, those left to the code (RedBeat's statics),
    and the ones skipped with why."""

    stored: list[str] = dataclasses.field(default_factory=list)
    static: list[str] = dataclasses.field(default_factory=list)
    skipped: dict[str, str] = dataclasses.field(default_factory=dict)


def _decode_object(value: dict[str, Any]) -> Any:
    kind = value.get("__type__")
    if kind is None:
        return value
    if kind == "interval":
        return schedule(run_every=float(value["every"]), relative=bool(value.get("relative")))
    if kind == "crontab":
        return crontab(minute=value.get("minute", "*"), hour=value.get("hour", "*"),
                       day_of_week=value.get("day_of_week", "*"),
                       day_of_month=value.get("day_of_month", "*"),
                       month_of_year=value.get("month_of_year", "*"))
    if kind == "datetime":
        zone = value.get("timezone", "UTC")
        tz = timezone(timedelta(seconds=zone)) if isinstance(zone, (int, float)) \
            else timezone.utc if zone == "UTC" else ZoneInfo(str(zone))
        fields = {key: int(value[key]) for key in ("year", "month", "day", "hour", "minute",
                                                   "second", "microsecond") if key in value}
        return datetime(tzinfo=tz, **fields)  # type: ignore[arg-type]
    raise Unsupported(f"its schedule (type {kind!r}) has no runtime schedule form here")


def decode_definition(text: str | bytes) -> dict[str, Any]:
    """RedBeat's stored definition: its JSON with the ``__type__`` objects it writes made
    into this package's schedules and datetimes. ``Unsupported`` for a schedule type that
    has no runtime form here."""
    found = json.loads(text, object_hook=_decode_object)
    if not isinstance(found, dict):
        raise Unsupported("the definition is not a JSON object")
    return found


def runtime_trigger(trigger: Any) -> str:
    """The runtime schedule spec (``every Ns``, ``cron EXPR tz=ZONE``) of a beat trigger."""
    spec = str(trigger.spec)
    if spec.startswith("every "):
        return spec
    if spec.startswith("celery-crontab "):
        expression, _, zone = spec.removeprefix("celery-crontab ").rpartition(" tz=")
        fields = expression.split()
        if len(fields) == 5 and fields[2] != "*" and fields[4] != "*":
            raise Unsupported("a crontab restricting both day_of_month and day_of_week "
                              "(Celery runs it when both match; cron when either does)")
        return f"cron {expression} tz={zone}"
    raise Unsupported(f"its trigger {spec!r} has no runtime schedule form here")


def redis_url_of(conf: Any) -> str | None:
    """Where RedBeat keeps its entries: ``redbeat_redis_url``, else a ``redis://`` broker."""
    url = conf.get("redbeat_redis_url")
    if url:
        return str(url)
    broker = conf.get("broker_url")
    if isinstance(broker, str) and broker.split("://")[0] in ("redis", "rediss"):
        return broker
    return None


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def import_entries(app: Any, redis_url: str, *, prefix: str | None = None,
                   replace: bool = False, dry_run: bool = False) -> Imported:
    """Copy the run-time entries RedBeat keeps under ``prefix`` at ``redis_url`` into
    ``app``'s runtime schedules (``replace``: an existing runtime schedule of the name is
    changed, else the entry is skipped; ``dry_run``: nothing stored)."""
    redis = importlib.import_module("redis")
    prefix = prefix if prefix is not None else str(app.conf.get("redbeat_key_prefix")
                                                   or DEFAULT_PREFIX)
    client = redis.Redis.from_url(redis_url)
    keys = [_text(key) for key in client.zrange(prefix + ":schedule", 0, -1)]
    statics = {_text(name) for name in client.smembers(prefix + ":statics")}
    conf = app.conf
    zone = schedule_timezone(conf.timezone, conf.enable_utc)
    core = app.prepare_worker()
    existing = {stored.name for stored in core.runtime_schedules.list()}
    done = Imported()
    for key in keys:
        name = key.removeprefix(prefix)
        if name in statics:
            done.static.append(name)
            continue
        if name == _BACKEND_CLEANUP:
            done.skipped[name] = ("Celery's result cleanup: akadze drops finished jobs "
                                  "after result_expires itself")
            continue
        try:
            raw = client.hget(key, "definition")
            if not raw:
                raise Unsupported("its definition is missing")
            definition = decode_definition(raw)
            if name in existing and not replace:
                raise Unsupported("a runtime schedule of that name exists (--replace "
                                  "changes it)")
            entry: Mapping[str, Any] = {
                "task": definition.get("task"), "schedule": definition.get("schedule"),
                "args": definition.get("args") or (), "kwargs": definition.get("kwargs") or {},
                "options": definition.get("options") or {}}
            arguments, _ = schedule_arguments(app, name, entry, zone)
            spec = runtime_trigger(arguments["trigger"])
        except (Unsupported, ValueError, TypeError, KeyError) as exc:
            done.skipped[name] = str(exc)
            continue
        if not dry_run:
            try:
                core.runtime_schedules.add(
                    name, arguments["task"], trigger=spec, args=arguments["args"],
                    queue=arguments.get("queue"), priority=arguments.get("priority"),
                    max_attempts=arguments.get("max_attempts"),
                    expires=arguments.get("expires"), meta=arguments.get("meta"),
                    paused=not definition.get("enabled", True), replace=replace)
            except ValueError as exc:
                done.skipped[name] = str(exc)
                continue
        done.stored.append(name)
    return done
