"""django_celery_beat's ``DatabaseScheduler``, run by the workers from its own tables.

With ``beat_scheduler`` (``CELERY_BEAT_SCHEDULER``, or ``--scheduler``) naming it, every
worker (and ``akadze-compat beat``) reads django_celery_beat's tables with SQL, in the
database ``broker_url`` names, which must be Django's: Django and django_celery_beat are
never imported. The tables stay django_celery_beat's (its migrations, its admin); each
periodic task's exactly-once state is an ``akadze.schedules`` row named
``django_celery_beat:<id>``, so each tick runs once across the fleet.

What each pass does (about once a second, see ``akadze_core.schedules.scheduler``):

- it reads ``django_celery_beat_periodictasks.last_update``, which django_celery_beat moves
  on every save or delete through the ORM or the admin, and re-reads the enabled tasks when
  it moved (and every ``RESYNC_SECONDS`` anyway, for ``QuerySet.update()`` calls, which
  announce nothing): edits take effect within about a second, without a restart;
- each enabled task is a schedule whose job is the one ``apply_async`` would send with the
  row's JSON ``args``/``kwargs`` and its ``queue``, ``priority``, ``headers`` (plus
  ``periodic_task_name``) and ``expires``/``expire_seconds``, through the same path as
  ``beat_schedule`` entries (``beat.schedule_arguments``);
- the transaction that enqueues a run also writes what django_celery_beat's scheduler
  writes: ``total_run_count + 1`` and ``last_run_at``; a ``one_off`` task ends disabled
  (with ``last_run_at`` cleared and the count reset, as that scheduler leaves it), and a
  task disabled, deleted or expired meanwhile gets no run;
- tasks past ``expires`` are disabled.

When runs happen, as django_celery_beat's scheduler decides them:

- crontab: in the row's own time zone, with Celery's crontab rules (``CrontabTrigger``);
- interval: every ``every`` ``period``, on the grid of ``start_time`` when set, else of the
  Unix epoch (as ``beat_schedule`` intervals here), not one interval after each run;
- clocked: once, at ``clocked_time`` (also when that passed while no worker ran);
- ``start_time``: no run before it;
- ticks count from the row's ``last_run_at`` (else from when it was last changed; with a
  ``start_time``, from the beginning): a tick missed since then runs once (the latest), so a
  task re-enabled in the admin does not run for the ticks it was disabled;
- solar: as ``beat_schedule``'s solar entries (skipped, with one warning, when they cannot
  run); a row whose schedule or arguments cannot run is skipped with one warning.
"""

from __future__ import annotations

import json
import logging
import math
import time
from collections.abc import Mapping, Sequence
from dataclasses import replace
from datetime import datetime, timedelta, tzinfo
from datetime import timezone as dt_timezone
from decimal import Decimal
from typing import TYPE_CHECKING, Any

import psycopg

from akadze_core import Every, Schedule, Trigger
from akadze_core.integration import (
    EPOCH,
    MIN_CHECK_INTERVAL,
    is_transient,
    load_queries,
    run_statement,
)

from . import beat, serialization
from ._triggers import schedule_timezone
from .schedules import crontab, solar

if TYPE_CHECKING:
    from akadze_core import App as CoreApp

    from .app.base import Celery

__all__ = ["SCHEDULER_NAMES", "SCHEDULER_NOTE", "DjangoBeatSource", "names_database_scheduler",
           "register"]

logger = logging.getLogger("akadze_compat.django_beat")

#: The ``beat_scheduler`` values that name django_celery_beat's scheduler ("django" is the
#: name its ``celery.beat_schedulers`` entry point gives it).
SCHEDULER_NAMES = frozenset({"django_celery_beat.schedulers:DatabaseScheduler",
                             "django_celery_beat.schedulers.DatabaseScheduler", "django"})
#: Why another scheduler is not used (the command line's warnings).
SCHEDULER_NOTE = ("periodic tasks come from beat_schedule and add_periodic_task, and from "
                  "django_celery_beat's tables with django_celery_beat.schedulers:"
                  "DatabaseScheduler")
