"""A worker's timetable of the runtime schedules: when each fires next, by instant.

A scheduling pass must not evaluate every trigger every second: with 10,000 schedules that
alone would cost most of a core. The timetable keeps the schedules in buckets by their next
tick, and a heap of the buckets' instants, so a pass looks at the earliest bucket only and
takes thousands of schedules due at one instant (a minute boundary) without a heap operation
each. It changes only when the stored schedules do (``load``, ``drop``).

Evaluating a trigger (a cron expression in its zone) costs about half a millisecond, and a
minute boundary brings dozens of distinct ones due at once. So a schedule carries the tick
*after* its next one, computed ahead: at the boundary, its tick is enqueued and it moves to
that known following tick without evaluating anything; the tick after that is worked out
later, in ``prepare`` slices the scheduler runs in the passes between boundaries. A schedule
not prepared in time (a tick due again within seconds) is evaluated when it is taken, as
before; a pass that stalled past a following tick evaluates too, to enqueue only the latest.

Pure logic on the database clock's instants, no I/O: the scheduler feeds it rows and ``now``.
"""

from __future__ import annotations

import heapq
import logging
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any, NamedTuple

from .triggers import Trigger, parse_spec

logger = logging.getLogger("akadze.schedules")


class DueTick(NamedTuple):
    """One tick to enqueue: the schedule, the version it was computed from, the tick (and
    as ISO text, the job's ``meta["tick"]``) and the tick after it (where the schedule goes
    once this one is done). A tuple: a pass makes thousands of them."""

    name: str
    version: int
    tick: datetime
    tick_text: str
    following: datetime


