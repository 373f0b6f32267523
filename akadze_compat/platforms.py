"""``celery.platforms``: the operating-system helpers that add-ons wrap.

akadze's worker does not daemonize (no ``--detach``): a process manager runs it. What is
here is what add-ons reach for at import or patch time: ``close_open_fds``, which Celery
calls when it detaches and tracing agents wrap to shut their native threads down first, and
the platform flags.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterable

__all__ = ["IS_WINDOWS", "IS_macOS", "close_open_fds", "get_fdmax"]

IS_macOS = sys.platform == "darwin"
IS_WINDOWS = sys.platform == "win32"


def get_fdmax(default: int | None = None) -> int | None:
    """The highest file descriptor number this process may open (``default`` if unknown)."""
    try:
        return os.sysconf("SC_OPEN_MAX")
    except (AttributeError, ValueError, OSError):
        return default


def close_open_fds(keep: Iterable[int] | None = None) -> None:
    """Close every open file descriptor except those in ``keep``, as Celery does before it
    detaches into the background."""
    kept = sorted({fd for fd in (keep or ()) if fd >= 0})
    top = get_fdmax(2048) or 2048
    start = 0
    for fd in [*kept, top]:
        if start < fd:
            os.closerange(start, fd)
        start = fd + 1
