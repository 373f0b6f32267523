"""Maintenance services: each duty of the worker (rescue, orphans, prune, schedules) on its
own clock, in its own asyncio task, after River's maintenance services.

Running them beside the claim loop, not in it, is the point: a prune waiting on a lock (or
a slow schedule check) delays nothing but itself, while claims, heartbeats and the other
duties go on. A service runs only while the worker is healthy (seed 000: after a database
error nothing runs until a heartbeat succeeds), and each step goes through the worker's
guard, which turns a transient error into "unhealthy" and any other into a stop.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Awaitable, Callable
from typing import Any

import psycopg

from ..store.listener import first_of

Step = Callable[[psycopg.AsyncConnection], Awaitable[Any]]
Guard = Callable[[Step, str], Awaitable[bool]]


class Service:
    """One maintenance duty: ``step`` runs when it is due (``next_due``, on the monotonic
    clock) or when ``trigger()`` asks, then is due again ``interval()`` seconds after it
    started (a step may move ``next_due`` itself). ``interval`` returning ``math.inf``
    makes a service that runs on triggers only; ``enabled`` False skips a due step without
    touching the database."""

    def __init__(self, name: str, step: Step, *, first_due: float = math.inf,
                 interval: Callable[[], float] = lambda: math.inf,
                 enabled: Callable[[], bool] = lambda: True) -> None:
        self.name = name
        self.next_due = first_due
        self._step = step
        self._interval = interval
        self._enabled = enabled
        # Set by trigger(), or to make run() look at a next_due moved earlier.
        self._poke = asyncio.Event()

    def trigger(self, delay: float = 0.0) -> None:
        """Run the step as soon as the worker is healthy (not before ``delay`` seconds: a
        burst of triggers then makes one step)."""
        self.next_due = min(self.next_due, time.monotonic() + delay)
        self._poke.set()

    async def run(self, guard: Guard, healthy: asyncio.Event, stop: asyncio.Event) -> None:
        """Run the step whenever due, until ``stop`` is set (or the task is cancelled)."""
        while not stop.is_set():
            self._poke.clear()
            wait = self.next_due - time.monotonic()
            if wait > 0:
                await first_of(stop, self._poke, timeout=None if math.isinf(wait) else wait)
                continue
            if not healthy.is_set():
                await first_of(stop, healthy)
                continue
            self.next_due = time.monotonic() + self._interval()
            if self._enabled():
                await guard(self._step, self.name)
