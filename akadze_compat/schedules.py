"""Celery's periodic schedules (``celery.schedules``), turned into akadze schedule triggers.

What users write in ``beat_schedule`` and ``add_periodic_task`` works unchanged:
``crontab(...)``, ``crontab.from_string('m h dom mon dow')``, ``schedule(run_every=...)``,
``solar(...)``, plain seconds and timedeltas, and custom schedule classes. A ``crontab`` or
``schedule`` becomes a *trigger* for ``akadze_core``'s ``App.add_schedule`` (``latest(at)``,
``next(after)``, ``spec``), evaluated by every worker, so there is no beat process
(``akadze_compat.beat`` registers the entries). How a crontab ticks across clock changes, as
Celery beat does, is in ``akadze_compat._triggers``.

``remaining_estimate(last_run_at)`` and ``is_due(last_run_at)`` answer as Celery 5.7's do, to
the microsecond, with ``nowfun`` or the app's clock (``tests/compat/test_schedule_api.py``
checks them against Celery on thousands of random cases). A ``solar`` schedule, and a custom
schedule (a subclass that overrides ``is_due``, or any object with ``is_due`` and
``remaining_estimate``), runs the way Celery beat runs it: the workers ask ``is_due`` with the
time of the last run, kept in the database, and each due run is enqueued once across the
fleet (``_triggers.DueTrigger``).

Deliberate differences from Celery (also in the migration guide):

- Interval schedules tick on a fixed grid (multiples of the interval since the Unix epoch,
  UTC), not one interval after beat started or after the previous run, so runs do not drift.
- ``schedule(..., relative=True)`` ticks on the zone's clock: the interval is rounded down
  to whole days, hours or minutes as Celery rounds it, and runs at those clock boundaries
  counted from midnight when that unit divides a day (an hour) evenly, else on the epoch grid.
- crontab fields given as iterables must hold integers (Celery accepts ``[1.5]`` and then
  fails when beat runs it).
- ``solar`` needs the ``ephem`` package (``pip install 'akadze[solar]'``) to compute, as in
  Celery, but is built without it: a worker whose beat schedule holds one refuses to start
  with one line saying so, instead of the project's import failing.
"""

from __future__ import annotations

import numbers
import re
from collections.abc import Callable, Iterable
from datetime import date, datetime, time, timedelta, tzinfo
from datetime import timezone as dt_timezone
from typing import Any, NamedTuple
from zoneinfo import ZoneInfo

from akadze_core import Every, Trigger

from . import _state
from ._triggers import CrontabTrigger, DueTrigger, schedule_clock, to_zone
from .exceptions import ImproperlyConfigured

__all__ = [
    "BaseSchedule",
    "ParseException",
    "crontab",
    "crontab_parser",
    "maybe_schedule",
    "schedstate",
    "schedule",
    "solar",
]


class schedstate(NamedTuple):
    """What ``is_due`` returns: is a run due now, and seconds until it should be asked again."""

    is_due: bool
    next: float

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
    """Base of Celery schedule objects: their clock (``nowfun``, else the app's), their
    app (``app``, else the current app) and its time zone (``tz``)."""

    def __init__(self, nowfun: Callable[[], datetime] | None = None, app: Any = None) -> None:
        self.nowfun = nowfun
        self._app = app

    @property
    def app(self) -> Any:
        """The app given, else the current app."""
        return self._app if self._app is not None else _state.get_current_app()

    @app.setter
    def app(self, app: Any) -> None:
        self._app = app

    @property
    def tz(self) -> tzinfo:
        """The app's time zone (``timezone``, UTC by default): naive times are read in it."""
        return _zone_of(self.app)

    @property
    def utc_enabled(self) -> bool:
        """The app's ``enable_utc``."""
        return bool(self.app.conf.enable_utc)

    def now(self) -> datetime:
        """``nowfun()``; else, inside a worker's scheduler, the database's clock; else the
        app's ``now()`` (its time zone)."""
        if self.nowfun:
            return self.nowfun()
        clock = schedule_clock()
        if clock is not None:
            return clock.astimezone(self.tz)
        return datetime.now(self.tz)

    def maybe_make_aware(self, dt: datetime, naive_as_utc: bool = True) -> datetime:
        """``dt`` unchanged when aware; a naive one read as UTC (``naive_as_utc``) or as the
        app's wall clock, in the app's zone."""
        if dt.tzinfo is not None and dt.utcoffset() is not None:
            return dt
        if naive_as_utc:
            return dt.replace(tzinfo=_UTC).astimezone(self.tz)
        return dt.replace(tzinfo=self.tz)

    def to_local(self, dt: datetime) -> datetime:
        """``dt``, in the system's zone when the app does not enable UTC."""
        return dt if self.utc_enabled else self.maybe_make_aware(dt).astimezone()

    def remaining_estimate(self, last_run_at: datetime) -> timedelta:
        """How long from now until the run after ``last_run_at``: subclasses say."""
        raise NotImplementedError()

    def is_due(self, last_run_at: datetime) -> tuple[bool, float]:
        """``(is due now, seconds until the next check)``: subclasses say."""
        raise NotImplementedError()

    def __eq__(self, other: object) -> bool:
        if isinstance(other, BaseSchedule):
            return other.nowfun == self.nowfun
        return NotImplemented


