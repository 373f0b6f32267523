"""Rate limits as values: Celery's spelling ("100/s", "10/m", "1000/h", or a number meaning
per second) parsed into a ``Rate``, and the option checks of per-key concurrency."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

_PERIODS = {"s": 1.0, "m": 60.0, "h": 3600.0}
_RATE = re.compile(r"^\s*(\d+(?:\.\d*)?|\.\d+)\s*(?:/\s*([smh]))?\s*$")


@dataclass(frozen=True, slots=True)
class Rate:
    """At most ``count`` starts in any window of ``period`` seconds."""

    count: int
    period: float

    def __str__(self) -> str:
        return f"{self.count}/{self.period:g}s"


def parse_rate(value: str | float | None) -> Rate | None:
    """``"100/s"``, ``"10/m"``, ``"1000/h"``, or a number (per second) as a ``Rate``; None,
    ``""`` and 0 mean no limit (Celery's meaning). A fractional count keeps its average with
    a whole count of one: ``"0.5/s"`` is one start in any 2 seconds, ``"2.5/s"`` one in any
    0.4 seconds. Raises ``ValueError`` for anything else."""
    if value is None or value == "":
        return None
    if isinstance(value, bool) or not isinstance(value, (str, int, float)):
        raise ValueError(f"a rate limit is a str like '10/m' or a number, not {value!r}")
    if isinstance(value, str):
        match = _RATE.match(value)
        if match is None:
            raise ValueError(f"rate limit {value!r} is not '<number>/s', '/m' or '/h' "
                             "(Celery's spelling, e.g. '100/s', '10/m', '1000/h')")
        count, period = float(match[1]), _PERIODS[match[2] or "s"]
    else:
        count, period = float(value), 1.0
    if not math.isfinite(count) or count < 0:
        raise ValueError(f"rate limit {value!r} must be a finite number of starts, at least 0")
    if count == 0:
        return None
    if count.is_integer():
        if count > 2**31 - 1:
            raise ValueError(f"rate limit {value!r} is more than 2147483647 starts a period")
        return Rate(int(count), period)
    return Rate(1, period / count)


def check_concurrency(key: str | None, max_concurrency: int | None) -> None:
    """Raise ``ValueError`` unless the pair is a usable per-key concurrency option: a key
    that is a non-empty str, and a max of at least 1 given only with a key."""
    if key is None:
        if max_concurrency is not None:
            raise ValueError("max_concurrency needs a concurrency_key")
        return
    if not isinstance(key, str) or not key:
        raise ValueError(f"concurrency_key must be a non-empty str, not {key!r}")
    if max_concurrency is not None and (
            isinstance(max_concurrency, bool) or not isinstance(max_concurrency, int)
            or max_concurrency < 1):
        raise ValueError(f"max_concurrency must be an int of at least 1, not {max_concurrency!r}")


__all__ = ["Rate", "check_concurrency", "parse_rate"]
