"""``billiard.pool``: the pool child's life, under billiard's names, for agents that wrap it.

In Celery a prefork child runs ``billiard.pool.Worker.workloop`` and leaves through
``Worker._do_exit``; Sentry wraps the first to flush its events before the child exits and
New Relic the second to shut its agent down. akadze's prefork child runs its serving loop
through :class:`Worker` the same way, looking both methods up on the class when the child
starts, so such wrappers act in akadze's children too.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

__all__ = ["Worker"]


class Worker:
    """One pool child: ``Worker(loop, on_exit)()`` runs ``workloop`` (which calls ``loop``,
    returning the exit code), then ``_do_exit(pid, exitcode)`` (which calls ``on_exit``)."""

    def __init__(self, loop: Callable[[], int],
                 on_exit: Callable[[int, int], Any] | None = None) -> None:
        self.loop = loop
        self.on_exit = on_exit

    def __call__(self) -> int:
        pid = os.getpid()
        try:
            exitcode = self.workloop(pid=pid)
        except BaseException as exc:
            self._do_exit(pid, 1, exc)
            raise
        self._do_exit(pid, exitcode)
        return exitcode

    def workloop(self, debug: Any = None, now: Any = None, pid: int | None = None) -> int:
        """Serve tasks until the child is told to stop; returns its exit code."""
        return self.loop()

    def _do_exit(self, pid: int, exitcode: int, exc: BaseException | None = None) -> None:
        """The child is leaving (``exc``: why, when the loop raised)."""
        if self.on_exit is not None:
            self.on_exit(pid, exitcode)
