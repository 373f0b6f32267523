"""Celery's ``celery.utils`` names that projects import (the logging helpers live in ``.log``).

Provided: ``uuid`` and its old name ``gen_unique_id``, ``cached_property`` (kombu's, as
Celery re-exports it) and ``get_full_cls_name``, which add-ons import from here. The rest of
Celery's ``celery.utils`` (``chunks``, ``nodename``, ``symbol_by_name`` aliases, ...) is
internal plumbing that Celery itself marks as kept only for backwards compatibility.
"""

from __future__ import annotations

import os
from typing import Any

from kombu.utils.objects import cached_property

__all__ = ("cached_property", "gen_unique_id", "get_full_cls_name", "uuid")

_urandom = os.urandom
#: The variant digit of a version 4 UUID (10xx in binary) for each random hex digit.
_VARIANT = {digit: "89ab"[int(digit, 16) & 3] for digit in "0123456789abcdef"}


def uuid() -> str:
    """Return a new random id in UUID4 text form, as Celery uses for task ids.

    What ``str(uuid.uuid4())`` returns (122 random bits from ``os.urandom``, the version
    and variant digits set), made without the UUID object: 1.1 us instead of 3-4 us, and
    every ``.delay()`` makes one.
    """
    try:
        digits = _random_digits.pop()
    except IndexError:
        digits = _draw()
    return (f"{digits[:8]}-{digits[8:12]}-4{digits[13:16]}-{_VARIANT[digits[16]]}"
            f"{digits[17:20]}-{digits[20:]}")


# 32 random hex digits per id, drawn from os.urandom 256 ids at a time: a system call per id
# was a sixth of a .delay()'s own time. list.pop() hands each out once, whichever thread
# asks; a forked child starts without its parent's (it would make the same ids).
_random_digits: list[str] = []
os.register_at_fork(after_in_child=_random_digits.clear)


def _draw() -> str:
    """Refill the random digits; returns one of them."""
    drawn = _urandom(16 * 256).hex()
    _random_digits.extend([drawn[at:at + 32] for at in range(32, 32 * 256, 32)])
    return drawn[:32]


#: Old name of :func:`uuid`.
gen_unique_id = uuid


def get_full_cls_name(obj: Any) -> str:
    """The dotted name of ``obj`` (a class or function; an instance: its class), as Celery
    writes it: ``module.QualName``; a nested qualified name (``Outer.Inner``) is given as
    it is, without the module, as Celery does."""
    if not hasattr(obj, "__name__") and hasattr(obj, "__class__"):
        obj = obj.__class__
    name: str = obj.__qualname__
    return name if "." in name else f"{obj.__module__}.{name}"
