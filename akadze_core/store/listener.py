"""Turn NOTIFY into wake-ups: an idle worker claims right after an enqueue commits, and hears
at once of a cancel request for a job it holds claimed ahead.

Polling stays the fallback, so a lost LISTEN connection (or pgbouncer in transaction mode,
where LISTEN does not work) only costs latency, never a job: the worker also checks its
waiting jobs for cancel requests every heartbeat.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterable, Mapping
from datetime import datetime
from typing import Any

import psycopg

from . import database
from .database import CANCEL_CHANNEL, CONTROL_CHANNEL, NOTIFY_CHANNEL, SCHEDULES_CHANNEL
from .floors import parse_notice
from .pauses import PAUSE_CHANNEL
from .pauses import parse_notice as parse_pause

logger = logging.getLogger("akadze.worker")


async def first_of(*events: asyncio.Event, timeout: float | None = None) -> None:
    """Wait until one of ``events`` is set, or ``timeout`` seconds (None: no limit)."""
    waiters = [asyncio.ensure_future(event.wait()) for event in events]
    try:
        await asyncio.wait(waiters, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for waiter in waiters:
            waiter.cancel()


async def listen_for_jobs(url: str, queues: Iterable[str], wake: Callable[[], None],
                          backoff: Callable[[int], float],
                          cancelled: Callable[[int], None] | None = None, *,
                          connect_kwargs: Mapping[str, Any] | None = None,
                          schedules_changed: Callable[[str], None] | None = None,
                          control: Callable[[str], None] | None = None,
                          terminate: Callable[[int, int], None] | None = None,
                          jobs_heard: Callable[[str, tuple[int, datetime] | None], None]
                          | None = None,
                          connected: Callable[[bool], None] | None = None,
                          paused: Callable[[str, bool], None] | None = None) -> None:
    """Call ``wake()`` whenever a job becomes due on one of ``queues``, ``cancelled(id)``
    when a cancel of a running job is requested (``terminate(id, signal)`` instead when
    it asks for the body's process to be ended and ``terminate`` is given), and
    ``schedules_changed(name)`` when a runtime schedule changed (with ``""`` each time
    LISTEN starts: what changed while no one listened is unknown); runs until cancelled,
    reconnecting after ``backoff(failures)`` seconds when the connection is lost.
    ``connect_kwargs``: psycopg's connection keywords (the app's keepalives, which end a
    LISTEN on a partitioned network). ``control(payload)`` hears every remote-control
    request. A ``set`` of queues is watched as it changes (a worker adding and removing
    queues at runtime). ``jobs_heard(queue, key)`` hears, before each such ``wake()``, which
    queue and, when the notification says it, the lowest (priority, scheduled_at) made
    queued (akadze_core.store.floors); ``connected(True)`` is called each time LISTEN starts,
    ``connected(False)`` each time its connection is lost. ``paused(queue, now_paused)``
    hears every pause and resume of a queue (akadze_core.store.pauses)."""
    kwargs = {"connect_timeout": 5, **(connect_kwargs or {}), "autocommit": True}
    watched = queues if isinstance(queues, set) else set(queues)
    # A live set may gain a queue later: its jobs channel is listened to even while empty.
    jobs = bool(watched) or isinstance(queues, set)
    channels = ([NOTIFY_CHANNEL] if jobs else []) + ([CANCEL_CHANNEL] if cancelled else []) \
        + ([SCHEDULES_CHANNEL] if schedules_changed else []) \
        + ([CONTROL_CHANNEL] if control else []) + ([PAUSE_CHANNEL] if paused else [])
    failures = 0
    while True:
        try:
            async with await psycopg.AsyncConnection.connect(url, **kwargs) as connection:
                await database.listen_async(connection, channels)
                failures = 0
                if connected is not None:
                    connected(True)
                if schedules_changed is not None:
                    schedules_changed("")
                async for notify in connection.notifies():
                    if notify.channel == CANCEL_CHANNEL:
                        heard = _cancel_payload(notify.payload)
                        if cancelled is not None and heard is not None:
                            job_id, signum = heard
                            if signum is not None and terminate is not None:
                                terminate(job_id, signum)
                            else:
                                cancelled(job_id)
                    elif notify.channel == CONTROL_CHANNEL:
                        if control is not None:
                            control(notify.payload)
                    elif notify.channel == PAUSE_CHANNEL:
                        pause = parse_pause(notify.payload)
                        if paused is not None and pause is not None:
                            paused(*pause)
                    elif notify.channel == SCHEDULES_CHANNEL:
                        if schedules_changed is not None:
                            schedules_changed(notify.payload)
                    else:
                        queue, key = parse_notice(notify.payload)
                        if queue in watched:
                            if jobs_heard is not None:
                                jobs_heard(queue, key)
                            wake()
        except asyncio.CancelledError:
            if connected is not None:
                connected(False)
            raise
        except Exception as exc:
            if connected is not None:
                connected(False)
            failures += 1
            logger.debug("LISTEN connection lost (%s); polling meanwhile", type(exc).__name__)
            await asyncio.sleep(backoff(failures))


def _cancel_payload(payload: str) -> tuple[int, int | None] | None:
    """``"<id>"`` (a cancel request) or ``"<id>:<signal>"`` (terminate); None otherwise."""
    job_id, _, signum = payload.partition(":")
    if not job_id.isdigit() or (signum and not signum.isdigit()):
        return None
    return int(job_id), int(signum) if signum else None
