"""Operations on existing jobs (cancel and requeue, in the caller's transaction), and remote
control of the live workers (``broadcast``).

A broadcast is one row of ``akadze.control_requests`` naming its target workers (the live
ones, on the database clock, that ``destination``/``select`` keep), announced by NOTIFY at
commit; each target runs the command in its loop (``akadze_core.worker.panel``) and writes its
reply row, announced back the same way. A worker that missed the NOTIFY finds the request at
its next heartbeat (polling as the fallback); a dead worker never answers. The sender
collects replies until ``timeout`` or until every target answered.
"""

from __future__ import annotations

import json
import signal as signals
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import psycopg

from ..model.dsn import listen_url
from ..model.jobs import Job
from ..store import database

if TYPE_CHECKING:
    from ..app import App

#: Seconds a request waits for its targets to take it up (Celery's control_queue_ttl).
DEFAULT_TTL = 300.0
#: While waiting for replies the sender also re-reads them this often (a lost NOTIFY).
_REPLY_POLL = 0.25


@dataclass(frozen=True, slots=True)
class ControlReply:
    """One worker's answer to a broadcast: its id and name, and what its command returned."""

    worker_id: int
    worker: str
    reply: Any


def _targets(app: App, destination: Iterable[str] | None,
             select: Callable[[str], bool] | None) -> list[int]:
    wanted = None if destination is None else set(destination)
    return [int(row["id"]) for row in app.list_workers(live=True)
            if (wanted is None or row["name"] in wanted)
            and (select is None or select(row["name"]))]


def broadcast(app: App, command: str, arguments: Mapping[str, Any] | None = None, *,
              destination: Iterable[str] | None = None,
              select: Callable[[str], bool] | None = None, reply: bool = False,
              timeout: float = 1.0, limit: int | None = None,
              callback: Callable[[ControlReply], Any] | None = None,
              ttl: float = DEFAULT_TTL) -> list[ControlReply]:
    """Send ``command`` with ``arguments`` (JSON) to the live workers named in
    ``destination`` (all when None) whose name ``select`` accepts; returns their replies.

    With ``reply=False`` it returns ``[]`` at once (the workers still run the command,
    within ``ttl`` seconds). With ``reply=True`` it waits up to ``timeout`` seconds, or until
    every target answered, or until ``limit`` replies came, calling ``callback`` on each as
    it arrives. A worker that handled the command without a reply (``shutdown``) counts as
    having answered but adds nothing to the list.
    """
    targets = _targets(app, destination, select)
    if not targets:
        return []
    params = {"command": command, "arguments": json.dumps(dict(arguments or {}), default=str),
              "targets": targets, "reply": reply, "ttl": max(ttl, timeout)}
    if not reply:
        app.connections.run_pooled(lambda connection: database.fetch_one(connection, "control_send",
                                                             **params))
        return []
    deadline = time.monotonic() + timeout
    kwargs = {**app.connection_kwargs, "autocommit": True}
    with psycopg.connect(listen_url(app.database_url), **kwargs) as connection:
        database.listen(connection, [database.CONTROL_REPLY_CHANNEL])
        sent = database.fetch_one(connection, "control_send", **params)
        assert sent is not None
        return _collect(connection, int(sent["id"]), len(targets), deadline, limit, callback)


def _collect(connection: psycopg.Connection, request_id: int, expected: int,
             deadline: float, limit: int | None,
             callback: Callable[[ControlReply], Any] | None) -> list[ControlReply]:
    """The replies to ``request_id`` as they come, until the deadline, ``expected``
    answers or ``limit`` replies."""
    answered: set[int] = set()
    replies: list[ControlReply] = []
    while True:
        for row in database.fetch_all(connection, "control_replies", request_id=request_id):
            worker_id = int(row["worker_id"])
            if worker_id in answered:
                continue
            answered.add(worker_id)
            if row["reply"] is None:
                continue
            one = ControlReply(worker_id, row["worker_name"], row["reply"])
            replies.append(one)
            if callback is not None:
                callback(one)
            if limit is not None and len(replies) >= limit:
                return replies
        left = deadline - time.monotonic()
        if len(answered) >= expected or left <= 0:
            return replies
        for notify in connection.notifies(timeout=min(left, _REPLY_POLL)):
            if notify.payload == str(request_id):
                break

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


def scheduled_jobs(app: App, worker_id: int | None, queues: Iterable[str],
                   limit: int = 1000) -> list[Job]:
    """The jobs of ``queues`` waiting for their eta that the worker ``worker_id`` reports
    (``inspect().scheduled()``): each job under one live worker only, the lowest id among
    those consuming its queue, so the replies of a fleet add up to every such job once."""
    rows = app.connections.run_pooled(lambda connection: database.fetch_all(
        connection, "control_scheduled", worker_id=worker_id, queues=list(queues),
        limit=limit))
    return [Job.from_row(row) for row in rows]


def revoked_task_ids(app: App, window: float, limit: int) -> list[str]:
    """Task ids (``App.task_id_of``) revoked within the last ``window`` seconds (cancelled
    or expired, or running with a cancel requested), newest first."""
    rows = app.connections.run_pooled(lambda connection: database.fetch_all(
        connection, "control_revoked", window=window, limit=limit))
    if not rows:
        return []
    derive = app.task_ids().derive
    return [str(row["task_id"]) if row["task_id"] is not None else derive(int(row["id"]))
            for row in rows]