def _zone_of(app: Any) -> tzinfo:
    zone = getattr(app, "timezone", None)
    return zone if isinstance(zone, tzinfo) else _UTC


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

    def remaining_estimate(self, last_run_at: datetime) -> timedelta:
        """Time from now until one interval after ``last_run_at`` (naive means UTC); with
        ``relative``, until the clock boundary that interval rounds down to (Celery's rule)."""
        start = self.maybe_make_aware(last_run_at)
        now = self.maybe_make_aware(self.now())
        if self.relative:
            deadline = _relative_deadline(start, self.run_every)
        else:
            # Elapsed time, as Celery adds it: the interval through float seconds.
            deadline = start.astimezone(_UTC) + timedelta(seconds=self.run_every.total_seconds())
        return deadline - now.astimezone(_UTC)

    def is_due(self, last_run_at: datetime) -> schedstate:
        """``(due, seconds to the next check)``: due once the interval has passed, and then
        checked again one interval later (relative: at the next clock boundary)."""
        last_run_at = self.maybe_make_aware(last_run_at)
        remaining = self.remaining_estimate(last_run_at).total_seconds()
        if remaining > 0:
            return schedstate(False, remaining)
        wait: float = self.seconds
        if self.relative:
            now = self.maybe_make_aware(self.now()).astimezone(last_run_at.tzinfo)
            boundary = self.remaining_estimate(now).total_seconds()
            if boundary > 0:
                wait = boundary
        return schedstate(True, wait)

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

    def remaining_delta(self, last_run_at: datetime, tz: str | tzinfo | None = None
                        ) -> tuple[datetime, timedelta, datetime]:
        """``(last_run_at, delta, now)`` in the schedule's zone (``tz``, else the app's):
        ``last_run_at + delta`` is the next run, found on the wall clock as Celery does."""
        zone = to_zone(tz) if tz else self.tz
        last = self.maybe_make_aware(last_run_at).astimezone(zone)
        now = self.maybe_make_aware(self.now()).astimezone(zone)
        wall = last.replace(tzinfo=None)
        return last, self._next_wall(wall) - wall, now

    def remaining_estimate(self, last_run_at: datetime) -> timedelta:
        """Time from now until the next run after ``last_run_at`` (negative when missed)."""
        last, delta, now = self.remaining_delta(last_run_at)
        # The wall time read with its first offset (a skipped one lands after the jump).
        return (last + delta).astimezone(_UTC) - now.astimezone(_UTC)

    def is_due(self, last_run_at: datetime) -> schedstate:
        """``(due, seconds to the next check)``. With ``beat_cron_starting_deadline``, a run
        missed longer ago than that many seconds is not due (the next one is awaited)."""
        remaining = self.remaining_estimate(last_run_at).total_seconds()
        due = remaining <= 0
        conf = getattr(self.app, "conf", None)
        deadline = getattr(conf, "beat_cron_starting_deadline", None) if conf else None
        stale = False
        if deadline is not None and remaining < 0:
            now = self.maybe_make_aware(self.now())
            # A run exactly ``deadline`` ago still counts.
            since = (now.astimezone(_UTC) - timedelta(seconds=deadline, microseconds=1)
                     ).astimezone(now.tzinfo)
            stale = self.remaining_estimate(since).total_seconds() > 0
            due = due and not stale
        if due or stale:
            remaining = self.remaining_estimate(self.now()).total_seconds()
        return schedstate(due, max(remaining, 0))

    def _next_wall(self, wall: datetime) -> datetime:
        """The wall time of the run after ``wall``: later in the same hour, else later the
        same day, else on the next day that qualifies at the first hour and minute."""
        minutes, hours = sorted(self.minute), sorted(self.hour)
        weekday = wall.isoweekday() % 7
        today = (wall.month in self.month_of_year and wall.day in self.day_of_month
                 and weekday in self.day_of_week)
        if today and wall.hour in self.hour and wall.minute < minutes[-1]:
            minute = next(m for m in minutes if m > wall.minute)
            return wall.replace(minute=minute, second=0, microsecond=0)
        if today and wall.hour < hours[-1]:
            hour = next(h for h in hours if h > wall.hour)
            return wall.replace(hour=hour, minute=minutes[0], second=0, microsecond=0)
        if self._orig_day_of_month == "*" and self._orig_month_of_year == "*":
            # Only weekdays restrict the day: the next listed one, a week on for today's.
            ahead = min((day - weekday) % 7 or 7 for day in self.day_of_week)
            day = wall.date() + timedelta(days=ahead)
        else:
            day = self._next_date(wall.date())
        return datetime.combine(day, time(hours[0], minutes[0]))

    def _next_date(self, after: date) -> date:
        """The first date after ``after`` whose month, day and weekday all match."""
        days, months = sorted(self.day_of_month), sorted(self.month_of_year)
        for year in range(after.year, after.year + 2000):
            for month in months:
                if (year, month) < (after.year, after.month):
                    continue
                for day in days:
                    if (year, month, day) <= (after.year, after.month, after.day):
                        continue
                    try:
                        candidate = date(year, month, day)
                    except ValueError:
                        break  # later days of this month do not exist either
                    if candidate.isoweekday() % 7 in self.day_of_week:
                        return candidate
        raise RuntimeError("unable to rollover, time specification is probably invalid")

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


