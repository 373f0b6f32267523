"""A worker's timetable of the runtime schedules: when each fires next, in a heap.

A scheduling pass must not evaluate every trigger every second: with 10,000 schedules that
alone would cost most of a core. The timetable keeps each schedule's next tick in a heap, so
a pass looks at the top only, and evaluates a trigger once per tick that came (``take_due``),
memoized across schedules sharing a trigger and a tick (5,000 schedules ``every 60s`` cost
one evaluation a minute). It changes only when the stored schedules do (``load``, ``drop``).

Pure logic on the database clock's instants, no I/O: the scheduler feeds it rows and ``now``.
"""

from __future__ import annotations

import heapq
import itertools
import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any, NamedTuple

from .triggers import Trigger, parse_spec

logger = logging.getLogger("akadze.schedules")


class DueTick(NamedTuple):
    """One tick to enqueue: the schedule, the version it was computed from, the tick (and
    as ISO text, the job's ``meta["tick"]``) and the tick after it (where the schedule goes
    in the heap once this one is done). A tuple: a pass makes thousands of them."""

    name: str
    version: int
    tick: datetime
    tick_text: str
    following: datetime


@dataclass(slots=True)
class _Entry:
    version: int
    trigger: Trigger
    paused: bool
    next_fire: datetime | None


def _first_fire(around: tuple[datetime | None, datetime], last_tick: datetime) -> datetime:
    """When a schedule loaded at ``now`` fires first, given its trigger's ``around`` now
    (the latest tick at or before it, the next after it): at once if a tick came after
    ``last_tick`` (the latest such: after downtime only the latest missed tick runs, as for
    code schedules), else at the next tick."""
    latest, following = around
    if latest is not None and latest > last_tick:
        return latest
    return following


