"""Celery's periodic schedules (``celery.schedules``), turned into akadze schedule triggers.

What users write in ``beat_schedule`` and ``add_periodic_task`` works unchanged:
``crontab(...)``, ``crontab.from_string('m h dom mon dow')``, ``schedule(run_every=...)``,
plain seconds and timedeltas. Each becomes a *trigger* for ``akadze_core``'s
``App.add_schedule`` (``latest(at)``, ``next(after)``, ``spec``), evaluated by every worker,
so there is no beat process. :func:`entry_to_schedule` normalizes one beat entry.

How crontab ticks follow Celery beat, in the app's zone (``timezone``/``enable_utc``):

- A tick is a wall-clock minute where all five fields match: day of month AND day of week
  (Celery ANDs them; Vixie cron ORs them).
- A repeated wall time (clocks set back) fires once, on its first occurrence.
- Wall times skipped by a forward jump: the first skipped tick fires late, at the same
  wall time plus the jump (``02:30`` becomes ``03:30``), and the ticks after it up to that
  instant are skipped. This is the sequence Celery beat produces while it runs. Asked from
  inside a repeated hour's second pass, Celery's ``remaining_estimate`` names a time already
  past (beat would run again), and asked between a jump and its late tick it forgets that
  tick; the triggers keep to the running sequence there.

Deliberate differences from Celery (also in the migration guide):

- Interval schedules tick on a fixed grid (multiples of the interval since the Unix epoch,
  UTC), not one interval after beat started or after the previous run, so runs do not drift.
- ``schedule(..., relative=True)`` ticks on the zone's clock: the interval is rounded down
  to whole days, hours or minutes as Celery rounds it, and runs at those clock boundaries
  counted from midnight when that unit divides a day (an hour) evenly, else on the epoch grid.
- ``is_due()`` and ``remaining_estimate()`` raise ``NotImplementedError``: workers compute
  ticks with the triggers; nothing polls a schedule.
- crontab fields given as iterables must hold integers (Celery accepts ``[1.5]`` and then
  fails when beat runs it); ``solar`` raises ``NotImplementedError``.
"""

from __future__ import annotations

import numbers
import os
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta, tzinfo
from datetime import timezone as dt_timezone
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from croniter import CroniterBadDateError, croniter

from akadze_core import Every, Trigger

__all__ = [
    "BaseSchedule",
    "CrontabTrigger",
    "ParseException",
    "PeriodicEntry",
    "crontab",
    "crontab_parser",
    "entry_to_schedule",
    "maybe_schedule",
    "schedule",
    "schedule_timezone",
    "solar",
    "to_trigger",
]

Cronspec = int | str | Iterable[int]

_UTC = dt_timezone.utc
_SECOND = timedelta(seconds=1)
_MINUTE = timedelta(minutes=1)
_HOUR = timedelta(hours=1)
_DAY = timedelta(days=1)
#: How far back to look for a forward clock jump whose skipped tick may still fire late: as
#: long as the longest jump (an hour in practice; a day when Samoa skipped 30 December 2011).
_JUMP_WINDOW = timedelta(hours=25)

_MONTH_NAMES = ("jan", "feb", "mar", "apr", "may", "jun",
                "jul", "aug", "sep", "oct", "nov", "dec")
_DAY_NAMES = ("sun", "mon", "tue", "wed", "thu", "fri", "sat")
# Celery's validity check uses the longest February, so the 29th of February is allowed.
_LONGEST_MONTH = (31, 29, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31)

# Celery matches each comma-separated part with re.match, anchored at the start only: text
# after a complete range or step is ignored ('1-5/2/9' means '1-5/2'), and we accept the same.
_RANGE_PART = re.compile(r"(?P<first>\w+?)-(?P<last>\w+)(?P<slash>/(?P<step>\w+)?)?")
_STAR_PART = re.compile(r"\*(?:(?P<slash>/(?P<step>\w+)?)|$)")


