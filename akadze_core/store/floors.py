"""Claim floors: where each claim of a queue starts reading its index, so that it never steps
over the index entries of jobs claimed before.

Why. A claim reads ``jobs_claim_idx`` (queue, priority, scheduled_at, id) from the head of
the queue. Every job claimed leaves its entry there until VACUUM removes it, and those
entries sort *before* every live one: they were the head when they were claimed. While a
transaction anywhere pins the MVCC horizon (an idle-in-transaction session), VACUUM can
remove none of them and an index scan cannot even mark them dead, so each claim visited
every job claimed since the horizon was pinned: claim p99 went from 6 ms to 3 s in 150 s at
800 jobs/s. Between autovacuums, a long drain reads the ones already marked dead on every
claim (its rate halved by 600,000 of them).

What. The worker remembers, per queue and priority, the key of the last job it claimed (its
*floor*), and its next claim reads only keys above it: the claim's index scan starts where
the last one ended, whatever lies behind. Priorities it has no floor for are read in full
(the gaps between the floors), so a new priority is never missed.

Why exact. A floor is only a hint of where live work starts; a job must never sit below it
unseen. Claims take keys in order, so nothing live and visible stays below a floor but a
job that a concurrent claim held locked and then gave up. What else can appear below:

* a job committed later with an earlier key (an enqueue in a long transaction has that
  transaction's ``now()``, or an explicit past ``eta``): every insert notifies its queue with
  the lowest (priority, scheduled_at) it wrote (``akadze.job_notice``), and the listener
  lowers the floors to it (:meth:`Floors.heard`);
* jobs made queued again by other statements (settle releasing workflow steps, returns,
  rescues, requeues, schedules), all due at their statement's ``now()``: their notification
  carries the queue alone, and the floors go back :data:`MARGIN` seconds, more than such a
  statement takes between its ``now()`` and the notification reaching the worker;
* this worker's own retries and snoozes (the completer's rows say their keys).

What no notification covers (a lost one while LISTEN reconnects, a lock given up, a statement
slower than the margin) waits at most :data:`RESCAN_INTERVAL`: every so often, and whenever
LISTEN is down or restarts, a claim reads the queue from its head.
"""

from __future__ import annotations

import datetime as dt
import time
from collections.abc import Iterable, Mapping
from typing import Any

#: Seconds the floors go back on a notification that carries no key: longer than a
#: statement that makes jobs queued again (at its ``now()``) takes to commit and be heard.
MARGIN = 2.0
#: Seconds between claims that read a queue from its head whatever the floors say.
RESCAN_INTERVAL = 30.0

#: Separates the queue from the key in an ``akadze_jobs`` payload (akadze.job_notice).
SEPARATOR = "\x1f"
_EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.timezone.utc)

#: A floor: the (scheduled_at, id) of the last job claimed at a priority.
Key = tuple[dt.datetime, int]


def parse_notice(payload: str) -> tuple[str, tuple[int, dt.datetime] | None]:
    """An ``akadze_jobs`` payload: the queue, and the lowest (priority, scheduled_at) the
    notifying statement made queued when it says (inserts do; see akadze.job_notice)."""
    queue, sep, key = payload.partition(SEPARATOR)
    if sep:
        priority, _, micros = key.partition(SEPARATOR)
        try:
            return queue, (int(priority), _EPOCH + dt.timedelta(microseconds=int(micros)))
        except ValueError:
            pass
    return payload, None


class Floors:
    """Per queue and priority, the floor its claims start above (see the module's text)."""

    def __init__(self, rescan_interval: float = RESCAN_INTERVAL, margin: float = MARGIN) -> None:
        self.rescan_interval = rescan_interval
        self.margin = dt.timedelta(seconds=margin)
        self._floors: dict[str, dict[int, Key]] = {}
        self._rescan_at: dict[str, float] = {}
        # What was heard of a queue while its claim ran (bounds() to claimed()): that claim's
        # snapshot may predate those jobs, so its rows must not lift the floors over them.
        self._heard_meanwhile: dict[str, list[tuple[int, dt.datetime] | None]] = {}
        #: False while LISTEN is down: notifications are missed, so every claim reads the head.
        self.listening = False

    def bounds(self, queue: str) -> tuple[list[int], list[dt.datetime], list[int]]:
        """The floors of ``queue`` for job_claim: priorities, scheduled_at and ids. Empty
        (read the whole queue) when LISTEN is down or a rescan is due; the rescan resets
        the floors, which that claim's rows then set again."""
        self._heard_meanwhile[queue] = []
        now = time.monotonic()
        if not self.listening or now >= self._rescan_at.get(queue, 0.0):
            self._floors.pop(queue, None)
            self._rescan_at[queue] = now + self.rescan_interval
            return [], [], []
        floors = self._floors.get(queue)
        if not floors:
            return [], [], []
        priorities = sorted(floors)
        return (priorities, [floors[p][0] for p in priorities],
                [floors[p][1] for p in priorities])

    def claimed(self, queue: str, rows: Iterable[Mapping[str, Any]]) -> None:
        """A claim of ``queue`` returned ``rows``: each priority's floor moves up to the last
        key taken (the claim read every key below it that it could lock)."""
        floors = self._floors.setdefault(queue, {})
        for row in rows:
            key = (row["scheduled_at"], row["id"])
            current = floors.get(row["priority"])
            if current is None or key > current:
                floors[row["priority"]] = key
        for heard in self._heard_meanwhile.pop(queue, ()):
            self._lower(floors, heard)

    def heard(self, queue: str, key: tuple[int, dt.datetime] | None) -> None:
        """Jobs of ``queue`` became queued, the lowest at ``key`` (priority, scheduled_at) when
        known: the floors at that priority and below in claim order go down to it; with no
        key, every floor of the queue goes back :attr:`margin`."""
        meanwhile = self._heard_meanwhile.get(queue)
        if meanwhile is not None:
            meanwhile.append(key)
        floors = self._floors.get(queue)
        if floors:
            self._lower(floors, key)

    def _lower(self, floors: dict[int, Key], key: tuple[int, dt.datetime] | None) -> None:
        for priority, (at, job_id) in floors.items():
            if key is None:
                floors[priority] = (at - self.margin, 0)
            elif priority >= key[0] and (key[1], 0) < (at, job_id):
                floors[priority] = (key[1], 0)

    def requeued(self, rows: Iterable[Mapping[str, Any]]) -> None:
        """This worker's own outcomes made ``rows`` queued again (retries, snoozes, runs
        dropped unstarted): rows with queue, priority and scheduled_at."""
        for row in rows:
            self.heard(row["queue"], (row["priority"], row["scheduled_at"]))

    def set_listening(self, listening: bool) -> None:
        """LISTEN started (True) or was lost (False): either way what was notified meanwhile
        is unknown, so every floor goes; while it is down, claims read the whole queue."""
        self.listening = listening
        self._floors.clear()
