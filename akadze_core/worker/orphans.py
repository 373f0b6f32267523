"""The orphans service: hand back the jobs a claim gave this worker whose answer was lost.

A claim may commit and lose its answer with the connection: the database then says this
worker runs jobs it never heard of, and no rescue touches them while it heartbeats. After
any connection error (``lost_answer``) claims wait until this service has handed such jobs
back, without spending an attempt.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

import psycopg

from ..store import database
from .maintenance import Service

logger = logging.getLogger("akadze.worker")


class Orphans:
    """The orphans duty. ``worker_id`` and ``known`` (the jobs this worker holds or still
    has outcomes for) are read when it runs; ``claim_lock`` keeps claims out meanwhile;
    ``wake`` is set when it is done (claims waited for it)."""

    def __init__(self, *, worker_id: Callable[[], int | None], known: Callable[[], set[int]],
                 claim_lock: asyncio.Lock, wake: asyncio.Event) -> None:
        self._worker_id = worker_id
        self._known = known
        self._claim_lock = claim_lock
        self._wake = wake
        #: Set by any connection error: a claim may have committed and lost its answer.
        #: Claims wait until this service has handed such jobs back.
        self.pending = False
        #: Runs on triggers only: after a database error, once healthy again.
        self.service = Service("orphan check", self.step)

    def lost_answer(self) -> None:
        """A connection error: claims stop until the check has run."""
        self.pending = True
        self.service.trigger()

    async def step(self, connection: psycopg.AsyncConnection) -> None:
        """Hand back the orphans (under the claim lock), then wake the claims."""
        async with self._claim_lock:
            await self._return_orphans(connection)
        self._wake.set()

    async def _return_orphans(self, connection: psycopg.AsyncConnection) -> None:
        # Jobs whose outcome is still queued for writing are known too. The caller holds
        # the claim lock, so no claim is in flight meanwhile.
        worker_id = self._worker_id()
        assert worker_id is not None
        rows = await database.return_orphans(connection, worker_id, sorted(self._known()))
        self.pending = False
        for row in rows:
            logger.warning("job %s was claimed by a query whose answer was lost: returned to "
                           "the queue without spending an attempt", row["id"])


__all__ = ["Orphans"]