class ParseException(Exception):
    """A crontab field that cannot be parsed (empty part or step, negative number)."""


# --- field parsing --------------------------------------------------------------------------


class crontab_parser:
    """Expand one crontab field (``'*/15'``, ``'mon-fri'``, ``'1,13,30-45,50-59/2'``).

    Values run from ``min_`` to ``min_ + max_ - 1``. A part is ``*``, a number or a name
    (month names first, then weekday names, by their first three letters, in any field),
    or a range ``a-b`` that wraps past the maximum when ``b < a`` (``'sat-sun'``), each
    optionally with a step ``/n`` applied to the expanded list in order.
    """

    ParseException = ParseException

    def __init__(self, max_: int = 60, min_: int = 0) -> None:
        self.max_ = max_
        self.min_ = min_

    def parse(self, spec: str) -> set[int]:
        """The set of values ``spec`` names; ValueError or ParseException when invalid."""
        values: set[int] = set()
        for part in spec.split(","):
            if not part:
                raise ParseException("empty part")
            values.update(self._part(part))
        return values

    def _part(self, part: str) -> list[int]:
        match = _RANGE_PART.match(part)
        if match:
            step = self._step(match)  # an empty step is reported before a bad bound
            values = self._span(self._number(match["first"]), self._number(match["last"]))
            return values if step is None else values[::int(step)]
        match = _STAR_PART.match(part)
        if match:
            step = self._step(match)
            values = list(range(self.min_, self.min_ + self.max_))
            return values if step is None else values[::int(step)]
        return [self._number(part)]

    @staticmethod
    def _step(match: re.Match[str]) -> str | None:
        if match["slash"] is None:
            return None
        if not match["step"]:
            raise ParseException("empty filter")
        return match["step"]

    def _span(self, first: int, last: int) -> list[int]:
        if last < first:  # wraps: 'fri-mon' is fri, sat, sun, mon
            return [*range(first, self.min_ + self.max_), *range(self.min_, last + 1)]
        return list(range(first, last + 1))

    def _number(self, token: str) -> int:
        if token.startswith("-"):
            raise ParseException("negative numbers not supported")
        try:
            value = int(token)
        except ValueError:
            value = _named_value(token)
        highest = self.min_ + self.max_ - 1
        if value > highest:
            raise ValueError(f"Invalid end range: {value} > {highest}.")
        if value < self.min_:
            raise ValueError(f"Invalid beginning range: {value} < {self.min_}.")
        return value


def _named_value(token: str) -> int:
    abbreviation = token[:3].lower()
    if abbreviation in _MONTH_NAMES:
        return _MONTH_NAMES.index(abbreviation) + 1
    if abbreviation in _DAY_NAMES:
        return _DAY_NAMES.index(abbreviation)
    raise ValueError(f"Invalid weekday literal {token!r}.")


def _expand(spec: Cronspec, max_: int, min_: int = 0) -> set[int]:
    if isinstance(spec, int):
        values = {spec}
    elif isinstance(spec, str):
        values = crontab_parser(max_, min_).parse(spec)
    elif isinstance(spec, Iterable):
        values = set(spec)
    else:
        raise TypeError(
            "Argument cronspec needs to be of any of the following types: "
            f"int, str, or an iterable type. {type(spec)!r} was given.")
    for value in values:
        if not isinstance(value, int):
            raise TypeError(f"crontab values must be integers, got {value!r} in {spec!r}")
        if value >= max_ + min_ or value < min_:
            raise ValueError(
                f"Invalid crontab pattern.  Valid range is {min_}-{max_ - 1 + min_}. "
                f"'{value}' was found.")
    return values


# --- schedules ------------------------------------------------------------------------------


