"""Celery beat without a beat process: ``beat_schedule`` entries become akadze_core schedules.

Entries come from ``beat_schedule`` (also ``CELERY_BEAT_SCHEDULE`` with the ``CELERY``
namespace and the old ``CELERYBEAT_SCHEDULE``) and from ``app.add_periodic_task``, which
adds to that same setting as Celery does. When a worker prepares (``prepare_worker``), each
entry is declared on ``app.core`` with ``add_schedule``; every worker then enqueues each tick
exactly once (see ``akadze_core.schedules.scheduler``).

Each run is the job ``task.apply_async(args, kwargs, **options)`` would enqueue at the tick:
the same args object (``{"args": [...], "kwargs": {...}}``, kombu JSON), the queue and
priority the router picks (``options``, the task's own, ``task_routes``, the default
queue), ``max_attempts`` from the task's ``max_retries``, and ``meta["celery"]`` built as
``send_task`` builds it, with the ``celery_beat_task`` header Celery beat adds, and a uuid4
task id of its own (``meta["task_id"]``). So it runs through the same entry as ``delay()``.
Differences from Celery beat (migration guide):

- ``countdown``, ``eta``, ``exchange``, ``task_id`` and kombu options have no meaning for
  a periodic run: each entry that sets one gets one warning, and they are ignored.
- ``before_task_publish``/``after_task_publish`` do not fire for periodic runs: the
  scheduler inserts them in SQL, in whichever worker wins the tick.
- ``solar`` and custom schedules (``is_due``) run as Celery beat runs them: each worker asks
  ``is_due`` with the last run kept in the database, and the due run is enqueued once
  (``_triggers.DueTrigger``). Interval and crontab schedules tick on their triggers instead.
- An entry that cannot run (``solar`` without ephem, a ``BaseSchedule`` subclass without
  ``is_due``, arguments that are not JSON or do not fit the task) stops the worker at start,
  naming the entry, instead of failing at every tick.
- Arguments are fixed when the worker starts (Celery's ``BeatLazyFunc`` is not supported).
"""

from __future__ import annotations

import logging
import numbers
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta, tzinfo
from datetime import timezone as dt_timezone
from typing import TYPE_CHECKING, Any

from akadze_core import Trigger

from . import serialization
from ._beat_scheduler import DEFAULT_MAX_INTERVAL, ScheduleEntry, Scheduler, SchedulingError
from ._schedulers import HONOURED_SCHEDULERS, unhonoured_scheduler
from ._triggers import DueTrigger, schedule_timezone, to_zone
from .app import publish
from .canvas import Signature
from .exceptions import ImproperlyConfigured
from .schedules import BaseSchedule, crontab, maybe_schedule, schedule, solar
from .utils.unsupported import not_provided

if TYPE_CHECKING:
    from akadze_core import App as CoreApp

    from .app.base import Celery

__all__ = ["DEFAULT_MAX_INTERVAL", "HONOURED_SCHEDULERS", "PeriodicEntry", "ScheduleEntry",
           "Scheduler", "SchedulingError", "UnsupportedSchedule", "add_periodic_task",
           "entry_to_schedule", "register_periodic_tasks", "schedule_timezone", "to_trigger",
           "unhonoured_scheduler"]

logger = logging.getLogger("akadze_compat.beat")

_UTC = dt_timezone.utc
#: Celery options kept with each run in ``meta["celery"]``, as ``send_task`` keeps them.
_META_OPTIONS = ("headers", "time_limit", "soft_time_limit", "ignore_result", "routing_key",
                 "link", "link_error", "shadow")
#: Task attributes that stand in for options an entry leaves out (as ``apply_async`` does).
_TASK_DEFAULTS = ("queue", "priority", "expires", "time_limit", "soft_time_limit",
                  "routing_key")


class UnsupportedSchedule(ImproperlyConfigured, NotImplementedError):
    """A beat entry whose schedule cannot run here (a ``BaseSchedule`` without ``is_due``)."""


# --- schedules and entries --------------------------------------------------------------------


