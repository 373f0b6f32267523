"""``celery.utils.timer2``: the worker's timer (``worker.timer`` in boot steps), on a thread.

Celery's worker gives its boot steps a timer to run code now and then; the liveness-probe
recipe touches a file with ``worker.timer.call_repeatedly(...)``. This one runs each entry on
one daemon thread; an entry that raises is logged and keeps its schedule.
"""

from __future__ import annotations

import heapq
import itertools
import logging
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

__all__ = ["Entry", "Timer"]

logger = logging.getLogger("celery.utils.timer2")


class Entry:
    """One scheduled call; ``cancel()`` stops it (and its repeats)."""

    def __init__(self, fun: Callable[..., Any], args: Sequence[Any] = (),
                 kwargs: dict[str, Any] | None = None) -> None:
        self.fun = fun
        self.args = tuple(args)
        self.kwargs = dict(kwargs or {})
        self.canceled = False

    def __call__(self) -> Any:
        return self.fun(*self.args, **self.kwargs)

    def cancel(self) -> None:
        """Do not run it again."""
        self.canceled = True

    @property
    def cancelled(self) -> bool:
        """Whether it was canceled."""
        return self.canceled


class Timer:
    """Runs calls at their times on one daemon thread, started at the first call."""

    def __init__(self, name: str = "Timer") -> None:
        self.name = name
        self._queue: list[tuple[float, int, int, Entry, float | None]] = []
        self._order = itertools.count()
        self._wake = threading.Condition()
        self._thread: threading.Thread | None = None
        self._stopped = False

    def call_after(self, secs: float, fun: Callable[..., Any], args: Sequence[Any] = (),
                   kwargs: dict[str, Any] | None = None, priority: int = 0) -> Entry:
        """Call ``fun(*args, **kwargs)`` once, ``secs`` seconds from now."""
        return self._add(secs, None, Entry(fun, args, kwargs), priority)

    def call_repeatedly(self, secs: float, fun: Callable[..., Any], args: Sequence[Any] = (),
                        kwargs: dict[str, Any] | None = None, priority: int = 0) -> Entry:
        """Call ``fun(*args, **kwargs)`` every ``secs`` seconds, the first time in
        ``secs`` seconds."""
        return self._add(secs, secs, Entry(fun, args, kwargs), priority)

    def cancel(self, entry: Entry) -> None:
        """Cancel ``entry``."""
        entry.cancel()

    def stop(self) -> None:
        """Stop running entries; the thread ends."""
        with self._wake:
            self._stopped = True
            self._wake.notify()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(5)

    def clear(self) -> None:
        """Drop every scheduled entry."""
        with self._wake:
            self._queue.clear()

    @property
    def queue(self) -> list[Entry]:
        """The scheduled entries, soonest first."""
        with self._wake:
            return [item[3] for item in sorted(self._queue)]

    def _add(self, secs: float, every: float | None, entry: Entry, priority: int) -> Entry:
        with self._wake:
            heapq.heappush(self._queue, (time.monotonic() + max(secs, 0.0), priority,
                                         next(self._order), entry, every))
            if self._thread is None and not self._stopped:
                self._thread = threading.Thread(target=self._run, name=self.name,
                                                daemon=True)
                self._thread.start()
            self._wake.notify()
        return entry

    def _run(self) -> None:
        while True:
            with self._wake:
                while not self._stopped and (
                        not self._queue or self._queue[0][0] > time.monotonic()):
                    delay = self._queue[0][0] - time.monotonic() if self._queue else None
                    self._wake.wait(delay)
                if self._stopped:
                    return
                when, priority, _, entry, every = heapq.heappop(self._queue)
                if entry.canceled:
                    continue
                if every is not None:
                    heapq.heappush(self._queue, (when + every, priority, next(self._order),
                                                 entry, every))
            try:
                entry()
            except Exception:
                logger.exception("Error in timer entry %r", entry.fun)