class BaseSchedule:
    """Base of Celery schedule objects: ``nowfun`` and ``app`` are kept for compatibility."""

    def __init__(self, nowfun: Callable[[], datetime] | None = None, app: Any = None) -> None:
        self.nowfun = nowfun
        self.app = app

    def now(self) -> datetime:
        """``nowfun()``, else the current time in UTC."""
        return self.nowfun() if self.nowfun else datetime.now(_UTC)

    def remaining_estimate(self, last_run_at: datetime) -> timedelta:
        """Not available: akadze workers compute ticks with :meth:`trigger`."""
        raise NotImplementedError(
            "remaining_estimate() is not available in akadze_compat: schedules run in the "
            "workers, which compute ticks with trigger(timezone)")

    def is_due(self, last_run_at: datetime) -> tuple[bool, float]:
        """Not available: akadze workers compute ticks with :meth:`trigger`."""
        raise NotImplementedError(
            "is_due() is not available in akadze_compat: schedules run in the workers, "
            "which compute ticks with trigger(timezone)")

    def __eq__(self, other: object) -> bool:
        if isinstance(other, BaseSchedule):
            return other.nowfun == self.nowfun
        return NotImplemented


class schedule(BaseSchedule):
    """Run every ``run_every`` (seconds or a timedelta).

    ``relative=True`` aligns runs to the clock at the interval's resolution (see the module
    docstring); the trigger rejects an interval that is not positive.
    """

    relative: bool = False

    def __init__(self, run_every: float | timedelta | None = None, relative: bool = False,
                 nowfun: Callable[[], datetime] | None = None, app: Any = None) -> None:
        self.run_every: Any = (timedelta(seconds=run_every)
                               if isinstance(run_every, numbers.Real) else run_every)
        self.relative = relative
        super().__init__(nowfun=nowfun, app=app)

    @property
    def seconds(self) -> float:
        """The interval in seconds, never negative."""
        return max(self.run_every.total_seconds(), 0)

    @property
    def human_seconds(self) -> str:
        """The interval in words, as Celery writes it (``'1.00 minute'``, ``'now'``)."""
        return _humanize_seconds(self.seconds)

    def trigger(self, timezone: str | tzinfo = "UTC") -> Trigger:
        """The akadze trigger for this interval (``timezone`` matters only when relative)."""
        interval = self.run_every
        if not isinstance(interval, timedelta) or interval <= timedelta(0):
            raise ValueError(f"schedule(run_every={interval!r}) cannot drive periodic runs: "
                             "the interval must be a positive number of seconds or timedelta")
        if self.relative:
            return _clock_aligned(interval, timezone)
        return Every(interval)

    def __repr__(self) -> str:
        return f"<freq: {self.human_seconds}>"

    def __eq__(self, other: object) -> bool:
        if isinstance(other, schedule):
            return bool(self.run_every == other.run_every)
        return bool(self.run_every == other)


