"""Celery's periodic schedules (``celery.schedules``), turned into akadze schedule triggers.

What users write in ``beat_schedule`` and ``add_periodic_task`` works unchanged:
``crontab(...)``, ``crontab.from_string('m h dom mon dow')``, ``schedule(run_every=...)``,
plain seconds and timedeltas. Each becomes a *trigger* for ``akadze_core``'s
``App.add_schedule`` (``latest(at)``, ``next(after)``, ``spec``), evaluated by every worker,
so there is no beat process (``akadze_compat.beat`` registers the entries). How a crontab
ticks across clock changes, as Celery beat does, is in ``akadze_compat._triggers``.

Deliberate differences from Celery (also in the migration guide):

- Interval schedules tick on a fixed grid (multiples of the interval since the Unix epoch,
  UTC), not one interval after beat started or after the previous run, so runs do not drift.
- ``schedule(..., relative=True)`` ticks on the zone's clock: the interval is rounded down
  to whole days, hours or minutes as Celery rounds it, and runs at those clock boundaries
  counted from midnight when that unit divides a day (an hour) evenly, else on the epoch grid.
- ``is_due()`` and ``remaining_estimate()`` raise ``NotImplementedError``: workers compute
  ticks with the triggers; nothing polls a schedule.
- crontab fields given as iterables must hold integers (Celery accepts ``[1.5]`` and then
  fails when beat runs it); a ``solar`` schedule is built (and checked) as in Celery, but
  cannot run: its ``trigger()`` raises ``NotImplementedError``, so a worker refuses to start
  with one in its beat schedule.
"""

from __future__ import annotations

import numbers
import re
from collections.abc import Callable, Iterable
from datetime import datetime, timedelta, tzinfo
from datetime import timezone as dt_timezone
from typing import Any

from akadze_core import Every, Trigger

from ._triggers import CrontabTrigger

__all__ = [
    "BaseSchedule",
    "ParseException",
    "crontab",
    "crontab_parser",
    "maybe_schedule",
    "schedule",
    "solar",
]

Cronspec = int | str | Iterable[int]

_UTC = dt_timezone.utc
_MINUTE = timedelta(minutes=1)
_HOUR = timedelta(hours=1)
_DAY = timedelta(days=1)

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
    """Celery's sunrise/sunset schedule: checked as Celery checks it, but it cannot run here.

    ``event`` is one of Celery's solar events, ``lat`` in [-90, 90], ``lon`` in [-180, 180]
    (ValueError otherwise). ``trigger()`` raises ``NotImplementedError``: a worker whose beat
    schedule holds one refuses to start, naming the entry.
    """

    EVENTS = frozenset({
        "dawn_astronomical", "dawn_nautical", "dawn_civil", "sunrise", "solar_noon",
        "sunset", "dusk_civil", "dusk_nautical", "dusk_astronomical",
    })

    def __init__(self, event: str, lat: float, lon: float, **kwargs: Any) -> None:
        self.event = event
        self.lat = lat
        self.lon = lon
        super().__init__(**kwargs)
        if event not in self.EVENTS:
            raise ValueError(f"Argument event \"{event}\" is invalid, must be one of "
                             f"{', '.join(sorted(self.EVENTS))}")
        if lat < -90 or lat > 90:
            raise ValueError(f"Argument latitude {lat} is invalid, must be between -90 and 90.")
        if lon < -180 or lon > 180:
            raise ValueError(
                f"Argument longitude {lon} is invalid, must be between -180 and 180.")

    def trigger(self, timezone: str | tzinfo = "UTC") -> Trigger:
        """Not available: solar schedules need an ephemeris, which akadze_compat lacks."""
        raise NotImplementedError(
            f"solar schedules (celery.schedules.solar, here {self.event!r} at {self.lat}, "
            f"{self.lon}) are not supported by akadze_compat; use a crontab in the app's "
            "timezone instead")

    def __repr__(self) -> str:
        return f"<solar: {self.event} at latitude {self.lat}, longitude {self.lon}>"

    def __eq__(self, other: object) -> bool:
        if isinstance(other, solar):
            return (other.event, other.lat, other.lon) == (self.event, self.lat, self.lon)
        return NotImplemented


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
