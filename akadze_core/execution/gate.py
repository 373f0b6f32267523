"""The body gate of ``Worker(concurrency=N)``: at most N bodies run, the runs claimed beyond
them wait here in claim order (Celery's prefetch window), and a waiting run can be dropped.

An ``asyncio.Semaphore`` does the first two; dropping is why this exists: a run claimed
ahead whose job is cancelled or expires while it waits must end without its body starting
(seed 003), so its waiter is told "not started" instead of being handed a slot.
"""

from __future__ import annotations

import asyncio
import collections
from collections.abc import Callable
from typing import Any

#: A waiter that is called back instead of awaiting: ``(callback, key)``, called as
#: ``callback(key, True)`` when handed a slot, ``callback(key, False)`` when dropped.
_Callback = tuple[Callable[[Any, bool], None], Any]


class BodyGate:
    """``slots`` bodies at once; ``enter`` waits first come, first served."""

    def __init__(self, slots: int) -> None:
        if slots < 1:
            raise ValueError("a body gate needs at least one slot")
        self._free = slots
        self._slots = slots
        # Waiting runs by job id, in arrival order; a result of True hands over a slot.
        self._waiters: collections.OrderedDict[int, asyncio.Future[bool] | _Callback] = (
            collections.OrderedDict())

    @property
    def slots(self) -> int:
        """How many bodies it holds at once."""
        return self._slots

    def resize(self, slots: int) -> None:
        """Hold ``slots`` bodies from now on: more hand slots to waiting runs at once; fewer
        are taken back as bodies end (``_free`` below zero is that debt)."""
        if slots < 1:
            raise ValueError("a body gate needs at least one slot")
        self._free += slots - self._slots
        self._slots = slots
        self._admit()

    def _admit(self) -> None:
        """Hand the free slots to the runs in line, first come first."""
        while self._free > 0 and self._waiters:
            _, waiter = self._waiters.popitem(last=False)
            if _live(waiter):
                self._free -= 1
                _hand(waiter, True)

    def waiting(self, job_id: int) -> bool:
        """Whether the run of ``job_id`` waits for a slot (claimed, its body not started)."""
        return job_id in self._waiters

    def try_enter(self) -> bool:
        """Take a slot if one is free and nobody waits: True then (call ``release`` when
        the body ends); False leaves the gate as it was."""
        if self._free > 0 and not self._waiters:
            self._free -= 1
            return True
        return False

    def wait(self, job_id: int, callback: Callable[[Any, bool], None], key: Any) -> None:
        """``enter`` without a coroutine, for a run that ``try_enter`` turned away: it waits
        in line, and ``callback(key, True)`` runs when it is handed a slot (it holds one
        then), ``callback(key, False)`` when it is dropped. ``leave`` takes it out of line
        without a call."""
        self._waiters[job_id] = (callback, key)

    def leave(self, job_id: int) -> bool:
        """Take a run waiting through ``wait`` out of line, without calling it back."""
        waiter = self._waiters.get(job_id)
        if waiter is None or not isinstance(waiter, tuple):
            return False
        del self._waiters[job_id]
        return True

    async def enter(self, job_id: int) -> bool:
        """Take a slot for the run of ``job_id``: True once it holds one (call ``release``
        when its body ends), False when it was dropped while waiting (it holds none)."""
        if self._free > 0 and not self._waiters:
            self._free -= 1
            return True
        waiter = asyncio.get_running_loop().create_future()
        self._waiters[job_id] = waiter
        try:
            return await waiter
        except asyncio.CancelledError:
            self._waiters.pop(job_id, None)
            # Handed a slot just before the cancel: pass it on, nobody will release it.
            if waiter.done() and not waiter.cancelled() and waiter.result():
                self.release()
            raise

    def drop(self, job_id: int) -> bool:
        """Turn the run of ``job_id`` away if it still waits (its ``enter`` returns False);
        False when it holds a slot already or is unknown here."""
        waiter = self._waiters.pop(job_id, None)
        if waiter is None or not _live(waiter):
            return False
        _hand(waiter, False)
        return True

    def release(self) -> None:
        """A body ended: its slot goes to the first waiting run, else back to the pool (or
        pays off a shrink)."""
        if self._free < 0:
            self._free += 1
            return
        while self._waiters:
            _, waiter = self._waiters.popitem(last=False)
            if _live(waiter):
                _hand(waiter, True)
                return
        self._free += 1


def _live(waiter: asyncio.Future[bool] | _Callback) -> bool:
    """Whether ``waiter`` still waits (a future may have been cancelled meanwhile)."""
    return isinstance(waiter, tuple) or not waiter.done()


def _hand(waiter: asyncio.Future[bool] | _Callback, slot: bool) -> None:
    """Tell a live ``waiter`` whether it holds a slot (True) or was dropped (False)."""
    if isinstance(waiter, tuple):
        callback, key = waiter
        callback(key, slot)
    else:
        waiter.set_result(slot)