class crontab(BaseSchedule):
    """A cron-like schedule with Celery's semantics (see the module docstring).

    Each field is an int, a string pattern (``'*/15'``, ``'mon-fri'``, ``'jan,jul'``), or an
    iterable of ints; day_of_week runs 0-6 from Sunday. The expanded sets are the attributes
    ``minute``, ``hour``, ``day_of_week``, ``day_of_month`` and ``month_of_year``; the values
    as given are ``_orig_minute`` etc. ``ValueError`` (or Celery's ``ParseException``) for an
    invalid field, and when no day of month occurs in the chosen months.
    """

    def __init__(self, minute: Cronspec = "*", hour: Cronspec = "*",
                 day_of_week: Cronspec = "*", day_of_month: Cronspec = "*",
                 month_of_year: Cronspec = "*", **kwargs: Any) -> None:
        self._orig_minute = "*" if minute is None else minute
        self._orig_hour = "*" if hour is None else hour
        self._orig_day_of_week = "*" if day_of_week is None else day_of_week
        self._orig_day_of_month = "*" if day_of_month is None else day_of_month
        self._orig_month_of_year = "*" if month_of_year is None else month_of_year
        self._orig_kwargs = kwargs
        # Celery's order, so that the first invalid field reported is the same.
        self.hour = _expand(hour, 24)
        self.minute = _expand(minute, 60)
        self.day_of_week = _expand(day_of_week, 7)
        self.day_of_month = _expand(day_of_month, 31, 1)
        self.month_of_year = _expand(month_of_year, 12, 1)
        if not any(day <= _LONGEST_MONTH[month - 1]
                   for month in self.month_of_year for day in self.day_of_month):
            raise ValueError(
                f"Invalid crontab: day_of_month {self._orig_day_of_month!r} never occurs in "
                f"month_of_year {self._orig_month_of_year!r}.")
        super().__init__(**kwargs)

    @classmethod
    def from_string(cls, crontab: str) -> crontab:
        """A crontab from ``'minute hour day_of_month month_of_year day_of_week'``."""
        minute, hour, day_of_month, month_of_year, day_of_week = crontab.split(" ")
        return cls(minute, hour, day_of_week, day_of_month, month_of_year)

    @property
    def expression(self) -> str:
        """The expanded five-field cron expression (numbers only, Sunday = 0)."""
        return " ".join(_field_text(values, low, high) for values, low, high in (
            (self.minute, 0, 59), (self.hour, 0, 23), (self.day_of_month, 1, 31),
            (self.month_of_year, 1, 12), (self.day_of_week, 0, 6)))

    def trigger(self, timezone: str | tzinfo = "UTC") -> CrontabTrigger:
        """The akadze trigger for this crontab, evaluated in ``timezone``."""
        for name in ("minute", "hour", "day_of_week", "day_of_month", "month_of_year"):
            if not getattr(self, name):  # crontab(minute=[]) passes Celery's checks
                raise ValueError(f"{self!r} never runs: its {name} set is empty")
        return CrontabTrigger(self.expression, timezone)

    def __repr__(self) -> str:
        return (f"<crontab: {self._orig_minute} {self._orig_hour} {self._orig_day_of_month} "
                f"{self._orig_month_of_year} {self._orig_day_of_week} (m/h/dM/MY/d)>")

    def __eq__(self, other: object) -> bool:
        if isinstance(other, crontab):
            return (other.month_of_year == self.month_of_year
                    and other.day_of_month == self.day_of_month
                    and other.day_of_week == self.day_of_week
                    and other.hour == self.hour
                    and other.minute == self.minute
                    and super().__eq__(other))
        return NotImplemented


class solar(BaseSchedule):
    """Celery's sunrise/sunset schedules: not supported, construction raises."""

    def __init__(self, event: str, lat: float, lon: float, **kwargs: Any) -> None:
        raise NotImplementedError(
            f"solar schedules (celery.schedules.solar, here {event!r} at {lat}, {lon}) are "
            "not supported by akadze_compat; use a crontab in the app's timezone instead")


def maybe_schedule(s: Any, relative: bool = False, app: Any = None) -> Any:
    """A number of seconds or a timedelta as a :class:`schedule`; schedules pass through."""
    if s is None:
        return None
    if isinstance(s, numbers.Real):
        s = timedelta(seconds=float(s))
    if isinstance(s, timedelta):
        return schedule(s, relative, app=app)
    if isinstance(s, BaseSchedule):
        s.app = app
    return s


def _humanize_seconds(seconds: float) -> str:
    seconds = float(format(float(seconds), ".2f"))  # Celery rounds before choosing the unit
    for unit, size in (("day", 86400.0), ("hour", 3600.0), ("minute", 60.0), ("second", 1.0)):
        if seconds >= size:
            amount = seconds / size
            return f"{amount:.2f} {unit}{'' if amount == 1 else 's'}"
    return "now"


