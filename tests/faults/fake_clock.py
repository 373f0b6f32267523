"""Skew this process's wall clock: ``AKADZE_FAKE_CLOCK_OFFSET=<seconds>`` (may be negative).

``install()`` shifts ``time.time``, ``time.time_ns`` and ``datetime.datetime.now`` /
``utcnow`` / ``today`` (and ``datetime.date.today``) by the offset, the way a host whose clock
drifted would see them. ``time.monotonic`` is left alone: a skewed wall clock does not make
intervals longer or shorter. It must run before anything does ``from datetime import
datetime`` (other than psycopg, whose adapters must keep the real classes), so the fault
harness installs it before importing akadze.

No LD_PRELOAD, no libfaketime: akadze decides time on the database clock only, so patching the
Python-level clocks is enough to prove that a worker's own clock schedules nothing.
"""

from __future__ import annotations

import datetime as _datetime
import os
import time as _time
from typing import Any

ENV_VAR = "AKADZE_FAKE_CLOCK_OFFSET"

_real_time = _time.time
_real_time_ns = _time.time_ns
_RealDatetime = _datetime.datetime
_RealDate = _datetime.date
offset: float = 0.0


class _SameInstances(type):
    """Real ``datetime`` objects (e.g. read from the database) still pass ``isinstance``."""

    _real: type

    def __instancecheck__(cls, instance: Any) -> bool:
        return isinstance(instance, cls._real)

    def __subclasscheck__(cls, subclass: type) -> bool:
        return issubclass(subclass, cls._real)


class FakeDatetime(_RealDatetime, metaclass=_SameInstances):
    """``datetime`` whose ``now()`` is off by the offset."""

    _real = _RealDatetime

    @classmethod
    def now(cls, tz: Any = None) -> Any:  # type: ignore[override]
        return _RealDatetime.now(tz) + _datetime.timedelta(seconds=offset)

    @classmethod
    def utcnow(cls) -> Any:  # type: ignore[override]
        return _RealDatetime.now(_datetime.timezone.utc).replace(tzinfo=None) \
            + _datetime.timedelta(seconds=offset)

    @classmethod
    def today(cls) -> Any:  # type: ignore[override]
        return cls.now()


class FakeDate(_RealDate, metaclass=_SameInstances):
    """``date`` whose ``today()`` follows the skewed clock."""

    _real = _RealDate

    @classmethod
    def today(cls) -> Any:  # type: ignore[override]
        return FakeDatetime.now().date()


def install(seconds: float) -> None:
    """Skew every wall clock of this process by ``seconds``."""
    global offset
    offset = float(seconds)
    _time.time = lambda: _real_time() + offset
    _time.time_ns = lambda: _real_time_ns() + int(offset * 1e9)
    _datetime.datetime = FakeDatetime  # type: ignore[misc]
    _datetime.date = FakeDate  # type: ignore[misc]


def install_from_env() -> float:
    """``install`` the offset of ``AKADZE_FAKE_CLOCK_OFFSET`` if set; returns it (0 if not)."""
    value = float(os.environ.get(ENV_VAR) or 0)
    if value:
        install(value)
    return value