#: What each solar event is, for ephem: (horizon, Observer method, use the sun's centre).
_SOLAR_EVENTS: dict[str, tuple[str, str, bool]] = {
    "dawn_astronomical": ("-18", "next_rising", True),
    "dawn_nautical": ("-12", "next_rising", True),
    "dawn_civil": ("-6", "next_rising", True),
    "sunrise": ("-0:34", "next_rising", False),
    "solar_noon": ("0", "next_transit", False),
    "sunset": ("-0:34", "next_setting", False),
    "dusk_civil": ("-6", "next_setting", True),
    "dusk_nautical": ("-12", "next_setting", True),
    "dusk_astronomical": ("-18", "next_setting", True),
}
#: The one line a worker (or a call) stops with when ephem is not installed.
EPHEM_MISSING = ("solar schedules need the ephem package, which is not installed: "
                 "pip install 'akadze[solar]' (or pip install ephem)")


def _ephem() -> Any:
    try:
        import ephem  # an optional dependency: the "solar" extra
    except ImportError:
        raise ImproperlyConfigured(EPHEM_MISSING) from None
    return ephem


class solar(BaseSchedule):
    """Run at a sunrise, sunset or other solar event seen from ``lat``/``lon``, as Celery
    does (with ephem: the "solar" extra).

    ``event`` is one of :attr:`EVENTS`, ``lat`` in [-90, 90], ``lon`` in [-180, 180]
    (ValueError otherwise). Built without ephem; computing (``remaining_estimate``,
    ``is_due``, ``trigger()``, so a worker starting) raises ``ImproperlyConfigured`` with
    :data:`EPHEM_MISSING` when it is not installed.
    """

    EVENTS = frozenset(_SOLAR_EVENTS)
    #: Days to search ahead for an event that does not happen every day (polar day, night).
    max_search_days = 366

    def __init__(self, event: str, lat: float, lon: float, **kwargs: Any) -> None:
        self.event = event
        self.lat = lat
        self.lon = lon
        super().__init__(**kwargs)
        if event not in self.EVENTS:
            raise ValueError(f"Argument event \"{event}\" is invalid, must be one of "
                             f"{', '.join(sorted(self.EVENTS))}.")
        if lat < -90 or lat > 90:
            raise ValueError(f"Argument latitude {lat} is invalid, must be between -90 and 90.")
        if lon < -180 or lon > 180:
            raise ValueError(
                f"Argument longitude {lon} is invalid, must be between -180 and 180.")
        self.horizon, self.method, self.use_center = _SOLAR_EVENTS[event]
        self._observer: Any = None

    @property
    def ephem(self) -> Any:
        """The ephem module (``ImproperlyConfigured`` when it is not installed)."""
        return _ephem()

    @property
    def cal(self) -> Any:
        """The ephem ``Observer`` at ``lat``/``lon``, at sea level, without refraction."""
        if self._observer is None:
            observer = self.ephem.Observer()
            observer.lat, observer.lon = str(self.lat), str(self.lon)
            observer.elev, observer.pressure, observer.horizon = 0, 0, self.horizon
            self._observer = observer
        return self._observer

    def _next_event(self, start: Any) -> Any:
        """The first event after ``start`` (an ephem Date): where the sun does not cross the
        horizon that day, the search goes on from the next anti-transit, up to
        ``max_search_days``; then the moment it stopped, for the next check."""
        ephem, observer = self.ephem, self.cal
        sun = ephem.Sun()
        find = getattr(observer, self.method)
        options = {"use_center": True} if self.use_center else {}
        for _ in range(self.max_search_days):
            try:
                return find(sun, start=start, **options)
            except ephem.CircumpolarError:
                start = observer.next_antitransit(sun, start=start)
        return start

    def remaining_estimate(self, last_run_at: datetime) -> timedelta:
        """Time from now until the first event after ``last_run_at`` (naive means UTC)."""
        ephem = self.ephem
        last_run_at = self.maybe_make_aware(last_run_at)
        self.cal.date = last_run_at
        following = self._next_event(ephem.Date(last_run_at)).datetime()  # naive UTC
        now = self.maybe_make_aware(self.now())
        return following.replace(tzinfo=_UTC) - now.astimezone(_UTC)

    def is_due(self, last_run_at: datetime) -> schedstate:
        """``(due, seconds to the next check)``: due once the event after the last run has
        come; then checked again at the event after now."""
        remaining = max(self.remaining_estimate(last_run_at).total_seconds(), 0)
        if remaining == 0:
            return schedstate(True, max(self.remaining_estimate(self.now()).total_seconds(), 0))
        return schedstate(False, remaining)

    def trigger(self, timezone: str | tzinfo = "UTC") -> Trigger:
        """The trigger that runs this schedule in a worker: ``is_due`` against the last run
        (``ImproperlyConfigured`` now when ephem is missing, so the worker does not start)."""
        _ephem()
        return DueTrigger(self, timezone)

    def __repr__(self) -> str:
        return f"<solar: {self.event} at latitude {self.lat}, longitude: {self.lon}>"

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