@dataclass(slots=True, eq=False)
class _Entry:
    """One schedule as held: in the bucket of ``next_fire`` while that is set (None: taken
    by a pass, or paused); ``after`` is the tick after ``next_fire`` once computed."""

    name: str
    version: int
    trigger: Trigger
    paused: bool
    next_fire: datetime | None
    after: datetime | None = None


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
    """The runtime schedules a worker knows, by name, in buckets by their next tick.

    A bucket holds entries; one whose schedule was removed, paused, changed or moved since it
    was put there is stale (it is no longer the held entry of its name, or its ``next_fire``
    differs from the bucket's instant) and is dropped when met.
    """

    def __init__(self) -> None:
        self._entries: dict[str, _Entry] = {}
        self._buckets: dict[datetime, list[_Entry]] = {}
        self._instants: list[datetime] = []  # a heap of the buckets' keys
        self._items = 0  # entries in all buckets, stale ones included
        # Entries moved to a following tick whose tick after it is still to be computed.
        self._unprepared: list[_Entry] = []
        # Each trigger's tick after an instant, as computed for an earlier entry: many
        # schedules share a trigger object (parse_spec's cache) and a tick.
        self._after: dict[tuple[int, datetime], tuple[Trigger, datetime]] = {}
        # Each trigger's (latest tick, next tick, the one after) around the last ``now``
        # given to load.
        self._around_now: datetime | None = None
        self._around: dict[int, tuple[Trigger, datetime | None, datetime, datetime]] = {}

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
                next_fire = after = None
                if not row["paused"]:
                    known = around.get(id(trigger))
                    if known is None or known[0] is not trigger:
                        following = trigger.next(now)
                        known = around[id(trigger)] = (trigger, trigger.latest(now), following,
                                                       trigger.next(following))
                    next_fire = _first_fire((known[1], known[2]), row["last_tick"])
                    # No tick between the latest one and now: the next after either is the
                    # next after now.
                    after = known[2] if next_fire != known[2] else known[3]
            except Exception:  # an edited row; the others must go on
                logger.exception("runtime schedule %r: cannot compute its next run", name)
                self._entries.pop(name, None)
                continue
            entry = _Entry(name, int(row["version"]), trigger, bool(row["paused"]), next_fire,
                           after)
            self._entries[name] = entry
            if next_fire is not None:
                self._put(entry, next_fire)

    def drop(self, names: Iterable[str]) -> None:
        """Forget the schedules ``names`` (removed); their bucket entries go stale."""
        for name in names:
            self._entries.pop(name, None)

    def _put(self, entry: _Entry, when: datetime) -> None:
        bucket = self._buckets.get(when)
        if bucket is None:
            bucket = self._buckets[when] = []
            heapq.heappush(self._instants, when)
        bucket.append(entry)
        self._items += 1
        if self._items > 2 * len(self._entries) + 1024:
            self._compact()

    def _compact(self) -> None:
        """Drop the stale entries (changed schedules' far-off ticks would pile up)."""
        live = self._live
        self._buckets = {when: kept for when, bucket in self._buckets.items()
                         if (kept := [entry for entry in bucket if live(entry, when)])}
        self._instants = list(self._buckets)
        heapq.heapify(self._instants)
        self._items = sum(len(bucket) for bucket in self._buckets.values())

    def _live(self, entry: _Entry, when: datetime) -> bool:
        return entry.next_fire == when and self._entries.get(entry.name) is entry

    def take_due(self, now: datetime, limit: int | None = None) -> list[DueTick]:
        """Take the schedules whose next tick is at or before ``now`` (at most ``limit``),
        with the tick to enqueue: the latest one at or before ``now``. Give each back with
        ``advance`` once enqueued (or taken by another worker), or ``put_back`` if the
        statement failed."""
        taken: list[DueTick] = []
        instants, buckets, entries = self._instants, self._buckets, self._entries
        # Ticks computed in this call, by (trigger, due instant): (tick, text, following).
        computed: dict[tuple[int, datetime], tuple[datetime, str, datetime]] = {}
        texts: dict[datetime, str] = {}
        room = len(entries) if limit is None else limit
        while instants and instants[0] <= now and len(taken) < room:
            when = instants[0]
            bucket = buckets[when]
            while bucket and len(taken) < room:
                entry = bucket.pop()
                self._items -= 1
                if entry.next_fire != when or entries.get(entry.name) is not entry:
                    continue
                after = entry.after
                if after is not None and after > now:
                    text = texts.get(when)
                    if text is None:
                        text = texts[when] = when.isoformat()
                    times = (when, text, after)
                else:  # not prepared, or the pass stalled past the following tick
                    key = (id(entry.trigger), when)
                    found = computed.get(key)
                    if found is None:
                        try:
                            tick, following = self._tick_after(entry.trigger, when, now)
                        except Exception:
                            logger.exception("runtime schedule %r: cannot compute its next "
                                             "run", entry.name)
                            entry.next_fire = None
                            continue
                        found = computed[key] = (tick, tick.isoformat(), following)
                    times = found
                entry.next_fire = None  # out of the buckets until advanced or put back
                taken.append(DueTick(entry.name, entry.version, *times))
            if not bucket:
                heapq.heappop(instants)
                del buckets[when]
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
        """Put the schedules of ``ticks`` back at their following tick; the tick after that
        is left to ``prepare``."""
        unprepared = self._unprepared
        for due in ticks:
            entry = self._held(due)
            if entry is not None:
                entry.next_fire, entry.after = due.following, None
                self._put(entry, due.following)
                unprepared.append(entry)

    def put_back(self, ticks: Iterable[DueTick]) -> None:
        """Put the schedules of ``ticks`` back at the tick they were taken for."""
        for due in ticks:
            entry = self._held(due)
            if entry is not None:
                entry.next_fire, entry.after = due.tick, due.following
                self._put(entry, due.tick)

    def _held(self, due: DueTick) -> _Entry | None:
        """The entry ``due`` was taken from, if it is still held and out of the buckets."""
        entry = self._entries.get(due.name)
        if entry is None or entry.version != due.version or entry.paused:
            return None  # removed or changed meanwhile: load put it where it belongs
        if entry.next_fire is not None:
            return None  # loaded again meanwhile, with a fresh next tick
        return entry

    @property
    def unprepared(self) -> bool:
        """Whether some schedules still wait for ``prepare`` to compute their tick after."""
        return bool(self._unprepared)

    def prepare(self, budget: float) -> bool:
        """Compute the tick after the next one of advanced schedules for about ``budget``
        seconds (at least one trigger evaluation); True once none is left."""
        unprepared, memo = self._unprepared, self._after
        deadline = time.perf_counter() + budget
        while unprepared:
            entry = unprepared.pop()
            when = entry.next_fire
            if when is None or entry.after is not None or self._entries.get(entry.name) \
                    is not entry:
                continue  # taken, loaded again or removed since
            key = (id(entry.trigger), when)
            known = memo.get(key)
            if known is None or known[0] is not entry.trigger:
                try:
                    known = memo[key] = (entry.trigger, entry.trigger.next(when))
                except Exception:  # take_due evaluates it again, and logs
                    continue
                if time.perf_counter() > deadline:
                    entry.after = known[1]
                    break
            entry.after = known[1]
        if not unprepared:
            memo.clear()
            return True
        return False

    def next_fire(self) -> datetime | None:
        """The earliest next tick held (None: nothing to fire)."""
        instants, buckets = self._instants, self._buckets
        while instants:
            when = instants[0]
            bucket = buckets[when]
            while bucket and not self._live(bucket[-1], when):
                bucket.pop()
                self._items -= 1
            if bucket:
                return when
            heapq.heappop(instants)
            del buckets[when]
        return None


__all__ = ["DueTick", "Timetable"]
