"""The prune service: delete finished jobs past their retention, a bounded batch at a time.

About once a ``prune_interval`` (jittered, the first at a random point so a fleet's workers
spread out), with the remote-control rows it answered (``extra``).
"""

from __future__ import annotations

import random
import time
from typing import TYPE_CHECKING

import psycopg

from ..store import database
from .maintenance import Service, Step

if TYPE_CHECKING:
    from ..app import App


class Prune:
    """The prune duty of ``app``'s jobs: ``batch`` rows a statement, at most ten a step."""

    def __init__(self, app: App, *, interval: float, batch: int, extra: Step) -> None:
        self._app = app
        self._interval = interval
        self._batch = batch
        self._extra = extra
        self.service = Service("prune", self.step,
                               first_due=time.monotonic() + random.uniform(0, interval),
                               interval=lambda: self._interval * random.uniform(0.9, 1.1))

    async def step(self, connection: psycopg.AsyncConnection) -> None:
        """Prune the remote-control rows, then the finished jobs past retention."""
        await self._extra(connection)
        for _ in range(10):  # bounded, so a huge backlog of old rows cannot stall the round
            pruned = await database.prune_jobs(
                connection, finished_retention=self._app.succeeded_retention,
                failed_retention=self._app.failed_retention, limit=self._batch)
            if pruned < self._batch:
                break


__all__ = ["Prune"]