def to_trigger(value: Any, timezone: str | tzinfo = "UTC", relative: bool = False,
               app: Any = None) -> Trigger:
    """The trigger for a ``beat_schedule`` value: seconds, timedelta, schedule, crontab,
    solar, an object that already is a trigger (``latest``/``next``/``spec``), or a custom
    schedule: a subclass that overrides ``is_due``, or any object with ``is_due`` and
    ``remaining_estimate``, run by asking ``is_due`` (``DueTrigger``). ``app`` becomes a
    custom schedule's app when it has none, as Celery beat makes it.

    A ``BaseSchedule`` subclass without ``is_due`` raises ``NotImplementedError``; ``solar``
    without ephem, ``ImproperlyConfigured``.
    """
    if isinstance(value, (numbers.Real, timedelta)):
        value = maybe_schedule(value, relative)
    if isinstance(value, (schedule, crontab)) and not _polls(value):
        return value.trigger(timezone)
    if isinstance(value, Trigger):
        return value
    if isinstance(value, BaseSchedule) and type(value).is_due is BaseSchedule.is_due:
        raise NotImplementedError(
            f"custom schedule {type(value).__name__} has no is_due(last_run_at): give it "
            "is_due and remaining_estimate as Celery requires, or latest(at), next(after) "
            "and spec")
    if callable(getattr(value, "is_due", None)) and \
            callable(getattr(value, "remaining_estimate", None)):
        if isinstance(value, BaseSchedule) and app is not None:
            value.app = app  # as Celery beat gives its entries' schedules the app
        if isinstance(value, solar):
            return value.trigger(timezone)  # checks that ephem is there
        return DueTrigger(value, timezone)
    raise TypeError(f"a periodic task's schedule must be seconds, a timedelta, schedule, "
                    f"crontab, solar or an object with is_due(), not {value!r}")


#: What decides a crontab's or an interval's runs: a subclass that overrides one of these
#: runs through its own ``is_due`` rather than through the trigger its base computes.
_POLLING_METHODS = ("is_due", "remaining_estimate", "remaining_delta", "now")


def _polls(value: BaseSchedule) -> bool:
    """Whether a ``schedule``/``crontab`` subclass changed how its runs are decided."""
    base = crontab if isinstance(value, crontab) else schedule
    return any(getattr(type(value), name, None) is not getattr(base, name, None)
               for name in _POLLING_METHODS)


@dataclass(frozen=True)
class PeriodicEntry:
    """One ``beat_schedule`` entry, normalized for ``akadze_core``'s ``App.add_schedule``.

    ``queue``/``priority`` are None when the entry's options do not set them: the app then
    routes the task as it routes ``apply_async`` (``task_routes``, task defaults).
    ``ignored_options`` are Celery options that have no meaning for periodic runs here
    (``countdown``, ``eta``, ``exchange``...), for the app to warn about.
    """

    name: str
    task_name: str
    trigger: Trigger
    args: list[Any]
    kwargs: dict[str, Any]
    queue: str | None = None
    priority: int | None = None
    expires: timedelta | None = None
    meta: dict[str, Any] = field(default_factory=dict)
    ignored_options: tuple[str, ...] = ()

    def add_schedule_kwargs(self) -> dict[str, Any]:
        """Keyword arguments for ``core_app.add_schedule`` (queue/priority when set)."""
        arguments: dict[str, Any] = {
            "name": self.name, "task": self.task_name, "trigger": self.trigger,
            "args": {"args": self.args, "kwargs": self.kwargs},
            "expires": self.expires, "meta": self.meta,
        }
        if self.queue is not None:
            arguments["queue"] = self.queue
        if self.priority is not None:
            arguments["priority"] = self.priority
        return arguments


def entry_to_schedule(name: str, entry: Mapping[str, Any],
                      app_timezone: str | tzinfo = "UTC", app: Any = None) -> PeriodicEntry:
    """Normalize ``beat_schedule[name]`` (``task``, ``schedule``, ``args``, ``kwargs``,
    ``options``, ``relative``) evaluated in ``app_timezone`` (see :func:`schedule_timezone`).

    ``options['expires']`` in seconds (or a timedelta) expires each run that long after it
    is enqueued; a datetime (or ISO text) is a deadline for every run, kept in the meta.
    ``options['serializer']`` must be JSON (ImproperlyConfigured otherwise).
    """
    if not entry.get("task"):
        raise ValueError(f"beat_schedule entry {name!r} has no 'task'")
    if entry.get("schedule") is None:
        raise ValueError(f"beat_schedule entry {name!r} has no 'schedule'")
    trigger = to_trigger(entry["schedule"], app_timezone, bool(entry.get("relative", False)),
                         app)
    options = dict(entry.get("options") or {})
    serialization.check_serializer(options.pop("serializer", None), "serializer")
    queue = options.pop("queue", None)
    priority = options.pop("priority", None)
    celery_meta: dict[str, Any] = {key: options.pop(key) for key in _META_OPTIONS
                                   if key in options}
    # Celery beat marks what it sends, and tasks may check for it.
    celery_meta["headers"] = {**(celery_meta.get("headers") or {}), "celery_beat_task": True}
    expires, expires_at = _expires(options.pop("expires", None), app_timezone)
    if expires_at is not None:
        celery_meta["expires"] = expires_at.isoformat()
    return PeriodicEntry(
        name=name, task_name=str(entry["task"]), trigger=trigger,
        args=list(entry.get("args") or ()), kwargs=dict(entry.get("kwargs") or {}),
        queue=None if queue is None else queue if isinstance(queue, str) else str(queue.name),
        priority=priority, expires=expires, meta={"celery": celery_meta},
        ignored_options=tuple(sorted(options)))


