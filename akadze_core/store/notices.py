"""Insert notices, at most one per queue and priority per short window from each process.

Why. Every due insert notifies ``akadze_jobs`` (it wakes idle workers and lowers their claim
floors, akadze_core.store.floors). At commit Postgres takes one cluster-wide lock for
NOTIFY and holds it through the commit's WAL flush, so notifying transactions commit one
after another and never share a flush: one row per transaction, 4 clients inserted 1,486
rows/s without the NOTIFY and 230 with it. Many web processes calling ``.delay()`` at once
queue on that lock.

What. A single enqueue on the app's own autocommit connection (its own transaction) skips
its notice when this process committed a notice for the same queue and priority less than
:data:`WINDOW` ago (:class:`NoticeLimiter`); the worker that heard that notice claims once
more :data:`FOLLOW_UP` after it (akadze_core.worker.followups), so a job whose notice was
skipped waits about the window, not a poll interval. As River's client limits its insert
notifications per queue and its producer fetches again on the trailing edge of a cooldown.

Why exact. A skipped job must be seen by that follow-up claim:

* it committed before the claim: the window opens when the notifying insert is *sent* (so
  before its notice can be heard), and an insert that skipped its notice but committed
  later than the window's end sends the notice after all (``covers``);
* the floors do not hide it: the follow-up lowers them again to the heard notice's key, and
  the skipped job's key is above it (same queue and priority, due at its own transaction's
  ``now()``, which began after that notice committed). So only jobs due at ``now()`` skip:
  an explicit ``eta`` or countdown (a key anywhere), a unique key, and every insert inside
  the caller's transaction (it may roll back, and its ``now()`` may be long past) notify
  as before; group sends, workflow releases and pauses are not limited.
"""

from __future__ import annotations

import time

#: Seconds after a committed notice during which this process's inserts of the same queue
#: and priority skip theirs.
WINDOW = 0.010
#: Seconds after a notice that the worker claims once more (the window and a margin for
#: its timer): the latest a job whose notice was skipped waits for an idle worker's claim.
FOLLOW_UP = WINDOW + 0.002


class NoticeLimiter:
    """When this process last sent a notice per (queue, priority), see the module's text."""

    __slots__ = ("_sent", "window")

    def __init__(self, window: float = WINDOW) -> None:
        self.window = window
        self._sent: dict[tuple[str, int], float] = {}

    def quiet_since(self, queue: str, priority: int) -> float | None:
        """When the open window of ``(queue, priority)`` began, if an insert sent now may
        skip its notice; None when it must notify."""
        sent = self._sent.get((queue, priority))
        if sent is not None and time.monotonic() - sent < self.window:
            return sent
        return None

    def sent(self, queue: str, priority: int, at: float) -> None:
        """A notice of ``(queue, priority)`` sent at ``at`` (``time.monotonic()`` before its
        statement was sent) has committed."""
        key = (queue, priority)
        if at > self._sent.get(key, -1.0):
            self._sent[key] = at

    def covers(self, opened: float) -> bool:
        """Whether an insert that skipped its notice in the window opened at ``opened`` and
        has committed by now is seen by the follow-up claim of that window's notice."""
        return time.monotonic() - opened <= self.window


__all__ = ["FOLLOW_UP", "WINDOW", "NoticeLimiter"]