def _field_text(values: set[int], low: int, high: int) -> str:
    """``'*'`` for every value, else sorted runs (``'1-5,9'``): stable text for ``spec``."""
    if values == set(range(low, high + 1)):
        return "*"
    runs: list[list[int]] = []
    for value in sorted(values):
        if runs and value == runs[-1][1] + 1:
            runs[-1][1] = value
        else:
            runs.append([value, value])
    return ",".join(str(a) if a == b else f"{a}-{b}" for a, b in runs)


# --- triggers -------------------------------------------------------------------------------


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
        self.zone = _zone(timezone)
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


def _zone(timezone: str | tzinfo) -> tzinfo:
    if not isinstance(timezone, str):
        return timezone
    try:
        return ZoneInfo(timezone)
    except (ZoneInfoNotFoundError, ValueError):
        raise ValueError(f"unknown time zone {timezone!r}") from None


def _aware(moment: datetime) -> datetime:
    # A naive datetime is UTC, as everywhere in akadze.
    return moment.replace(tzinfo=_UTC) if moment.tzinfo is None else moment


def _clock_aligned(interval: timedelta, timezone: str | tzinfo) -> Trigger:
    """Celery's ``relative=True``: the interval rounded down to its unit, on the zone's clock."""
    for unit, span, field_name in ((_DAY, _DAY, "day"), (_HOUR, _DAY, "hour"),
                                   (_MINUTE, _HOUR, "minute")):
        if interval >= unit:
            rounded = (interval // unit) * unit
            if span % rounded:
                return Every(rounded)
            step = rounded // unit
            if field_name == "day":
                return crontab(minute=0, hour=0).trigger(timezone)
            if field_name == "hour":
                return crontab(minute=0, hour=range(0, 24, step)).trigger(timezone)
            return crontab(minute=range(0, 60, step)).trigger(timezone)
    return Every(interval)  # under a minute Celery does not round


def to_trigger(value: Any, timezone: str | tzinfo = "UTC", relative: bool = False) -> Trigger:
    """The trigger for a ``beat_schedule`` value: seconds, timedelta, schedule, crontab, or
    an object that already is a trigger (``latest``/``next``/``spec``)."""
    if isinstance(value, (numbers.Real, timedelta)):
        value = maybe_schedule(value, relative)
    if isinstance(value, (schedule, crontab)):
        return value.trigger(timezone)
    if isinstance(value, Trigger):
        return value
    if isinstance(value, BaseSchedule):
        raise NotImplementedError(
            f"custom schedule {type(value).__name__}: akadze workers compute ticks ahead "
            "and cannot poll is_due(); give it latest(at), next(after) and spec")
    raise TypeError(f"a periodic task's schedule must be seconds, a timedelta, schedule or "
                    f"crontab, not {value!r}")


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


# --- beat_schedule entries ------------------------------------------------------------------

#: Celery options stored with each run in ``meta["celery"]`` (see the compat plan).
_META_OPTIONS = ("headers", "time_limit", "soft_time_limit", "ignore_result", "routing_key")


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
                      app_timezone: str | tzinfo = "UTC") -> PeriodicEntry:
    """Normalize ``beat_schedule[name]`` (``task``, ``schedule``, ``args``, ``kwargs``,
    ``options``, ``relative``) evaluated in ``app_timezone`` (see :func:`schedule_timezone`).

    ``options['expires']`` in seconds (or a timedelta) expires each run that long after it
    is enqueued; a datetime (or ISO text) is a deadline for every run, kept in the meta.
    """
    if not entry.get("task"):
        raise ValueError(f"beat_schedule entry {name!r} has no 'task'")
    if entry.get("schedule") is None:
        raise ValueError(f"beat_schedule entry {name!r} has no 'schedule'")
    trigger = to_trigger(entry["schedule"], app_timezone, bool(entry.get("relative", False)))
    options = dict(entry.get("options") or {})
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
        deadline = deadline.replace(tzinfo=_zone(timezone))
    return None, deadline.astimezone(_UTC)