def _expires(value: Any, timezone: str | tzinfo) -> tuple[timedelta | None, datetime | None]:
    """(relative expiry, absolute deadline) from Celery's ``expires`` option."""
    if value is None:
        return None, None
    if isinstance(value, numbers.Real):
        return timedelta(seconds=float(value)), None
    if isinstance(value, timedelta):
        return value, None
    deadline = datetime.fromisoformat(value) if isinstance(value, str) else value
    if not isinstance(deadline, datetime):
        raise TypeError(f"expires must be seconds, a timedelta or a datetime, not {value!r}")
    if deadline.tzinfo is None:  # a naive deadline is read in the app's zone
        deadline = deadline.replace(tzinfo=to_zone(timezone))
    return None, deadline.astimezone(_UTC)


# --- add_periodic_task --------------------------------------------------------------------------


def periodic_task_entry(app: Celery, schedule: Any, sig: Any, args: Any = (), kwargs: Any = (),
                        name: str | None = None, **opts: Any) -> tuple[str, dict[str, Any]]:
    """``(key, beat_schedule entry)`` for ``add_periodic_task``: the key is ``name``, else
    the signature's repr (``proj.tasks.add(2, 2)``), as Celery names it."""
    kwargs = dict(kwargs) if kwargs else {}
    sig = (sig.clone(args, kwargs) if isinstance(sig, Signature)
           else app.signature(sig.name, args, kwargs))
    return name or repr(sig), {
        "schedule": schedule, "task": sig.name, "args": sig.args, "kwargs": sig.kwargs,
        "options": dict(sig.options, **opts),
    }


def add_periodic_task(app: Celery, schedule: Any, sig: Any, args: Any = (), kwargs: Any = (),
                      name: str | None = None, **opts: Any) -> str:
    """``app.add_periodic_task``: add an entry to ``beat_schedule`` (now, or when the
    configuration is loaded, before ``on_after_configure``); returns its key."""
    key, entry = periodic_task_entry(app, schedule, sig, args, kwargs, name, **opts)
    if app.configured:
        store_periodic_task(app, key, entry, name)
    else:
        app.pending_periodic_tasks.append((key, entry, name))
    return key


def store_periodic_task(app: Celery, key: str, entry: dict[str, Any],
                        name: str | None = None) -> None:
    """Put ``entry`` in ``app.conf.beat_schedule`` under ``key`` (as Celery does, the
    setting's dict itself is updated)."""
    beat_schedule = app.conf.beat_schedule
    if beat_schedule is None:
        beat_schedule = app.conf.beat_schedule = {}
    if name is None and key in beat_schedule:
        logger.warning("Periodic task key=%r shadowed a previous unnamed periodic task. Pass "
                       "a name kwarg to add_periodic_task to silence this warning.", key)
    beat_schedule[key] = entry


def add_pending_periodic_tasks(app: Celery) -> None:
    """Store the entries added before the configuration was loaded."""
    pending = app.pending_periodic_tasks
    while pending:
        key, entry, name = pending.pop(0)
        store_periodic_task(app, key, entry, name)


# --- declaring the schedules on the core app --------------------------------------------------


