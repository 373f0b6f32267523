"""Whether a connection can take a statement, and what a connection that broke after one
was sent becomes.

Before sending, a connection is checked without a round trip (``found_dead``) and replaced
when it is dead: nothing was sent, so nothing can run twice. After sending, akadze never
sends again: an error that left the connection closed becomes ``ConnectionLost``
(``sent``), which says what is unknown. ``Connections`` runs every call through these.
"""

from __future__ import annotations

import select
from collections.abc import Callable
from typing import Any, Protocol, TypeVar

import psycopg

from ..model.errors import ConnectionLost

T = TypeVar("T")

_OK = psycopg.pq.ConnStatus.OK

#: What a lost connection leaves unknown, for ``ConnectionLost``'s message.
UNSURE = "the statement may or may not have taken effect"


class Room(Protocol):
    """What ``sent`` needs of the connections it runs a call on (``Connections`` is one)."""

    def redact(self, text: str) -> str:
        """``text`` with the database password scrubbed out."""
        ...

    def lost_a_prepared_statement(self, exc: psycopg.Error,
                                  connection: psycopg.Connection | psycopg.AsyncConnection
                                  ) -> bool:
        """Whether ``exc`` is a pooler's lost prepared statement (then run it again)."""
        ...


if hasattr(select, "poll"):
    def _readable(fd: int) -> bool:
        poller = select.poll()  # poll, not select: no FD_SETSIZE limit on the descriptor
        poller.register(fd, select.POLLIN)
        return bool(poller.poll(0))  # POLLHUP and POLLERR count too

    def watch(connection: psycopg.Connection | psycopg.AsyncConnection) -> Any:
        """A poller of ``connection``'s socket for ``found_dead``, made once for a connection
        checked before every call (``run_single``'s): making and registering one per check
        cost a fifth of the check. None when the socket cannot be had (then it is checked
        the usual way)."""
        try:
            fd = connection.pgconn.socket
        except (psycopg.OperationalError, OSError, ValueError):
            return None
        poller = select.poll()
        poller.register(fd, select.POLLIN)
        return poller
else:  # Windows
    def _readable(fd: int) -> bool:
        return bool(select.select([fd], [], [], 0)[0])

    def watch(connection: psycopg.Connection | psycopg.AsyncConnection) -> Any:
        """No kept poller on Windows: ``found_dead`` selects on the socket itself."""
        return None


def found_dead(connection: psycopg.Connection | psycopg.AsyncConnection,
               watcher: Any = None) -> bool:
    """True when an idle connection is provably unusable, found without a round trip.

    ``connection`` must be idle with nothing sent on it: then it has read everything up to
    its last ReadyForQuery, and a connection nobody LISTENs on is sent nothing unasked
    except on the server's way out. A restart, failover, ``pg_terminate_backend`` or
    ``idle_session_timeout`` leaves a FATAL ErrorResponse and the end of the stream
    waiting on the socket. So closed, or anything to read, means "do not send on it".
    The odd harmless message (a notice) only costs a reconnect; nothing was sent either
    way, so replacing the connection can never run a statement twice. One zero-timeout
    poll: microseconds. A server gone without closing the socket (a host lost, a cable
    cut) is not seen here; a statement sent on it fails after sending (``ConnectionLost``).
    ``watcher``: ``watch(connection)``, kept with the connection, or None. The socket of a
    connection whose status is OK is the one it was made for (libpq never changes it while
    the connection is open), so its poller stays right.
    """
    pgconn = connection.pgconn
    if pgconn.status != _OK:
        return True
    try:
        if watcher is not None:
            return bool(watcher.poll(0))
        return _readable(pgconn.socket)
    except (psycopg.OperationalError, OSError, ValueError):
        return True


def _lost(room: Room, exc: psycopg.Error, unsure: str) -> ConnectionLost:
    """The ``ConnectionLost`` for a connection that broke after its statement was sent."""
    cause = " ".join(str(exc).split()) or "the connection was closed"
    return ConnectionLost(room.redact(
        f"the connection to Postgres broke after the statement was sent, so {unsure}; "
        "akadze does not send it again, since that could do it twice "
        f"({type(exc).__name__}: {cause})"))


def sent(room: Room, call: Callable[[psycopg.Connection], T],
         connection: psycopg.Connection, unsure: str) -> T:
    """``call(connection)``; an error that left the connection closed happened after the
    statement was sent, so it becomes ``ConnectionLost`` (``unsure``: what is unknown)."""
    try:
        return call(connection)
    except ConnectionLost:
        raise
    except psycopg.Error as exc:
        if connection.closed:
            raise _lost(room, exc, unsure) from exc
        if not room.lost_a_prepared_statement(exc, connection):
            raise
    # The statement never ran (Parse or Bind failed): run it again, now unprepared.
    return call(connection)


async def sent_async(room: Room, call: Callable[[psycopg.AsyncConnection], Any],
                     connection: psycopg.AsyncConnection, unsure: str) -> Any:
    """Async twin of ``sent``."""
    try:
        return await call(connection)
    except ConnectionLost:
        raise
    except psycopg.Error as exc:
        if connection.closed:
            raise _lost(room, exc, unsure) from exc
        if not room.lost_a_prepared_statement(exc, connection):
            raise
    return await call(connection)


__all__ = ["UNSURE", "Room", "found_dead", "sent", "sent_async", "watch"]
