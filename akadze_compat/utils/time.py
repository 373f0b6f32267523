"""``celery.utils.time``: the date and time helpers projects import.

The conversions (naive/aware, time zones, ISO 8601, timedeltas, backoff) behave as Celery's;
the helpers its scheduler uses internally are not provided.
"""

from __future__ import annotations

import random
from datetime import datetime, timedelta, timezone, tzinfo
from typing import Any

from .unsupported import not_provided

__all__ = ["get_exponential_backoff_interval", "humanize_seconds", "is_naive", "localize",
           "make_aware", "maybe_iso8601", "maybe_make_aware", "maybe_timedelta", "to_utc"]


def maybe_timedelta(delta: int | float | timedelta) -> timedelta:
    """A number of seconds as a ``timedelta``; a ``timedelta`` as it is."""
    return timedelta(seconds=delta) if isinstance(delta, (int, float)) else delta


def is_naive(dt: datetime) -> bool:
    """Whether ``dt`` has no time zone."""
    return dt.tzinfo is None or dt.tzinfo.utcoffset(dt) is None


def make_aware(dt: datetime, tz: tzinfo) -> datetime:
    """The naive ``dt`` read as a time in ``tz``."""
    return dt.replace(tzinfo=tz)


def localize(dt: datetime, tz: tzinfo) -> datetime:
    """``dt`` in ``tz`` (a naive ``dt`` is read as UTC first)."""
    return (dt if not is_naive(dt) else dt.replace(tzinfo=timezone.utc)).astimezone(tz)


def to_utc(dt: datetime) -> datetime:
    """``dt`` in UTC (a naive ``dt`` is read as UTC)."""
    return localize(dt, timezone.utc)


def maybe_make_aware(dt: datetime, tz: tzinfo | None = None, naive_as_utc: bool = True) \
        -> datetime:
    """``dt`` in ``tz`` (UTC when None); a naive ``dt`` is read as UTC (``naive_as_utc``),
    else as a time in ``tz``."""
    zone = timezone.utc if tz is None else tz
    if is_naive(dt):
        dt = make_aware(dt, timezone.utc if naive_as_utc else zone)
    return dt.astimezone(zone)


def maybe_iso8601(dt: datetime | str | None) -> datetime | None:
    """An ISO 8601 string as a ``datetime``; a ``datetime`` (or None) as it is."""
    if dt is None or isinstance(dt, datetime):
        return dt
    return datetime.fromisoformat(dt)


def get_exponential_backoff_interval(factor: float, retries: int, maximum: float,
                                     full_jitter: bool = False) -> float:
    """``factor * 2 ** retries`` seconds, at most ``maximum``; with ``full_jitter`` a random
    number of seconds up to that (never negative)."""
    countdown = min(maximum, factor * (2 ** retries))
    if full_jitter:
        countdown = random.randrange(int(countdown) + 1)
    return max(0, countdown)


_TIME_UNITS = (("day", 86400.0), ("hour", 3600.0), ("minute", 60.0), ("second", 1.0))


def humanize_seconds(secs: float, prefix: str = "", sep: str = "", now: str = "now",
                     microseconds: bool = False) -> str:
    """``secs`` in words as Celery writes them in log lines: ``"1.00 minute"``,
    ``"in 2.00 hours"`` with ``prefix="in "``; ``now`` under a second (with
    ``microseconds=True``, ``"0.50 seconds"``)."""
    secs = round(float(secs), 2)
    for unit, size in _TIME_UNITS:
        if secs >= size:
            amount = secs / size
            return f"{prefix}{sep}{amount:.2f} {unit}{'' if amount == 1 else 's'}"
    if microseconds and secs > 0.0:
        return f"{prefix}{sep}{secs:.2f} seconds"
    return now


_SCHEDULER_HELPERS: dict[str, Any] = {
    name: ("beat's internal time helpers are not provided: schedules are computed by the "
           "workers (akadze_compat.schedules)", "beat-runs-inside-the-workers")
    for name in ("LocalTimezone", "timezone", "delta_resolution", "remaining", "rate",
                 "weekday", "add_seconds_to_datetime",
                 "subtract_datetimes", "ffwd", "utcoffset", "adjust_timestamp")}
__getattr__ = not_provided(__name__, _SCHEDULER_HELPERS)


_RATE_MODIFIERS = {"s": lambda n: n, "m": lambda n: n / 60.0, "h": lambda n: n / 3600.0}


def rate(value: Any) -> float:
    """Celery's rate: ``"10/m"`` is tasks per second (a bad number raises ValueError, a bad
    unit KeyError, as Celery's does)."""
    if not value:
        return 0
    if isinstance(value, str):
        number, _, unit = value.partition("/")
        return _RATE_MODIFIERS[unit or "s"](float(number)) or 0
    return float(value) or 0