def schedule_arguments(app: Celery, name: str, entry: Mapping[str, Any],
                       zone: str | tzinfo) -> tuple[dict[str, Any], tuple[str, ...]]:
    """``(add_schedule keyword arguments, ignored option names)`` for one entry, with the
    task's defaults, routing and meta that ``apply_async`` would use at the tick."""
    task_name = str(entry.get("task") or "")
    task = app.registry.get(task_name)
    options = dict(entry.get("options") or {})
    if task is not None:
        defaults = {key: getattr(task, key, None) for key in _TASK_DEFAULTS}
        options = {**{k: v for k, v in defaults.items() if v is not None}, **options}
    periodic = entry_to_schedule(name, {**entry, "options": options}, zone, app)
    if task is not None and (task.typing if task.typing is not None else app.strict_typing):
        task.check_arguments(periodic.args, periodic.kwargs)
    celery = periodic.meta["celery"]
    routed = app.router().route(
        {"queue": periodic.queue, "priority": periodic.priority,
         "routing_key": celery.get("routing_key")},
        periodic.task_name, periodic.args, periodic.kwargs, task)
    ignore_result = celery.get("ignore_result", task.ignore_result if task else None)
    shadow = celery.get("shadow") or (
        task.shadow_name(periodic.args, periodic.kwargs, options) if task else None)
    meta = publish.message_meta(
        routed, headers=celery["headers"], expires=celery.get("expires"),
        ignore_result=ignore_result, time_limit=celery.get("time_limit"),
        soft_time_limit=celery.get("soft_time_limit"), shadow=shadow,
        link=celery.get("link"), link_error=celery.get("link_error"))
    priority = routed.get("priority")
    return {
        **periodic.add_schedule_kwargs(), "queue": routed["queue"],
        "priority": None if priority is None else int(priority),
        "max_attempts": publish.max_attempts_for(task), "meta": {"celery": meta},
        "task_ids": True,  # each run its own uuid4 task id, as Celery beat sends
    }, periodic.ignored_options


def register_periodic_tasks(app: Celery, core: CoreApp) -> list[str]:
    """Declare every ``beat_schedule`` entry on ``core`` (``Celery.prepare_worker``).

    Idempotent: a worker may prepare more than once; unchanged entries are left alone,
    changed ones replaced, and entries removed from the setting since stop. Raises
    ``ImproperlyConfigured`` (``UnsupportedSchedule`` without ``is_due``) naming the entry that
    cannot run. Returns the names declared.
    """
    conf = app.conf
    zone = schedule_timezone(conf.timezone, conf.enable_utc)
    entries = dict(conf.beat_schedule or {})
    declared = app.declared_schedules
    for name in [name for name in declared if name not in entries]:
        core.schedules.pop(name, None)  # removed from the setting: it stops here
        del declared[name]
    for name, entry in entries.items():
        try:
            arguments, ignored = schedule_arguments(app, str(name), entry, zone)
        except Exception as exc:
            error = UnsupportedSchedule if isinstance(exc, NotImplementedError) \
                else ImproperlyConfigured
            raise error(f"beat_schedule entry {name!r} cannot be scheduled: {exc}") from exc
        fingerprint = _fingerprint(arguments)
        if declared.get(name) == fingerprint:
            continue
        if name in declared:
            core.schedules.pop(name, None)
        try:
            core.add_schedule(**arguments)
        except Exception as exc:  # a name a core schedule took already, args not JSON, ...
            raise ImproperlyConfigured(
                f"beat_schedule entry {name!r} cannot be scheduled: {exc}") from exc
        declared[name] = fingerprint
        if ignored:
            logger.warning("periodic task %r: the options %s do not apply to periodic runs "
                           "and are ignored", name, ", ".join(ignored))
    return list(declared)


def _fingerprint(arguments: Mapping[str, Any]) -> str:
    """What decides whether a re-declared entry changed (triggers compare by spec)."""
    return repr(sorted({**arguments, "trigger": arguments["trigger"].spec}.items()))


def warn_unhonoured_scheduler(app: Any, override: Any = None) -> str | None:
    """At worker and beat start: log one WARNING line when the scheduler chosen (the
    command's ``--scheduler``, else ``beat_scheduler``) is not honoured; returns the line."""
    line = unhonoured_scheduler(override, "--scheduler") if override else \
        unhonoured_scheduler(app.conf.beat_scheduler)
    if line is not None:
        logger.warning("%s", line)
    return line


_NO_BEAT = ("there is no beat process to extend: every worker runs beat_schedule itself "
            "(Postgres decides which one sends each tick), so custom schedulers and "
            "database-backed schedules (django_celery_beat) do not run")
__getattr__ = not_provided(__name__, {
    name: (_NO_BEAT, "beat-runs-inside-the-workers")
    for name in ("PersistentScheduler", "Service", "EmbeddedService", "BeatPidbox")})
