"""Paused queues: a queue paused here is claimed by no worker of the fleet until resumed.

The pause is a row of ``akadze.queue_pauses``, so it survives restarts and holds for workers
started later; the claim functions probe it (``akadze.queue_claimable``), which makes it exact:
once :func:`pause` returns, no worker starts a new job of the queue. Jobs already running
finish, and enqueues go on (the jobs wait). Pause and resume notify ``PAUSE_CHANNEL`` (a
``"1"`` or ``"0"`` then the queue), which workers listen to so that they stop asking for a
paused queue's jobs; a resume also notifies the queue's jobs channel, waking idle workers at
once.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

import psycopg

from ..model.serialization import check_name
from . import database

#: Pause and resume notify this channel: ``"1<queue>"`` paused, ``"0<queue>"`` resumed.
PAUSE_CHANNEL = "akadze_pauses"
#: ``list_queues`` counts a queue's due jobs up to this many.
DUE_CAP = 100_000


@dataclass(frozen=True, slots=True)
class QueueState:
    """One queue as ``list_queues`` sees it: paused or not (when and by whom), its due jobs
    (counted up to ``DUE_CAP``) and its live workers."""

    queue: str
    paused: bool
    paused_at: datetime | None = None
    paused_by: str | None = None
    due: int = 0
    workers: int = 0


def parse_notice(payload: str) -> tuple[str, bool] | None:
    """A ``PAUSE_CHANNEL`` payload: the queue and whether it is now paused (None: not ours)."""
    if payload[:1] not in ("0", "1") or len(payload) < 2:
        return None
    return payload[1:], payload[0] == "1"


def pause(connection: psycopg.Connection, queue: str, by: str | None = None) -> bool:
    """Pause ``queue`` for the whole fleet (``by``: who, for people reading the list); True
    when it was not paused already. On an autocommit connection, it holds once this returns;
    inside a transaction, once that commits, and until then the queue's claims wait for it
    (it holds the queue's claim lock exclusively): keep that transaction short."""
    _check(queue, by)
    row = database.fetch_one(connection, "queue_pause", queue=queue, by=by)
    return bool(row and row["changed"])


def resume(connection: psycopg.Connection, queue: str) -> bool:
    """Resume ``queue`` and wake its idle workers; True when it was paused."""
    check_name(queue, "a queue name")
    row = database.fetch_one(connection, "queue_resume", queue=queue)
    return bool(row and row["changed"])


def paused(connection: psycopg.Connection) -> list[QueueState]:
    """The paused queues, in name order."""
    return [QueueState(row["queue"], True, row["paused_at"], row["paused_by"])
            for row in database.fetch_all(connection, "queue_paused")]


def list_queues(connection: psycopg.Connection) -> list[QueueState]:
    """Every queue with queued jobs, live workers or a pause, in name order."""
    return [_state(row) for row in database.fetch_all(connection, "queue_list", cap=DUE_CAP)]


async def pause_async(connection: psycopg.AsyncConnection, queue: str,
                      by: str | None = None) -> bool:
    """Async twin of ``pause``."""
    _check(queue, by)
    row = await database.fetch_one_async(connection, "queue_pause", queue=queue, by=by)
    return bool(row and row["changed"])


async def resume_async(connection: psycopg.AsyncConnection, queue: str) -> bool:
    """Async twin of ``resume``."""
    check_name(queue, "a queue name")
    row = await database.fetch_one_async(connection, "queue_resume", queue=queue)
    return bool(row and row["changed"])


async def paused_names(connection: psycopg.AsyncConnection) -> set[str]:
    """The names of the paused queues (what a worker skips)."""
    return {row["queue"] for row in await database.fetch_all_async(connection, "queue_paused")}


async def list_queues_async(connection: psycopg.AsyncConnection) -> list[QueueState]:
    """Async twin of ``list_queues``."""
    rows = await database.fetch_all_async(connection, "queue_list", cap=DUE_CAP)
    return [_state(row) for row in rows]


def _check(queue: str, by: str | None) -> None:
    check_name(queue, "a queue name")
    check_name(by, "who paused it", key=True)


def _state(row: dict[str, Any]) -> QueueState:
    return QueueState(row["queue"], bool(row["paused"]), row["paused_at"], row["paused_by"],
                      int(row["due"]), int(row["workers"]))


__all__ = ["DUE_CAP", "PAUSE_CHANNEL", "QueueState", "list_queues", "list_queues_async",
           "parse_notice", "pause", "pause_async", "paused", "paused_names", "resume",
           "resume_async"]