class Timetable:
    """The runtime schedules a worker knows, by name, and a heap of their next ticks.

    Heap items are (next_fire, sequence, name, version); an item whose schedule was removed,
    paused, changed or rescheduled since it was pushed is stale and dropped when it surfaces.
    """

    def __init__(self) -> None:
        self._entries: dict[str, _Entry] = {}
        self._heap: list[tuple[datetime, int, str, int]] = []
        self._sequence = itertools.count()
        # Each trigger's (latest tick, next tick) around the last ``now`` given to load: a
        # cron evaluation costs about a millisecond, and many rows share a trigger.
        self._around_now: datetime | None = None
        self._around: dict[int, tuple[Trigger, datetime | None, datetime]] = {}

    def __len__(self) -> int:
        return len(self._entries)

    def versions(self) -> dict[str, int]:
        """The version held of each schedule, by name."""
        return {name: entry.version for name, entry in self._entries.items()}

    def fingerprint(self) -> tuple[int, int, int]:
        """(count, sum, max) of the versions held, as ``schedule_runtime_fingerprint``."""
        versions = [entry.version for entry in self._entries.values()]
        return len(versions), sum(versions), max(versions, default=0)

    def stale(self, stored: Mapping[str, int]) -> tuple[list[str], list[str]]:
        """Against every stored version (``stored``): the names to load (new or changed) and
        the names to drop (removed)."""
        held = self._entries
        load = [name for name, version in stored.items()
                if (entry := held.get(name)) is None or entry.version != version]
        return load, [name for name in held if name not in stored]

    def load(self, rows: Iterable[Mapping[str, Any]], now: datetime) -> None:
        """Take in the rows of ``schedule_runtime_timing`` (a schedule known already is
        replaced). A row whose spec no longer parses is logged and left out."""
        if self._around_now != now:
            self._around_now, self._around = now, {}
        around = self._around
        for row in rows:
            name = row["name"]
            try:
                trigger = parse_spec(row["spec"])
                next_fire = None
                if not row["paused"]:
                    known = around.get(id(trigger))
                    if known is None or known[0] is not trigger:
                        known = around[id(trigger)] = (trigger, trigger.latest(now),
                                                       trigger.next(now))
                    next_fire = _first_fire((known[1], known[2]), row["last_tick"])
            except Exception:  # an edited row; the others must go on
                logger.exception("runtime schedule %r: cannot compute its next run", name)
                self._entries.pop(name, None)
                continue
            version = int(row["version"])
            self._entries[name] = _Entry(version, trigger, bool(row["paused"]), next_fire)
            if next_fire is not None:
                self._push(next_fire, name, version)

    def drop(self, names: Iterable[str]) -> None:
        """Forget the schedules ``names`` (removed); their heap items go stale."""
        for name in names:
            self._entries.pop(name, None)

    def _push(self, when: datetime, name: str, version: int) -> None:
        heap = self._heap
        heapq.heappush(heap, (when, next(self._sequence), name, version))
        if len(heap) > 2 * len(self._entries) + 1024:
            # Stale items of far-off ticks (changed schedules) would otherwise pile up.
            self._heap = [item for item in heap if self._current(item) is not None]
            heapq.heapify(self._heap)

    def _current(self, item: tuple[datetime, int, str, int]) -> _Entry | None:
        entry = self._entries.get(item[2])
        if entry is None or entry.version != item[3] or entry.next_fire != item[0]:
            return None
        return entry

    def take_due(self, now: datetime, limit: int | None = None) -> list[DueTick]:
        """Pop the schedules whose next tick is at or before ``now`` (at most ``limit``),
        with the tick to enqueue: the latest one at or before ``now``. Give each back with
        ``advance`` once enqueued (or taken by another worker), or ``put_back`` if the
        statement failed."""
        heap = self._heap
        taken: list[DueTick] = []
        # Many schedules share a trigger object (parse_spec's cache) and a tick.
        following: dict[tuple[int, datetime], tuple[datetime, str, datetime]] = {}
        while heap and heap[0][0] <= now and (limit is None or len(taken) < limit):
            item = heapq.heappop(heap)
            entry = self._current(item)
            if entry is None:
                continue
            key = (id(entry.trigger), item[0])
            times = following.get(key)
            if times is None:
                try:
                    tick, after = self._tick_after(entry.trigger, item[0], now)
                    times = (tick, tick.isoformat(), after)
                except Exception:
                    logger.exception("runtime schedule %r: cannot compute its next run",
                                     item[2])
                    entry.next_fire = None
                    continue
                following[key] = times
            entry.next_fire = None  # out of the heap until advanced or put back
            taken.append(DueTick(item[2], item[3], *times))
        return taken

    @staticmethod
    def _tick_after(trigger: Trigger, due: datetime, now: datetime) -> tuple[datetime, datetime]:
        """(the tick to enqueue, the one after it) for a schedule due at ``due``: ``due``
        itself unless later ticks passed too (a stalled pass), then the latest of them."""
        after = trigger.next(due)
        if after <= now:
            latest = trigger.latest(now)
            due = latest if latest is not None else due
            after = trigger.next(due)
        return due, after

    def advance(self, ticks: Iterable[DueTick]) -> None:
        """Put the schedules of ``ticks`` back in the heap at their following tick."""
        self._reinsert(ticks, following=True)

    def put_back(self, ticks: Iterable[DueTick]) -> None:
        """Put the schedules of ``ticks`` back at the tick they were taken for."""
        self._reinsert(ticks, following=False)

    def _reinsert(self, ticks: Iterable[DueTick], *, following: bool) -> None:
        for due in ticks:
            entry = self._entries.get(due.name)
            if entry is None or entry.version != due.version or entry.paused:
                continue  # removed or changed meanwhile: load put it where it belongs
            if entry.next_fire is not None:
                continue  # loaded again meanwhile, with a fresh next tick
            entry.next_fire = due.following if following else due.tick
            self._push(entry.next_fire, due.name, due.version)

    def next_fire(self) -> datetime | None:
        """The earliest next tick held (None: nothing to fire)."""
        heap = self._heap
        while heap and self._current(heap[0]) is None:
            heapq.heappop(heap)
        return heap[0][0] if heap else None


__all__ = ["DueTick", "Timetable"]
