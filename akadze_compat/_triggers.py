"""Triggers for Celery schedules: when a crontab ticks, as instants, in one time zone.

Private to ``akadze_compat``: ``schedules.crontab.trigger()`` builds a ``CrontabTrigger``,
which ``akadze_core``'s scheduler asks for ``latest(at)``/``next(after)`` (see
``akadze_core.schedules.triggers``). Its rules follow Celery beat, in the app's zone:

- A tick is a wall-clock minute where all five fields match: day of month AND day of week
  (Celery ANDs them; Vixie cron ORs them).
- A repeated wall time (clocks set back) fires once, on its first occurrence.
- Wall times skipped by a forward jump: the first skipped tick fires late, at the same
  wall time plus the jump (``02:30`` becomes ``03:30``), and the ticks after it up to that
  instant are skipped. This is the sequence Celery beat produces while it runs. Asked from
  inside a repeated hour's second pass, Celery's ``remaining_estimate`` names a time already
  past (beat would run again), and asked between a jump and its late tick it forgets that
  tick; the triggers keep to the running sequence there.
"""

from __future__ import annotations

import contextlib
import contextvars
import numbers
import os
import re
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime, timedelta, tzinfo
from datetime import timezone as dt_timezone
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from croniter import CroniterBadDateError, croniter

__all__ = [
    "CrontabTrigger",
    "DueTrigger",
    "schedule_clock",
    "schedule_timezone",
    "scheduler_clock",
    "to_zone",
]

_UTC = dt_timezone.utc
_SECOND = timedelta(seconds=1)
_MINUTE = timedelta(minutes=1)
#: How far back to look for a forward clock jump whose skipped tick may still fire late: as
#: long as the longest jump (an hour in practice; a day when Samoa skipped 30 December 2011).
_JUMP_WINDOW = timedelta(hours=25)


@dataclass(frozen=True)
class _Jump:
    """A forward clock jump, and the crontab tick it skipped first (fired late), if any."""

    at: datetime  # the instant of the jump
    start: datetime  # wall times in [start, end) do not exist (naive)
    end: datetime
    first_skipped: datetime | None  # naive wall time
    late: datetime | None  # the instant first_skipped fires: the jump's length late


class CrontabTrigger:
    """The ticks of a Celery crontab in one zone, with Celery beat's rules for clock changes.

    ``expression`` is five numeric cron fields (Sunday = 0) matched with day of month AND
    day of week. croniter walks the wall clock; this class maps wall times to instants.
    """

    def __init__(self, expression: str, timezone: str | tzinfo = "UTC") -> None:
        croniter(expression)  # raises on a malformed expression, now rather than in a worker
        self.expression = expression
        self.zone = to_zone(timezone)
        self.spec = f"celery-crontab {expression} tz={getattr(self.zone, 'key', None) or self.zone}"
        self._jumps: dict[datetime, _Jump] = {}  # found once: about two a year

    def next(self, after: datetime) -> datetime:
        """The first tick strictly after ``after``."""
        after = _aware(after)
        start = after.astimezone(self.zone).replace(tzinfo=None, fold=0)
        jump = self._jump_before(after)
        if jump is not None and jump.late is not None and after < jump.late:
            start = min(start, jump.start - _SECOND)  # the late tick is still ahead of us
        walls = croniter(self.expression, start, day_or=False)
        while True:
            instant = self._instant(walls.get_next(datetime))
            if instant is not None and instant > after:
                return instant

    def latest(self, at: datetime) -> datetime | None:
        """The most recent tick at or before ``at``, None when there is none in 50 years."""
        at = _aware(at)
        local = at.astimezone(self.zone)
        wall = local.replace(tzinfo=None, fold=0)
        if local.fold:
            # In the second pass of a repeated hour the whole first pass is already behind.
            wall += local.replace(fold=0).utcoffset() - local.utcoffset()  # type: ignore[operator]
        walls = croniter(self.expression, wall.replace(second=0, microsecond=0) + _MINUTE,
                         day_or=False)
        try:
            while True:
                instant = self._instant(walls.get_prev(datetime))
                if instant is not None and instant <= at:
                    return instant
        except CroniterBadDateError:
            return None

    def _instant(self, wall: datetime) -> datetime | None:
        """When the wall-clock tick ``wall`` fires, or None when Celery beat skips it."""
        # fold=0: a repeated time means its first occurrence; a skipped time is read with the
        # offset before the jump, which lands it the jump's length later, as in Celery.
        instant = wall.replace(tzinfo=self.zone).astimezone(_UTC)
        jump = self._jump_before(instant)
        if jump is None or jump.late is None:
            return instant
        if wall < jump.end:  # skipped: only the first skipped tick fires
            return instant if wall == jump.first_skipped else None
        # Beat goes on from the late tick, so the ticks up to it do not run.
        return instant if instant > jump.late else None

    def _jump_before(self, instant: datetime) -> _Jump | None:
        """The forward clock jump in the window before ``instant``, if there is one."""
        before = instant - _JUMP_WINDOW
        offset_before = before.astimezone(self.zone).utcoffset()
        offset_after = instant.astimezone(self.zone).utcoffset()
        if offset_before is None or offset_after is None or offset_before >= offset_after:
            return None
        for jump in self._jumps.values():
            if before < jump.at <= instant:
                return jump
        low, high = 0, int(_JUMP_WINDOW.total_seconds())  # bisect to the second of the jump
        while high - low > 1:
            middle = (low + high) // 2
            moment = before + timedelta(seconds=middle)
            if moment.astimezone(self.zone).utcoffset() == offset_after:
                high = middle
            else:
                low = middle
        jumped_at = before + timedelta(seconds=high)
        start = (jumped_at + offset_before).replace(tzinfo=None)
        end = (jumped_at + offset_after).replace(tzinfo=None)
        first = croniter(self.expression, start - _SECOND, day_or=False).get_next(datetime)
        skipped = first < end
        jump = _Jump(at=jumped_at, start=start, end=end,
                     first_skipped=first if skipped else None,
                     late=first.replace(tzinfo=self.zone).astimezone(_UTC) if skipped else None)
        self._jumps[jumped_at] = jump
        return jump

    def __repr__(self) -> str:
        return f"<CrontabTrigger {self.spec}>"