# --- relative intervals: Celery's rounded deadlines ------------------------------------------


def _relative_deadline(start: datetime, interval: timedelta) -> datetime:
    """When a ``relative=True`` interval that last ran at ``start`` runs next (UTC).

    The interval, added to ``start``, is rounded down to its resolution (day, hour, minute,
    second) on ``start``'s wall clock. A day or more is added in calendar days and the first
    rounded midnight after ``start`` wins; shorter intervals are added in elapsed time and
    take the latest rounded boundary they reach, or, when rounding falls back to ``start`` or
    before (a clock set back), the next boundary that comes after it.
    """
    start_utc = start.astimezone(_UTC)
    if interval >= _DAY:
        end = start + interval  # calendar days: the same wall time, whatever DST does
        later = [moment for moment in _rounded(end, interval) if moment > start_utc]
        return min(later, default=end.astimezone(_UTC))
    end = (start_utc + timedelta(seconds=interval.total_seconds())).astimezone(start.tzinfo)
    reach = start_utc + interval
    candidates = _rounded(end, interval)
    reached = [moment for moment in candidates if moment <= reach]
    best = max(reached) if reached else min(candidates)
    if interval >= _MINUTE and best <= start_utc:
        unit = _HOUR if interval >= _HOUR else _MINUTE
        candidates += _rounded(end + unit, interval) + _rounded(start + interval, interval)
        later = [moment for moment in candidates if moment > start_utc]
        reached = [moment for moment in later if moment <= reach]
        best = max(reached) if reached else min(later, default=reach)
    return best


def _rounded(moment: datetime, interval: timedelta) -> list[datetime]:
    """``moment`` rounded down to ``interval``'s resolution on its wall clock, as the UTC
    instants that wall time names: both passes of a repeated time; a skipped one moved past
    the jump."""
    seconds = max(interval.total_seconds(), 0)
    if seconds >= 86400:
        wall = moment.replace(hour=0, minute=0, second=0, microsecond=0)
    elif seconds >= 3600:
        wall = moment.replace(minute=0, second=0, microsecond=0)
    elif seconds >= 60:
        wall = moment.replace(second=0, microsecond=0)
    else:
        wall = moment.replace(microsecond=0)
    instants = []
    for fold in (0, 1):
        candidate = wall.replace(fold=fold)
        jump = _skipped_by(candidate)
        if jump > timedelta(0):
            candidate += jump  # on the wall clock: the same time after the jump
        instants.append(candidate.astimezone(_UTC))
    return instants


def _skipped_by(wall: datetime) -> timedelta:
    """How far the clock jumped over ``wall`` (aware) if that wall time does not exist in its
    zone, else zero. Only zones that know their transitions (ZoneInfo) have gaps here."""
    zone = wall.tzinfo
    if not (isinstance(zone, ZoneInfo) or hasattr(zone, "is_ambiguous")):
        return timedelta(0)
    try:
        back = wall.astimezone(_UTC).astimezone(zone)
    except (ValueError, OverflowError):
        return timedelta(0)
    if back.replace(tzinfo=None) == wall.replace(tzinfo=None):
        return timedelta(0)
    after = (wall + _DAY).utcoffset()
    before = (wall - _DAY).utcoffset()
    if after is None or before is None:
        return timedelta(0)
    return after - before
