"""Operations on existing jobs: cancel and requeue, in the caller's transaction."""

from __future__ import annotations

import psycopg

from . import database


async def request_cancel(connection: psycopg.AsyncConnection, job_id: int) -> bool:
    """Request cancellation of a queued or running job; returns False when it is not active.

    A queued job is cancelled at once. A job a worker claimed ahead and has not started
    (waiting for a body slot or a process) is dropped by that worker when the commit's
    notification reaches it: it ends cancelled without running, its attempt unspent. A
    running job is not interrupted: if its body returns a value it succeeds; if it raises
    (Retry and Snooze included) it ends cancelled.
    """
    return await database.cancel_job_async(connection, job_id)


def request_cancel_sync(connection: psycopg.Connection, job_id: int) -> bool:
    """Sync twin of ``request_cancel``."""
    return database.cancel_job(connection, job_id)


async def requeue(connection: psycopg.AsyncConnection, job_id: int) -> bool:
    """Move a failed job back to queued; returns False when the job is not failed.

    attempt, errors and args are kept; max_attempts grows by one if no attempt is left.
    """
    return await database.requeue_job_async(connection, job_id)


def requeue_sync(connection: psycopg.Connection, job_id: int) -> bool:
    """Sync twin of ``requeue``."""
    return database.requeue_job(connection, job_id)
