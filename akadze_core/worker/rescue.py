"""The rescue service: hand back the jobs of workers whose heartbeat is older than their TTL.

Every worker runs it after each heartbeat that succeeds, so the fleet needs no supervisor:
a run lost with its worker goes back to the queue (or fails, with no attempts left) once
any other worker beats.
"""

from __future__ import annotations

import logging
from typing import Any

import psycopg

from ..store import database
from .maintenance import Service

logger = logging.getLogger("akadze.worker")


class Rescue:
    """The rescue duty; ``service`` runs it (triggered after every good heartbeat)."""

    def __init__(self) -> None:
        #: Runs on triggers only: after every heartbeat that succeeds.
        self.service = Service("rescue", self.step)

    async def step(self, connection: psycopg.AsyncConnection) -> None:
        """Rescue the jobs of dead workers, one line each."""
        rows = await database.rescue_jobs(connection)
        for row in rows:
            logger.warning("rescued job %s from a dead worker: now %s (%s)", row["id"],
                           row["state"], rescued(row))


def rescued(row: dict[str, Any]) -> str:
    """What became of a rescued run, after the rescue line's "now <state>"."""
    lost = (f"{row['task']} attempt {row['attempt']}/{row['max_attempts']} lost: WorkerLost: "
            f"its worker stopped heartbeating")
    if row["state"] == "queued":
        return f"{lost}; retry in {max(0.0, row['retry_in']):.1f}s"
    if row["state"] == "failed":
        return f"{lost}; no attempts left"
    return f"{lost}; a cancel was requested or it expired"


__all__ = ["Rescue", "rescued"]