#: Definitions are re-read at least this often even if nothing announced a change.
RESYNC_SECONDS = 60.0
#: akadze.schedules names of django_celery_beat's tasks: this prefix and the row's id.
NAME_PREFIX = "django_celery_beat:"

_QUERIES = load_queries("akadze_compat", "sql/django_celery_beat.sql")
_UTC = dt_timezone.utc
_MICROSECOND = timedelta(microseconds=1)
_NEVER = datetime(9999, 1, 1, tzinfo=_UTC)
_PERIODS = ("days", "hours", "minutes", "seconds", "microseconds")


def names_database_scheduler(value: Any) -> bool:
    """Whether a ``beat_scheduler`` value names django_celery_beat's DatabaseScheduler."""
    if isinstance(value, type):
        value = f"{value.__module__}:{value.__qualname__}"
    return isinstance(value, str) and value.strip() in SCHEDULER_NAMES


def register(app: Celery, core: CoreApp) -> DjangoBeatSource | None:
    """Attach (or detach) the source of django_celery_beat's tasks on ``core``, as
    ``beat_scheduler`` says (``Celery.prepare_worker``; idempotent)."""
    current = [source for source in core.schedule_sources
               if isinstance(source, DjangoBeatSource)]
    if not names_database_scheduler(app.conf.beat_scheduler):
        for source in current:
            core.schedule_sources.remove(source)
        return None
    if current:
        return current[0]
    source = DjangoBeatSource(app, core)
    core.schedule_sources.append(source)
    return source


# --- triggers -------------------------------------------------------------------------------


def _aware(moment: datetime) -> datetime:
    return moment.replace(tzinfo=_UTC) if moment.tzinfo is None else moment.astimezone(_UTC)


