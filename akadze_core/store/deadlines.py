"""Database calls with a deadline: a network partition must not hang a worker.

A statement sent into a network that stopped answering (no RST, no FIN: a cable cut, a
firewall dropping packets, a frozen middlebox) gets no error for minutes. TCP keepalives only
probe a connection with nothing in flight, ``tcp_user_timeout`` only counts bytes nobody
acknowledged, and something in between (a proxy, a pooler) may acknowledge them all. So the
worker bounds each call itself, by the time left on its lease.

On expiry the call is not cancelled: psycopg answers a cancellation mid-query by sending a
cancel request and then waiting up to 10 s for the query to end, both through the same dead
network. The socket is shut down instead (``shutdown(SHUT_RDWR)``; the descriptor stays
psycopg's): the read in flight ends at once with an ``OperationalError``, the connection is
broken and the pool discards it. What was sent may still reach the server later, exactly as
with a connection that broke after sending: every outcome write is fenced by run_count and
the claim token, and a claim whose answer was lost is handed back by the orphans check.

A slow answer is not silence. Users' servers are busy: a claim may wait seconds for the
CPU, the disk, or a vacuum while the server answers every other connection. So a worker's
calls wait ``within_lease``: as long as its lease holds, the lease read again when it runs
out. A heartbeat that got through on another connection meanwhile has moved it on (the server
is alive, only slow) and the call goes on waiting; only a lease that ran out unrenewed (the
heartbeats got no answer either: a partition or an outage) abandons it. A generous cap still
bounds a call on a live server, for the one connection that went silent on its own.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import psycopg

T = TypeVar("T")

#: Seconds the abandoned call gets to notice its socket was shut down (it takes
#: microseconds) before it is cancelled after all.
GRACE = 1.0

#: Seconds a call made at (or past) the end of its lease still gets to answer.
LAST_CHANCE = 0.1


class NoAnswer(TimeoutError):
    """The database did not answer a call in time; its connection was abandoned (transient:
    the worker retries, or stops when its heartbeat is older than ``heartbeat_ttl``)."""


async def within(seconds: float, connection: psycopg.AsyncConnection, call: Awaitable[T],
                 what: str = "the call") -> T:
    """Await ``call`` (which uses ``connection``) for at most ``seconds``; then abandon the
    connection and raise ``NoAnswer``. Cancelled meanwhile, it abandons the connection too
    before passing the cancellation on, so psycopg's slow cancel never runs."""
    task = asyncio.ensure_future(call)
    try:
        await asyncio.wait({task}, timeout=seconds)
    except asyncio.CancelledError:
        await _abandon(connection, task)
        raise
    if task.done():
        return task.result()
    await _abandon(connection, task)
    raise NoAnswer(f"no answer from the database to {what} within {seconds:.1f}s "
                   "(network partition?); its connection was abandoned")


async def within_lease(lease_end: Callable[[], float], cap: float,
                       connection: psycopg.AsyncConnection, call: Awaitable[T],
                       what: str = "the call") -> T:
    """Await ``call`` (which uses ``connection``) while the caller's lease holds, and at most
    ``cap`` seconds; then abandon the connection and raise ``NoAnswer``, as ``within`` does.

    ``lease_end()`` is the ``time.monotonic()`` at which the lease ends. It is read again
    each time the wait reaches it: renewed meanwhile (a heartbeat got through on another
    connection, so the server answers and is only busy), the call goes on waiting; not
    renewed (no answer to the heartbeats either), it is abandoned."""
    loop = asyncio.get_running_loop()
    # What the caller waits on: rung by the call's own task as its last step, so the caller
    # resumes on the next loop turn (through the task's done callbacks, as asyncio.wait
    # has it, it took two turns, each behind every callback ready meanwhile: a claim's
    # answer waited behind the bodies of two batches of runs), or by the timer.
    bell: list[asyncio.Future[None]] = [loop.create_future()]

    async def run() -> T:
        try:
            return await call
        finally:
            _ring(bell[0])

    task = loop.create_task(run())
    started = time.monotonic()
    give_up = started + cap
    end = max(lease_end(), started + LAST_CHANCE)
    while True:
        timer = loop.call_later(max(0.0, min(end, give_up) - time.monotonic()), _ring,
                                bell[0])
        try:
            await bell[0]
        except asyncio.CancelledError:
            await _abandon(connection, task)
            raise
        finally:
            timer.cancel()
        if task.done():
            return task.result()
        now = time.monotonic()
        renewed = lease_end()
        if now >= give_up or renewed <= now:
            break
        end = renewed
        bell[0] = loop.create_future()
    await _abandon(connection, task)
    waited = time.monotonic() - started
    if now >= give_up:
        raise NoAnswer(f"no answer from the database to {what} within {waited:.1f}s, though "
                       "the server answers other calls; its connection was abandoned")
    raise NoAnswer(f"no answer from the database to {what} within {waited:.1f}s, nor to the "
                   "heartbeats (network partition?); its connection was abandoned")


def _ring(bell: asyncio.Future[None]) -> None:
    if not bell.done():
        bell.set_result(None)


async def _abandon(connection: psycopg.AsyncConnection, task: asyncio.Future[Any]) -> None:
    if task.done():
        return
    shut_down(connection)
    await asyncio.wait({task}, timeout=GRACE)
    if not task.done():
        task.cancel()  # the socket could not be shut down: psycopg's own way, slower
    # Whatever it raised is what abandoning it meant: retrieved, so asyncio does not log it.
    task.add_done_callback(lambda done: done.cancelled() or done.exception())


async def cancel_and_wait(*tasks: asyncio.Future[Any], every: float = 0.5) -> None:
    """Cancel ``tasks`` and wait until each has ended, cancelling again every ``every``
    seconds while one is still running.

    One ``cancel()`` is not always enough: on Python 3.11, ``asyncio.wait_for`` swallows a
    cancellation that lands while its own timeout is firing, and psycopg before 3.3 waits on
    every socket in ``wait_for(..., 0.1)``, so a task reading notifications or a result is
    cancelled in vain about one time in twenty, and a worker's stop hung on its listener.
    A second request reaches it at its next wait. For akadze's own tasks, whose cleanup
    does not wait on anything: a task given time to clean up (a job's body) is cancelled
    once."""
    pending = {task for task in tasks if not task.done()}
    while pending:
        for task in pending:
            task.cancel()
        _, pending = await asyncio.wait(pending, timeout=every)
    # Retrieved, so asyncio does not log what a cancelled task raised on its way out.
    for task in tasks:
        if not task.cancelled():
            task.exception()


def shut_down(connection: psycopg.AsyncConnection) -> None:
    """Shut the connection's socket down both ways (no RST; the peer sees FIN if it ever
    hears anything). Any read or write waiting on it ends with an error at once."""
    with contextlib.suppress(psycopg.Error, OSError, ValueError):
        fd = connection.pgconn.socket
        # fromfd duplicates the descriptor: closing the copy leaves psycopg's alone, and
        # shutdown acts on the socket itself, which both share.
        with socket.fromfd(fd, socket.AF_INET, socket.SOCK_STREAM) as sock:
            sock.shutdown(socket.SHUT_RDWR)
