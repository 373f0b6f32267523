"""When schedules fire: cron expressions and fixed intervals, as pure functions of time.

A trigger answers two questions about instants (timezone-aware datetimes, UTC out):
``latest(at)``, the most recent tick at or before ``at``, and ``next(after)``, the first tick
strictly after ``after``. Its ``spec`` is a stable text that changes exactly when the ticks do;
the worker compares it with the stored one to notice a schedule changed between deploys.

A trigger whose ticks depend on when its schedule last ran (Celery's ``is_due``) also has
``latest_after(last_tick, at)`` (``LastRunTrigger``): the scheduler then gives it the last tick
stored in the database, and enqueues the tick it names only while that stored tick is
unchanged, so two workers asking at once never both enqueue a run.
"""

from __future__ import annotations

import re
from datetime import datetime, timedelta, timezone, tzinfo
from decimal import Decimal, InvalidOperation
from functools import lru_cache
from typing import Protocol, runtime_checkable
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from croniter import CroniterBadDateError, CroniterError, croniter

EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)
_MICROSECOND = timedelta(microseconds=1)


@runtime_checkable
class Trigger(Protocol):
    """What a schedule needs from a trigger; integrations may bring their own."""

    @property
    def spec(self) -> str:
        """A stable text describing the ticks (a change means the schedule changed)."""

    def latest(self, at: datetime) -> datetime | None:
        """The most recent tick at or before ``at`` (aware, UTC), or None if there is none."""

    def next(self, after: datetime) -> datetime:
        """The first tick strictly after ``after`` (aware, UTC)."""


@runtime_checkable
class LastRunTrigger(Trigger, Protocol):
    """A trigger told the schedule's last tick: its ``latest(at)`` is used only to start a
    schedule (None: start from now)."""

    def latest_after(self, last_tick: datetime, at: datetime) -> datetime | None:
        """The tick to enqueue at ``at`` (after ``last_tick``), or None when none is due."""


def _utc(moment: datetime) -> datetime:
    """``moment`` in UTC; a naive datetime is taken as UTC (as everywhere in akadze)."""
    if moment.tzinfo is None:
        return moment.replace(tzinfo=timezone.utc)
    return moment.astimezone(timezone.utc)


def _zone(value: str | tzinfo) -> tuple[tzinfo, str]:
    """The tzinfo and its stable name; unknown names raise ValueError at declaration."""
    if isinstance(value, str):
        try:
            zone = ZoneInfo(value)
        except (ZoneInfoNotFoundError, ValueError):
            raise ValueError(f"unknown time zone {value!r}") from None
        return zone, zone.key
    if isinstance(value, ZoneInfo):
        return value, value.key
    if value is timezone.utc:
        return value, "UTC"
    if isinstance(value, timezone):
        return value, str(value)  # a fixed offset, e.g. "UTC+02:00"
    raise ValueError(f"time zone must be a zone name or a ZoneInfo, not {value!r}")


class Cron:
    """Ticks of a cron expression, evaluated on the wall clock of ``timezone``.

    Five fields (``minute hour day-of-month month day-of-week``), or six where the sixth is
    seconds (croniter's convention: ``"*/15 * * * * 30"`` is second 30 of every 15th minute);
    croniter's aliases (``@daily``, ``@hourly``, ...) work too. ``day_or=True`` (the default)
    is Vixie cron: when both day fields are restricted, either may match; ``day_or=False``
    requires both (Celery's ``crontab``).

    Daylight saving time is croniter's: a wall time skipped by a spring-forward gap fires at
    the first instant after the gap; a wall time repeated by a fall-back fires at both of its
    instants (so ``"30 2 * * *"`` in Europe/Berlin runs twice on the last Sunday of October).
    """

    def __init__(self, expression: str, timezone: str | tzinfo = "UTC", day_or: bool = True
                 ) -> None:
        if not isinstance(expression, str):
            raise ValueError(f"a cron expression must be a string, not {expression!r}")
        fields = expression.split()
        if not (len(fields) in (5, 6) or (len(fields) == 1 and fields[0].startswith("@"))):
            raise ValueError(f"invalid cron expression {expression!r}: expected 5 fields "
                             "(minute hour day-of-month month day-of-week), or 6 with seconds")
        self.expression = " ".join(fields)
        self.zone, self.zone_name = _zone(timezone)
        self.day_or = bool(day_or)
        try:
            # Parse now, and find one tick: an expression that never matches (30 February)
            # must fail at declaration, not in every worker round.
            self._iterator(datetime.now(self.zone)).get_next(datetime)
        except CroniterBadDateError:
            raise ValueError(f"cron expression {expression!r} never matches") from None
        except CroniterError as exc:
            raise ValueError(f"invalid cron expression {expression!r}: {exc}") from None

    @property
    def spec(self) -> str:
        """E.g. ``cron 0 3 * * * tz=Europe/Berlin`` (``day_or=false`` appended when set)."""
        text = f"cron {self.expression} tz={self.zone_name}"
        return text if self.day_or else f"{text} day_or=false"

    def _iterator(self, start: datetime) -> croniter:
        return croniter(self.expression, start, day_or=self.day_or)

    def latest(self, at: datetime) -> datetime | None:
        """The most recent tick at or before ``at``."""
        local = _utc(at).astimezone(self.zone)
        try:
            previous: datetime = self._iterator(local).get_prev(datetime)
        except CroniterBadDateError:
            return None
        # croniter's get_prev is strictly before its start, and ``at`` may be a tick itself.
        # Compared in UTC: datetimes sharing a tzinfo compare by wall time, which is wrong in
        # the hour a fall-back repeats.
        following = _utc(self._iterator(previous).get_next(datetime))
        return following if following <= _utc(at) else _utc(previous)

    def next(self, after: datetime) -> datetime:
        """The first tick strictly after ``after``."""
        local = _utc(after).astimezone(self.zone)
        return _utc(self._iterator(local).get_next(datetime))

    def __repr__(self) -> str:
        day_or = "" if self.day_or else ", day_or=False"
        return f"Cron({self.expression!r}, timezone={self.zone_name!r}{day_or})"


