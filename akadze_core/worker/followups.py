"""Follow-up claims: a claim once more shortly after each insert notice heard.

An enqueuing process skips the notices of its inserts of a queue and priority for a short
window after it sent one (akadze_core.store.notices): the jobs it inserts then are covered
by the notice before them. So the worker, :data:`~akadze_core.store.notices.FOLLOW_UP`
after hearing an insert's notice, lowers the floors to that notice's key again (claims in
between may have lifted them over the skipped jobs, whose keys are above it) and wakes the
claim loop: a job whose notice was skipped waits about that long for an idle worker, not a
poll interval. As River's producer fetches again on the trailing edge of a cooldown.
"""

from __future__ import annotations

import asyncio
import datetime as dt
from collections import deque

from ..store.floors import Floors
from ..store.notices import FOLLOW_UP


class FollowUps:
    """Hears insert notices and claims again :attr:`delay` seconds after each."""

    def __init__(self, floors: Floors, wake: asyncio.Event, delay: float = FOLLOW_UP) -> None:
        self.delay = delay
        self._floors = floors
        self._wake = wake
        # (when, queue, key) in the order heard, so in the order due.
        self._due: deque[tuple[float, str, tuple[int, dt.datetime]]] = deque()
        self._timer: asyncio.TimerHandle | None = None

    def heard(self, queue: str, key: tuple[int, dt.datetime] | None) -> None:
        """The listener heard that jobs of ``queue`` became queued, the lowest at ``key``:
        the floors go down to it now (``Floors.heard``), and again at the follow-up, which
        only an insert's notice (one with a key) asks for."""
        self._floors.heard(queue, key)
        if key is None:
            return
        loop = asyncio.get_running_loop()
        when = loop.time() + self.delay
        self._due.append((when, queue, key))
        if self._timer is None:
            self._timer = loop.call_at(when, self._follow_up)

    def _follow_up(self) -> None:
        loop = asyncio.get_running_loop()
        now = loop.time()
        due = self._due
        while due and due[0][0] <= now:
            _, queue, key = due.popleft()
            self._floors.heard(queue, key)
        self._wake.set()
        self._timer = loop.call_at(due[0][0], self._follow_up) if due else None

    def close(self) -> None:
        """Cancel the pending follow-up (the worker stops)."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._due.clear()
