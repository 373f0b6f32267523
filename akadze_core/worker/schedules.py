"""The schedules service: enqueue the due runs of the app's schedules.

Every worker runs one (unless ``schedules=False``), whatever its queues, at most about once
a second; the scheduler says when its next tick is due, and a runtime schedule changed (the
listener heard it) is taken in after a few milliseconds' grace.
"""

from __future__ import annotations

import time

import psycopg

from ..schedules.scheduler import MIN_CHECK_INTERVAL, SCHEDULE_CHANGE_GRACE, Scheduler
from .maintenance import Service


class Schedules:
    """The schedules duty around ``scheduler``."""

    def __init__(self, scheduler: Scheduler) -> None:
        self._scheduler = scheduler
        # The step moves it to the next tick.
        self.service = Service("schedules", self.step, first_due=time.monotonic(),
                               interval=lambda: MIN_CHECK_INTERVAL)

    def changed(self, name: str) -> None:
        """A runtime schedule changed (the listener heard it): take it in at once."""
        self._scheduler.changed(name)
        # A few milliseconds' grace: a burst of changes (a bulk add) makes one pass.
        self.service.trigger(SCHEDULE_CHANGE_GRACE)

    async def step(self, connection: psycopg.AsyncConnection) -> None:
        """Enqueue the due runs; due again at the scheduler's next tick."""
        # Measured on the database clock, so only a duration is carried over to the
        # monotonic clock here.
        wait = await self._scheduler.enqueue_due(connection)
        if self._scheduler.pending:  # heard of a change during the pass
            wait = SCHEDULE_CHANGE_GRACE
        self.service.next_due = time.monotonic() + wait


__all__ = ["Schedules"]