class Every:
    """Ticks every ``interval`` (a timedelta or seconds), at whole multiples of it since the
    Unix epoch in UTC: ``Every(timedelta(minutes=5))`` ticks at :00, :05, :10, ... on every
    worker alike, whenever each of them started."""

    def __init__(self, interval: timedelta | float | int) -> None:
        if not isinstance(interval, timedelta):
            if isinstance(interval, bool) or not isinstance(interval, (int, float)):
                raise ValueError(f"interval must be a timedelta or seconds, not {interval!r}")
            interval = timedelta(seconds=interval)
        # Whole microseconds (timestamptz's resolution) keep the arithmetic exact.
        self._micros = interval // _MICROSECOND
        if self._micros <= 0:
            raise ValueError(f"interval must be positive, not {interval!r}")
        self.interval = timedelta(microseconds=self._micros)

    @property
    def spec(self) -> str:
        """E.g. ``every 300s``."""
        seconds = Decimal(self._micros) / Decimal(1_000_000)
        return f"every {seconds.normalize():f}s"

    def latest(self, at: datetime) -> datetime:
        """The most recent multiple of the interval at or before ``at``."""
        elapsed = (_utc(at) - EPOCH) // _MICROSECOND
        return EPOCH + timedelta(microseconds=elapsed // self._micros * self._micros)

    def next(self, after: datetime) -> datetime:
        """The first multiple of the interval strictly after ``after``."""
        return self.latest(after) + self.interval

    def __repr__(self) -> str:
        return f"Every({self.interval!r})"


_CRON_SPEC = re.compile(r"^cron (?P<expression>.+) tz=(?P<zone>\S+)(?P<day_and> day_or=false)?$")
_EVERY_SPEC = re.compile(r"^every (?P<seconds>\d+(\.\d{1,6})?)s$")
_FIXED_OFFSET = re.compile(r"^UTC(?P<sign>[+-])(?P<hours>\d\d):(?P<minutes>\d\d)$")


def _parse_zone(name: str) -> str | tzinfo:
    """The zone a spec names: a zone key, ``UTC``, or a fixed offset such as ``UTC+02:00``."""
    offset = _FIXED_OFFSET.match(name)
    if offset is None:
        return name
    delta = timedelta(hours=int(offset["hours"]), minutes=int(offset["minutes"]))
    return timezone(-delta if offset["sign"] == "-" else delta)


@lru_cache(maxsize=4096)
def parse_spec(spec: str) -> Cron | Every:
    """The trigger whose ``spec`` is ``spec`` (``cron 0 3 * * * tz=Europe/Berlin``,
    ``every 300s``): how a stored schedule's trigger is rebuilt. ``parse_spec(t.spec).spec ==
    t.spec`` for every ``Cron`` and ``Every``; other text raises ValueError. Cached: the
    triggers are immutable and many stored schedules share a spec."""
    if not isinstance(spec, str):
        raise ValueError(f"a trigger spec must be a string, not {spec!r}")
    every = _EVERY_SPEC.match(spec)
    if every is not None:
        try:
            micros = int(Decimal(every["seconds"]) * 1_000_000)
        except InvalidOperation:  # pragma: no cover - the pattern admits only decimals
            raise ValueError(f"invalid trigger spec {spec!r}") from None
        return Every(timedelta(microseconds=micros))
    cron = _CRON_SPEC.match(spec)
    if cron is not None:
        return Cron(cron["expression"], timezone=_parse_zone(cron["zone"]),
                    day_or=cron["day_and"] is None)
    raise ValueError(f"invalid trigger spec {spec!r}: expected 'cron EXPRESSION tz=ZONE' "
                     "or 'every SECONDSs'")


def as_trigger(value: Trigger | str) -> Trigger:
    """A trigger from what ``add_schedule`` accepts: a trigger, a spec text (``every 60s``,
    ``cron */5 * * * * tz=Europe/Berlin``, see ``parse_spec``), or a cron string (UTC)."""
    if isinstance(value, str):
        if value.startswith(("every ", "cron ")):
            return parse_spec(value)
        return Cron(value)
    if not isinstance(value, Trigger):
        raise ValueError(f"trigger must be a Cron, an Every, a cron string or an object with "
                         f"spec, latest() and next(), not {value!r}")
    spec = value.spec
    if not isinstance(spec, str) or not spec:
        raise ValueError(f"trigger {value!r} has no spec text")
    return value


__all__ = ["Cron", "Every", "LastRunTrigger", "Trigger", "as_trigger", "parse_spec"]
