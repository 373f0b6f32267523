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
  before its notice can be heard); an insert skips only when it should commit before the
  window's end (as long as quiet inserts took lately), and one that committed later after
  all sends the notice then (``NoticeLimiter.quiet``);
* the floors do not hide it: the follow-up lowers them again to the heard notice's key, and
  the skipped job's key is above it (same queue and priority, due at its own transaction's
  ``now()``, which began after that notice committed). So only jobs due at ``now()`` skip:
  an explicit ``eta`` or countdown (a key anywhere), a unique key, and every insert inside
  the caller's transaction (it may roll back, and its ``now()`` may be long past) notify
  as before; group sends, workflow releases and pauses are not limited.
"""

from __future__ import annotations

#: Seconds after a committed notice during which this process's inserts of the same queue
#: and priority skip theirs.
WINDOW = 0.010
#: Seconds after a notice that the worker claims once more (the window and a margin for
#: its timer): the latest a job whose notice was skipped waits for an idle worker's claim.
FOLLOW_UP = WINDOW + 0.002


class NoticeLimiter:
    """When this process last sent a notice per (queue, priority), see the module's text."""

    __slots__ = ("_sent", "expected", "window")

    def __init__(self, window: float = WINDOW) -> None:
        self.window = window
        self._sent: dict[tuple[str, int], float] = {}
        #: How long a quiet insert takes, lately (a moving average, seconds): one that would
        #: not commit before the window closes notifies instead of skipping (else it would
        #: have to send its notice after its commit, a statement more).
        self.expected = 0.0

    def quiet_since(self, queue: str, priority: int, now: float) -> float | None:
        """When the open window of ``(queue, priority)`` began, if an insert sent at ``now``
        (``time.monotonic()``) may skip its notice; None when it must notify."""
        sent = self._sent.get((queue, priority))
        if sent is not None and now - sent + self.expected < self.window:
            return sent
        return None

    def sent(self, queue: str, priority: int, at: float) -> None:
        """A notice of ``(queue, priority)`` sent at ``at`` (``time.monotonic()`` before its
        statement was sent) has committed."""
        key = (queue, priority)
        if at > self._sent.get(key, -1.0):
            self._sent[key] = at

    def quiet(self, opened: float, started: float, ended: float) -> bool:
        """A quiet insert sent at ``started`` committed by ``ended`` in the window opened at
        ``opened``: whether the follow-up claim of that window's notice sees it (if not,
        its notice must be sent now)."""
        self.expected += (ended - started - self.expected) * 0.25
        return ended - opened <= self.window


__all__ = ["FOLLOW_UP", "WINDOW", "NoticeLimiter"]