#: The clock a worker's scheduler asks ``is_due`` on (the database's), while it asks.
_scheduler_clock: contextvars.ContextVar[datetime | None] = contextvars.ContextVar(
    "akadze_compat_scheduler_clock", default=None)


@contextlib.contextmanager
def scheduler_clock(now: datetime) -> Iterator[None]:
    """Make a schedule's ``now()`` (without a ``nowfun``) answer ``now`` in this context."""
    token = _scheduler_clock.set(now)
    try:
        yield
    finally:
        _scheduler_clock.reset(token)


def schedule_clock() -> datetime | None:
    """The scheduler's clock in this context, None outside a scheduler's check."""
    return _scheduler_clock.get()


class DueTrigger:
    """Runs a schedule that says itself when it is due: Celery's ``is_due(last_run_at)``.

    For ``solar`` and custom schedules (a subclass overriding ``is_due``, or any object with
    ``is_due`` and ``remaining_estimate``). It has no ticks of its own (``latest`` is None, so
    a new schedule starts from now, as Celery beat's entries do); ``akadze_core``'s scheduler
    gives it the last run kept in the database (``latest_after``) and enqueues the run it
    names only if that last run is still the stored one, so each due run is enqueued once
    across the fleet. ``last_run_at`` is aware, in ``timezone`` (the app's); the schedule's
    ``now()`` is the database's clock unless it has a ``nowfun``.
    """

    def __init__(self, schedule: Any, timezone: str | tzinfo = "UTC") -> None:
        self.schedule = schedule
        self.zone = to_zone(timezone)
        kind = type(schedule)
        # No memory address in the spec: it must read the same in every worker process.
        text = re.sub(r" at 0x[0-9A-Fa-f]+", "", repr(schedule))
        self.spec = (f"celery-is-due {kind.__module__}.{kind.__qualname__} {text} "
                     f"tz={getattr(self.zone, 'key', None) or self.zone}")
        self._wait: float | None = None  # the last is_due's "check again in" (seconds)

    def latest(self, at: datetime) -> datetime | None:
        """None: which runs are due depends on the last one (see ``latest_after``)."""
        return None

    def latest_after(self, last_tick: datetime, at: datetime) -> datetime | None:
        """``at`` when ``is_due(last_tick)`` says a run is due at ``at``, else None."""
        at = _aware(at)
        with scheduler_clock(at):
            due, wait = self.schedule.is_due(_aware(last_tick).astimezone(self.zone))
        self._wait = wait.total_seconds() if isinstance(wait, timedelta) else \
            float(wait) if isinstance(wait, numbers.Real) else None
        return at if due else None

    def next(self, after: datetime) -> datetime:
        """When to ask again: what the last ``is_due`` said (the scheduler bounds it)."""
        wait = self._wait if self._wait is not None and self._wait > 0 else 1.0
        return _aware(after) + timedelta(seconds=min(wait, 86400.0))

    def __repr__(self) -> str:
        return f"<DueTrigger {self.spec}>"


def to_zone(timezone: str | tzinfo) -> tzinfo:
    if not isinstance(timezone, str):
        return timezone
    try:
        return ZoneInfo(timezone)
    except (ZoneInfoNotFoundError, ValueError):
        raise ValueError(f"unknown time zone {timezone!r}") from None


def _aware(moment: datetime) -> datetime:
    # A naive datetime is UTC, as everywhere in akadze.
    return moment.replace(tzinfo=_UTC) if moment.tzinfo is None else moment


def schedule_timezone(timezone: str | tzinfo | None, enable_utc: bool = True) -> str | tzinfo:
    """The zone Celery evaluates crontabs in: ``timezone`` (the config also finds Django's
    ``TIME_ZONE`` under this name), else UTC with ``enable_utc``, else the system's zone."""
    if timezone:
        return timezone
    if enable_utc:
        return "UTC"
    return _system_zone()


def _system_zone() -> str | tzinfo:
    name = os.environ.get("TZ", "").lstrip(":")
    if name:
        return name
    try:
        target = os.path.realpath("/etc/localtime")
        if "/zoneinfo/" in target:
            return target.split("/zoneinfo/", 1)[1]
        with open("/etc/localtime", "rb") as source:
            return ZoneInfo.from_file(source, key="localtime")
    except (OSError, ValueError):
        return "UTC"
