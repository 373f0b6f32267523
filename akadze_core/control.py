"""Operations on existing jobs: cancel and requeue, in the caller's transaction."""

from __future__ import annotations

import signal as signals

import psycopg

from . import database

__all__ = ["request_cancel", "request_cancel_sync", "requeue", "requeue_sync", "signal_number"]


def signal_number(signal: int | str) -> int:
    """The number of a signal given by number or name (``"SIGTERM"``, ``"TERM"``, ``"KILL"``
    as Celery accepts them, or ``signal.SIGKILL``); ValueError for anything else."""
    if isinstance(signal, bool):
        raise ValueError(f"not a signal: {signal!r}")
    if isinstance(signal, int):
        number = int(signal)
    elif isinstance(signal, str):
        text = signal.strip()
        if text.isdigit():
            number = int(text)
        else:
            name = text.upper() if text.upper().startswith("SIG") else "SIG" + text.upper()
            found = getattr(signals, name, None)
            if not isinstance(found, signals.Signals):
                raise ValueError(f"unknown signal name {signal!r}")
            number = int(found)
    else:
        raise ValueError(f"not a signal: {signal!r}")
    if not 0 < number < signals.NSIG:
        raise ValueError(f"signal number {number} is out of range 1-{signals.NSIG - 1}")
    return number


def _terminate_signal(terminate: bool, signal: int | str) -> int | None:
    return signal_number(signal) if terminate else None


async def request_cancel(connection: psycopg.AsyncConnection, job_id: int, *,
                         terminate: bool = False,
                         signal: int | str = signals.SIGTERM) -> bool:
    """Request cancellation of a queued or running job; returns False when it is not active.

    A queued job is cancelled at once. A job a worker claimed ahead and has not started
    (waiting for a body slot or a process) is dropped by that worker when the commit's
    notification reaches it: it ends cancelled without running, its attempt unspent. A
    running job is not interrupted: if its body returns a value it succeeds; if it raises
    (Retry and Snooze included) it ends cancelled.

    ``terminate=True``: a running job's worker, if it runs bodies in a process pool, also
    sends ``signal`` (SIGTERM; a number or a name) to the process running this body. A
    process that dies of it is replaced and the job ends cancelled, its attempt unspent;
    one that survives it (a handler) goes on, and the rules above decide. Workers running
    bodies in threads cannot stop one: there ``terminate`` is a plain cancel request.
    """
    return await database.cancel_job_async(connection, job_id,
                                           _terminate_signal(terminate, signal))


def request_cancel_sync(connection: psycopg.Connection, job_id: int, *, terminate: bool = False,
                        signal: int | str = signals.SIGTERM) -> bool:
    """Sync twin of ``request_cancel``."""
    return database.cancel_job(connection, job_id, _terminate_signal(terminate, signal))


async def requeue(connection: psycopg.AsyncConnection, job_id: int) -> bool:
    """Move a failed job back to queued; returns False when the job is not failed.

    attempt, errors and args are kept; max_attempts grows by one if no attempt is left.
    """
    return await database.requeue_job_async(connection, job_id)


def requeue_sync(connection: psycopg.Connection, job_id: int) -> bool:
    """Sync twin of ``requeue``."""
    return database.requeue_job(connection, job_id)