class IntervalFrom:
    """Ticks every ``interval`` from ``anchor`` on (none before it): an interval task with
    a ``start_time``."""

    def __init__(self, interval: timedelta, anchor: datetime) -> None:
        self._micros = interval // _MICROSECOND
        if self._micros <= 0:
            raise ValueError(f"interval must be positive, not {interval!r}")
        self.anchor = _aware(anchor)

    @property
    def spec(self) -> str:
        seconds = Decimal(self._micros) / Decimal(1_000_000)
        return f"every {seconds.normalize():f}s from {self.anchor.isoformat()}"

    def latest(self, at: datetime) -> datetime | None:
        elapsed = (_aware(at) - self.anchor) // _MICROSECOND
        if elapsed < 0:
            return None
        return self.anchor + timedelta(microseconds=elapsed // self._micros * self._micros)

    def next(self, after: datetime) -> datetime:
        latest = self.latest(after)
        return self.anchor if latest is None else latest + timedelta(microseconds=self._micros)


class Once:
    """One tick, at ``moment``: a clocked task."""

    def __init__(self, moment: datetime) -> None:
        self.moment = _aware(moment)

    @property
    def spec(self) -> str:
        return f"clocked {self.moment.isoformat()}"

    def latest(self, at: datetime) -> datetime | None:
        return self.moment if _aware(at) >= self.moment else None

    def next(self, after: datetime) -> datetime:
        return self.moment if _aware(after) < self.moment else _NEVER


class StartingAt:
    """The ticks of ``trigger`` at or after ``start`` (a task's ``start_time``)."""

    def __init__(self, trigger: Trigger, start: datetime) -> None:
        self.trigger = trigger
        self.start = _aware(start)

    @property
    def spec(self) -> str:
        return f"{self.trigger.spec} start={self.start.isoformat()}"

    def latest(self, at: datetime) -> datetime | None:
        tick = self.trigger.latest(at)
        return tick if tick is not None and tick >= self.start else None

    def next(self, after: datetime) -> datetime:
        return self.trigger.next(max(_aware(after), self.start - _MICROSECOND))


def row_trigger(row: Mapping[str, Any], app_zone: str | tzinfo = "UTC") -> Trigger:
    """The trigger of one ``djbeat_tasks`` row (ValueError, NotImplementedError when it
    cannot run)."""
    start = row.get("start_time")
    trigger: Trigger
    if row.get("interval_id") is not None:
        period = row["interval_period"]
        if period not in _PERIODS:
            raise ValueError(f"unknown interval period {period!r}")
        interval = timedelta(**{period: int(row["interval_every"])})
        if start is not None:
            return IntervalFrom(interval, start)  # on the grid of start_time
        trigger = Every(interval)
    elif row.get("crontab_id") is not None:
        trigger = crontab(
            minute=row["crontab_minute"], hour=row["crontab_hour"],
            day_of_week=row["crontab_day_of_week"], day_of_month=row["crontab_day_of_month"],
            month_of_year=row["crontab_month_of_year"],
        ).trigger(row.get("crontab_timezone") or "UTC")
    elif row.get("solar_id") is not None:
        trigger = solar(row["solar_event"], float(row["solar_latitude"]),
                        float(row["solar_longitude"])).trigger(app_zone)
    elif row.get("clocked_id") is not None:
        trigger = Once(row["clocked_time"])
    else:
        raise ValueError("it has no schedule (interval, crontab, solar or clocked)")
    return trigger if start is None else StartingAt(trigger, start)


def row_since(row: Mapping[str, Any]) -> datetime:
    """The instant the task's ticks count from, as django_celery_beat's scheduler counts:
    its last run, else its last change, else (with a start time, or clocked) the beginning."""
    if row.get("clocked_id") is not None:
        return EPOCH  # a clocked task runs once its time has come, whatever happened before
    if row.get("last_run_at") is not None:
        return _aware(row["last_run_at"])
    if row.get("start_time") is not None or row.get("date_changed") is None:
        return EPOCH
    return _aware(row["date_changed"])


def row_entry(row: Mapping[str, Any], trigger: Trigger) -> dict[str, Any]:
    """The ``beat_schedule``-style entry of one row, with the options django_celery_beat's
    scheduler sends it with."""
    args = serialization.loads(row["args"] or "[]")
    kwargs = serialization.loads(row["kwargs"] or "{}")
    if not isinstance(args, list):
        raise ValueError(f"args must be a JSON array, not {row['args']!r}")
    if not isinstance(kwargs, dict):
        raise ValueError(f"kwargs must be a JSON object, not {row['kwargs']!r}")
    options: dict[str, Any] = {key: row[key] for key in ("queue", "exchange", "routing_key",
                                                         "priority") if row[key] is not None}
    expires = row["expires"] if row["expires"] is not None else row["expire_seconds"]
    if expires:
        options["expires"] = expires
    headers = serialization.loads(row["headers"] or "{}")
    if not isinstance(headers, dict):
        raise ValueError(f"headers must be a JSON object, not {row['headers']!r}")
    options["headers"] = {**headers, "periodic_task_name": row["name"]}
    return {"task": row["task"], "schedule": trigger, "args": args, "kwargs": kwargs,
            "options": options}


def _definition(row: Mapping[str, Any]) -> str:
    """What decides whether a row changed, for warning once per definition."""
    return json.dumps({key: str(value) for key, value in row.items()
                       if key not in ("last_run_at", "date_changed")}, sort_keys=True)


# --- the source -----------------------------------------------------------------------------


class DjangoBeatSource:
    """django_celery_beat's enabled periodic tasks, for akadze_core's Scheduler (a
    ``ScheduleSource``): re-read when django_celery_beat announces a change."""

    check_interval = MIN_CHECK_INTERVAL

    def __init__(self, app: Celery, core: CoreApp) -> None:
        self.app = app
        self.core = core
        self._last_update: Any = self  # nothing read yet (None is "no announcement yet")
        self._read_at = -math.inf
        self._schedules: dict[str, Schedule] = {}
        self._ids: dict[str, int] = {}
        self._expires: dict[str, datetime] = {}
        self._warned: set[str] = set()
        self._unavailable: str | None = None

    async def load(self, connection: psycopg.AsyncConnection) -> Sequence[Schedule]:
        """The enabled tasks, re-read when ``last_update`` moved."""
        try:
            rows = await run_statement(connection, _QUERIES["djbeat_changed"])
            now, last_update = rows[0]["now"], rows[0]["last_update"]
            if (last_update != self._last_update
                    or time.monotonic() - self._read_at >= RESYNC_SECONDS):
                self._read_at = time.monotonic()
                self._build(await run_statement(connection, _QUERIES["djbeat_tasks"]))
                self._last_update = last_update
            expired = [name for name, moment in self._expires.items() if moment <= now]
            if expired:
                await self._disable_expired(connection, expired)
        except psycopg.Error as exc:
            if is_transient(exc):
                raise
            self._unreadable(exc)
            return []
        if self._unavailable is not None:
            logger.warning("django_celery_beat's tables are readable again")
            self._unavailable = None
        return list(self._schedules.values())

    async def enqueued(self, connection: psycopg.AsyncConnection, schedule: Schedule,
                       tick: datetime, job_id: int) -> bool:
        """Count the run in the task's row, in the enqueue's transaction."""
        try:
            rows = await run_statement(connection, _QUERIES["djbeat_ran"],
                                       id=self._ids[schedule.name])
        except psycopg.Error as exc:
            if is_transient(exc):
                raise
            self._unreadable(exc)
            return False
        if not rows:  # disabled, deleted or expired since we read it: read again
            logger.info("periodic task %s changed before its run for %s: not run",
                        schedule.name, tick.isoformat())
            self._forget(schedule.name)
            self._last_update = self
            return False
        if rows[0]["one_off"]:
            self._forget(schedule.name)
        return True

    def _build(self, rows: Sequence[Mapping[str, Any]]) -> None:
        conf = self.app.conf
        zone = schedule_timezone(conf.timezone, conf.enable_utc)
        schedules: dict[str, Schedule] = {}
        ids: dict[str, int] = {}
        expires: dict[str, datetime] = {}
        for row in rows:
            name = f"{NAME_PREFIX}{row['id']}"
            try:
                schedule, ignored = self._schedule(row, name, zone)
            except Exception as exc:
                self._warn(row, f"periodic task {row['name']!r} (id {row['id']}) cannot run "
                                f"and is skipped: {exc}")
                continue
            if ignored:
                self._warn(row, f"periodic task {row['name']!r}: the options "
                                f"{', '.join(ignored)} do not apply here and are ignored")
            schedules[name] = schedule
            ids[name] = int(row["id"])
            if row["expires"] is not None:
                expires[name] = _aware(row["expires"])
        self._schedules, self._ids, self._expires = schedules, ids, expires

    def _schedule(self, row: Mapping[str, Any], name: str, zone: str | tzinfo
                  ) -> tuple[Schedule, tuple[str, ...]]:
        trigger = row_trigger(row, zone)
        arguments, ignored = beat.schedule_arguments(self.app, name, row_entry(row, trigger),
                                                     zone)
        schedule = Schedule.declare(self.core, **arguments)
        return replace(schedule, since=row_since(row)), ignored

    async def _disable_expired(self, connection: psycopg.AsyncConnection,
                               names: list[str]) -> None:
        await run_statement(connection, _QUERIES["djbeat_expire"],
                            ids=[self._ids[name] for name in names])
        for name in names:
            logger.info("periodic task %s expired: disabled", name)
            self._forget(name)

    def _forget(self, name: str) -> None:
        self._schedules.pop(name, None)
        self._expires.pop(name, None)

    def _warn(self, row: Mapping[str, Any], message: str) -> None:
        key = _definition(row) + message
        if key not in self._warned:
            self._warned.add(key)
            logger.warning("%s", message)

    def _unreadable(self, exc: psycopg.Error) -> None:
        reason = f"{type(exc).__name__}: {str(exc).strip().splitlines()[0] if str(exc) else ''}"
        if reason != self._unavailable:
            self._unavailable = reason
            hint = (" (run `manage.py migrate django_celery_beat`; broker_url must name "
                    "Django's database)"
                    if isinstance(exc, psycopg.errors.UndefinedTable) else "")
            logger.error("django_celery_beat's periodic tasks do not run: cannot read its "
                         "tables%s: %s", hint, reason)
        self._schedules.clear()
        self._last_update = self
