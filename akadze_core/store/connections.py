"""The connection room: every connection an App opens, and the state that goes with them.

``Connections`` owns the database URL (the embedded Postgres when none is set), the sync
pool, an async pool per event loop, the single-call connection of ``run_single``, the
replacement of a connection found dead before anything was sent on it (``liveness``), and
the switch to unprepared statements behind a transaction pooler (``stop_preparing``). It sits at the
bottom of the core: it knows nothing of tasks, schedules or workers, so everything above
can use it without importing ``App``.
"""

from __future__ import annotations

import asyncio
import logging
import os
import threading
import time
import weakref
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import psycopg
import psycopg_pool

from ..model.dsn import configured_url, listen_url, password_of, redact_password
from ..model.dsn import prepare_threshold as resolve_prepare_threshold
from ..model.errors import AkadzeError, ConfigurationError, DatabaseUnavailable
from .dberrors import PREPARED_STATEMENT_LOST, is_too_many_connections, is_transient
from .embedded import embedded_url
from .liveness import UNSURE, found_dead, sent, sent_async, watch
from .migrations import migrate
from .notices import NoticeLimiter

logger = logging.getLogger("akadze.app")

T = TypeVar("T")

#: Seconds ``run_single``'s connection is used before it is replaced by a new one (the
#: pool's own ``max_lifetime`` default): a long-lived client moves with a rebalanced pooler
#: and gives back the server memory a backend accumulates.
SINGLE_LIFETIME = 3600.0
#: Seconds a connection found dead is replaced for before giving up: after a restart or a
#: failover the server may refuse connections (connection refused, 57P03 cannot_connect_now)
#: for a while, and the call waits that out instead of failing.
RECONNECT_WINDOW = 15.0
_IDLE = psycopg.pq.TransactionStatus.IDLE

#: libpq's connection settings on every connection akadze opens (over TCP; libpq ignores
#: the keepalives and ``tcp_user_timeout`` on a Unix socket). They make the kernel give up
#: on a peer gone silent (a partition, a host lost: no RST, no FIN ever arrives) well inside
#: the worker's default ``heartbeat_ttl`` of 30 s, instead of TCP's ~15 minutes of
#: retransmissions or never for an idle connection: a connection idle for 10 s is probed
#: every 5 s and dropped after 3 unanswered probes (25 s), and bytes unacknowledged for 20 s
#: drop it. Constants, not derived from the TTL: an App serves any number of workers, each
#: of which also bounds its own calls by the time left on its lease (``deadlines``), which
#: is what decides when a partitioned worker stops. ``connect_timeout`` bounds a connection
#: attempt, startup included (psycopg's own default is 130 s).
TCP_SETTINGS: dict[str, int] = {
    "connect_timeout": 10, "keepalives": 1, "keepalives_idle": 10, "keepalives_interval": 5,
    "keepalives_count": 3, "tcp_user_timeout": 20_000}

def _after_fork() -> None:
    """In a forked child, every app's connections are let go of unclosed.

    They are the parent's sockets: a statement sent on one would interleave two processes'
    messages on one session, and closing one (psycopg sends Terminate) would end the
    parent's session. Dropped, they are not closed: psycopg finishes a connection on garbage
    collection only in the process that opened it. The locks are new too, since one held
    by another thread at the fork would stay held in the child. Each app opens connections
    of its own on first use (gunicorn ``--preload``, multiprocessing's fork start method).
    """
    for room in list(_ROOMS):
        room._no_connections()


# Every Connections, so that _after_fork can find them (weak: an App may be dropped).
_ROOMS: weakref.WeakSet[Connections] = weakref.WeakSet()
if hasattr(os, "register_at_fork"):  # POSIX; elsewhere there is no fork
    os.register_at_fork(after_in_child=_after_fork)


def _left(deadline: float | None) -> float | None:
    """The seconds left until ``deadline`` (None: no deadline)."""
    return None if deadline is None else max(0.0, deadline - time.monotonic())


class Connections:
    """The connections of one App: its URL, pools, single-call connection and settings.

    ``database_url``: the app's URL (None: ``AKADZE_DATABASE_URL``, else the embedded
    Postgres); ``pool_size``: the most connections of each pool; ``prepare_threshold``: as
    ``App(prepare_threshold=...)``.
    """

    def __init__(self, database_url: str | None = None, *, pool_size: int = 10,
                 prepare_threshold: int | str | None = None) -> None:
        self._explicit_url = database_url
        self._url: str | None = None
        self.pool_size = pool_size
        #: psycopg's ``prepare_threshold`` for every connection this app (and a worker of it)
        #: opens: ``prepare_threshold=`` if given, else ``$AKADZE_PREPARE_THRESHOLD``, else 5;
        #: ``"off"`` (None) behind PgBouncer in transaction mode (see ``dsn.prepare_threshold``).
        self.prepare_threshold = resolve_prepare_threshold(prepare_threshold)
        #: The keywords every connection of this app is opened with (``TCP_SETTINGS`` too).
        self.connection_kwargs: dict[str, Any] = {
            "autocommit": True, "prepare_threshold": self.prepare_threshold, **TCP_SETTINGS}
        #: The notices this process's single enqueues sent lately, which let the next ones
        #: of the same queue and priority skip theirs (akadze_core.store.notices).
        self.notices = NoticeLimiter()
        self._redact_url: str | None = None
        self._redact_password: str | None = None
        self._no_connections()
        _ROOMS.add(self)

    def _no_connections(self) -> None:
        """Start with no connection: at creation, and in a forked child (``_after_fork``)."""
        self._lock = threading.Lock()
        self._pool: psycopg_pool.ConnectionPool | None = None
        # run_single's own connection (with when it was opened and its socket's poller,
        # liveness.watch) and the lock that says who is using it: a caller finding it in
        # use takes a pooled connection instead.
        self._single: tuple[psycopg.Connection, float, Any] | None = None
        # The last single-call connection broke during a call: the server was there a
        # moment ago, so the next connect waits out refusals as for one found dead.
        self._single_broke = False
        self._single_lock = threading.Lock()
        self._async_pools: weakref.WeakKeyDictionary[
            asyncio.AbstractEventLoop, psycopg_pool.AsyncConnectionPool
        ] = weakref.WeakKeyDictionary()
        # The async pools this app opened itself (not those a worker handed in), the only
        # ones use_async_pool may close.
        self._own_async_pools: weakref.WeakSet[psycopg_pool.AsyncConnectionPool] = \
            weakref.WeakSet()
        # How many run_pooled_async calls hold each async pool (opening it, waiting for a
        # connection or using one), and the app's own pools use_async_pool replaced while
        # calls held them: the last of those calls closes such a pool.
        self._async_users: dict[psycopg_pool.AsyncConnectionPool, int] = {}
        self._retired_async_pools: set[psycopg_pool.AsyncConnectionPool] = set()

    # --- the database URL ---------------------------------------------------------------

    @property
    def database_url(self) -> str:
        """The Postgres URL, starting the embedded server (and migrating it) if none is set."""
        return self.resolve_database_url()

    def resolve_database_url(self, *, create: bool = True) -> str:
        """The Postgres URL: the app's, else ``AKADZE_DATABASE_URL``, else the embedded
        Postgres of this project (started, and migrated, on first use).

        With ``create=False`` (commands that only read) an embedded database that does not
        exist yet is not made: ``NoDatabaseError`` says where it would live. The URL is
        kept, so later calls (and ``database_url``) return it without looking again.
        """
        with self._lock:
            if self._url is None:
                url = configured_url(self._explicit_url)
                if url is None:
                    url = embedded_url(create=create)
                    with psycopg.connect(url, **self.connection_kwargs) as connection:
                        migrate(connection)
                self._url = url
            return self._url

    def set_database_url(self, url: str) -> None:
        """Point the app at another database. Only before the app has opened a pool."""
        with self._lock:
            if self._pool is not None or self._single is not None or len(self._async_pools):
                raise ConfigurationError("set_database_url: the app is already connected")
            self._explicit_url = url
            self._url = None

    def redact(self, text: str) -> str:
        """``text`` with this app's database password scrubbed out."""
        # Before the app has connected (a pool child whose task never touched the database)
        # its URL is still the one it will use: the explicit one, else the environment's.
        url = self._url or configured_url(self._explicit_url) or ""
        if url != self._redact_url:  # parse the DSN once, not on every log line
            self._redact_url, self._redact_password = url, password_of(url)
        password = self._redact_password
        # What redact_password changes needs a "/" (a URL), a "=" (key=value) or the
        # password: a text with none of them (a worker's line per job) is returned as it is,
        # without its two calls.
        if "/" not in text and "=" not in text and not (password and password in text):
            return text
        return redact_password(text, password)

    # --- prepared statements behind a transaction pooler ----------------------------------

    def lost_a_prepared_statement(self, exc: psycopg.Error,
                                  connection: psycopg.Connection | psycopg.AsyncConnection
                                  ) -> bool:
        """Whether ``exc`` says a prepared statement is missing on (or already on) the server
        connection, as behind PgBouncer in transaction mode; then this app stops preparing
        statements (``stop_preparing``) and the caller may run the statement again on
        ``connection``: that error comes from Parse or Bind, before anything ran. False for
        any other error, and once preparing is off already on this connection (the error is
        then not the pooler's)."""
        if exc.sqlstate not in PREPARED_STATEMENT_LOST or connection.prepare_threshold is None:
            return False
        self.stop_preparing()
        connection.prepare_threshold = None
        return True

    def stop_preparing(self) -> None:
        """Send every statement of this app unprepared from now on, on every connection:
        new ones are opened so, and a pooled one is switched when next handed out
        (``live_pooled``). Called when a transaction pooler lost a prepared statement;
        one WARNING names the setting that says so up front."""
        if self.prepare_threshold is None:
            return
        logger.warning("a prepared statement was lost between transactions (PgBouncer in "
                       "transaction mode?): this process stops preparing statements; set "
                       "AKADZE_PREPARE_THRESHOLD=off to say so up front")
        self.prepare_threshold = None
        self.connection_kwargs["prepare_threshold"] = None

    # --- new connections ----------------------------------------------------------------

    def connect(self, **kwargs: Any) -> psycopg.Connection:
        """A new sync connection to the database (the caller closes it), with this app's
        ``prepare_threshold`` unless ``kwargs`` says otherwise."""
        return psycopg.connect(self.database_url,
                               **{"prepare_threshold": self.prepare_threshold, **kwargs})

    async def connect_async(self, **kwargs: Any) -> psycopg.AsyncConnection:
        """A new async connection to the database (the caller closes it), with this app's
        ``prepare_threshold`` unless ``kwargs`` says otherwise."""
        return await psycopg.AsyncConnection.connect(
            self.database_url, **{"prepare_threshold": self.prepare_threshold, **kwargs})

    def connect_checked(self, url: str, retry_for: float = 0.0) -> psycopg.Connection:
        """An autocommit connection to ``url``; ``ConfigurationError`` (password redacted)
        when the server cannot be reached or refuses it.

        ``retry_for`` seconds: transient refusals (connection refused, 57P03 while the
        server starts) are retried with backoff that long. Only to replace a connection
        found dead (the server was there a moment ago): a first connection to a wrong
        host fails at once.
        """
        deadline = time.monotonic() + retry_for
        delay = 0.05
        while True:
            try:
                return psycopg.connect(url, **self.connection_kwargs)
            except psycopg.Error as exc:
                if not is_transient(exc) or time.monotonic() + delay > deadline:
                    raise self.connect_error(exc) from None
            time.sleep(delay)
            delay = min(delay * 2, 1.0)

    async def connect_async_retrying(self, url: str) -> psycopg.AsyncConnection:
        """Async ``connect_checked(url, RECONNECT_WINDOW)``."""
        deadline = time.monotonic() + RECONNECT_WINDOW
        delay = 0.05
        while True:
            try:
                return await psycopg.AsyncConnection.connect(url, **self.connection_kwargs)
            except psycopg.Error as exc:
                if not is_transient(exc) or time.monotonic() + delay > deadline:
                    raise self.connect_error(exc) from None
            await asyncio.sleep(delay)
            delay = min(delay * 2, 1.0)

    def connect_error(self, exc: psycopg.Error) -> AkadzeError:
        """What a refused connection raises (password redacted): ``DatabaseUnavailable``
        when waiting may fix it (down, starting, full), else ``ConfigurationError`` (a wrong
        URL or password, no such database or role)."""
        if is_too_many_connections(exc):
            return DatabaseUnavailable(self.redact(
                "cannot connect to Postgres: the server has no free connections for this "
                "role (max_connections, or the role's connection limit, is reached): "
                f"{' '.join(str(exc).split())}"))
        message = self.redact(f"cannot connect to Postgres: {exc}")
        if is_transient(exc):
            return DatabaseUnavailable(message)
        return ConfigurationError(message)

    # --- waiting on a LISTEN connection of its own -----------------------------------------

    def listening(self, wait: Callable[[psycopg.Connection, float | None], T],
                  timeout: float | None) -> T:
        """``wait(connection, seconds left)`` on a LISTEN connection of its own, on a new
        one when it is lost, within ``timeout`` overall."""
        deadline = None if timeout is None else time.monotonic() + timeout
        # It LISTENs, so on AKADZE_LISTEN_URL when one is set (a transaction pooler keeps no
        # LISTEN: through one, only its 5 s re-check would see the job finish).
        url = listen_url(self.database_url)
        connection = psycopg.connect(url, **self.connection_kwargs)
        while True:
            with connection:
                try:
                    return wait(connection, _left(deadline))
                except psycopg.OperationalError:
                    if not connection.closed:
                        raise
            # Lost (a restart, failover, terminated backend): waiting only reads, so it
            # goes on, on a new connection, for what is left of the timeout.
            connection = self.connect_checked(url, RECONNECT_WINDOW)

    async def listening_async(
        self, wait: Callable[[psycopg.AsyncConnection, float | None], Awaitable[T]],
        timeout: float | None,
    ) -> T:
        """Async twin of ``listening``."""
        deadline = None if timeout is None else time.monotonic() + timeout
        url = listen_url(self.database_url)  # as listening: it LISTENs
        connection = await psycopg.AsyncConnection.connect(url, **self.connection_kwargs)
        while True:
            async with connection:
                try:
                    return await wait(connection, _left(deadline))
                except psycopg.OperationalError:
                    if not connection.closed:
                        raise
            connection = await self.connect_async_retrying(url)

    # --- the sync pool and the single-call connection -------------------------------------

    def pool(self) -> psycopg_pool.ConnectionPool:
        """The shared sync pool of autocommit connections (for enqueue from sync code)."""
        with self._lock:
            pool = self._pool
        if pool is None:
            # Connect once directly: a wrong URL fails now with the server's own message,
            # not after a pool timeout.
            url = self.database_url
            self.connect_checked(url).close()
            with self._lock:
                if self._pool is None:
                    self._pool = psycopg_pool.ConnectionPool(
                        url, min_size=1, max_size=self.pool_size, timeout=10,
                        kwargs=dict(self.connection_kwargs), name="akadze", open=True,
                    )
                    close_when_collected(self, self._pool)
                pool = self._pool
        return pool

    def live_pooled(self, pool: psycopg_pool.ConnectionPool) -> psycopg.Connection:
        """A connection of ``pool`` not ``found_dead`` (the caller puts it back).

        Dead ones are closed and handed back, and the pool opens replacements, until a
        live one comes or the pool's timeout passes (``PoolTimeout``; nothing was sent).
        Checked here rather than by the pool's ``check=`` callback: after a failed check
        the pool sleeps with backoff (1 s, 2 s, 4 s...) before trying its next connection,
        so a pool whose connections a restart all killed would stall seconds, or time out.
        """
        deadline = time.monotonic() + pool.timeout
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise psycopg_pool.PoolTimeout(
                    f"no live connection in pool {pool.name!r} within {pool.timeout:g}s")
            connection = pool.getconn(left)
            if not found_dead(connection):
                if self.prepare_threshold is None and connection.prepare_threshold is not None:
                    connection.prepare_threshold = None  # opened before stop_preparing
                return connection
            connection.close()
            pool.putconn(connection)  # closed: discarded, and a new one is opened

    def run_single(self, call: Callable[[psycopg.Connection], T], unsure: str = UNSURE) -> T:
        """Run ``call(connection)``, one autocommit statement (a single enqueue), on this
        app's single-call connection, or on a pooled one while another thread uses it.

        The pool's getconn and putconn cost about thirty Python calls, as much client CPU as
        the rest of an enqueue; a connection of its own, taken without waiting, costs one
        lock. It is not the pool's, so no pool user ever waits for it: one connection more
        than ``pool_size`` while it is open. It is dropped when a call leaves it broken or in
        a transaction, replaced after ``SINGLE_LIFETIME`` seconds, closed by ``close()``.

        Before each call the connection is checked without a round trip (``found_dead``):
        one a server restart, failover or ``pg_terminate_backend`` killed while it was
        idle is replaced (waiting up to ``RECONNECT_WINDOW`` seconds for the server to take
        connections again) and the call runs on the new one; nothing had been sent, so
        nothing runs twice. A connection that breaks after the statement was sent raises
        ``ConnectionLost`` (``unsure`` says what is left unknown) and is not retried; the
        next call's new connection waits up to ``RECONNECT_WINDOW`` seconds too.
        """
        lock = self._single_lock
        if not lock.acquire(blocking=False):
            # getconn/putconn rather than pool.connection(): that context manager's generator,
            # timing and commit() on an autocommit connection cost more, and putconn alone
            # brings a connection back to idle or discards it.
            pool = self.pool()
            pooled = self.live_pooled(pool)
            try:
                return sent(self, call, pooled, unsure)
            finally:
                pool.putconn(pooled)
        try:
            single = self._single
            retry_for = 0.0
            if single is not None and found_dead(single[0], single[2]):
                # Killed while idle: nothing was sent on it, so a new one may run the call.
                self._single = None
                single[0].close()
                single, retry_for = None, RECONNECT_WINDOW
            if single is None:
                if self._single_broke:
                    # Lost mid-call (ConnectionLost) in a restart or failover that may still
                    # be under way: no writable server for a few seconds is expected.
                    self._single_broke, retry_for = False, RECONNECT_WINDOW
                opened = self.connect_checked(self.database_url, retry_for)
                single = self._single = (opened, time.monotonic(), watch(opened))
            connection = single[0]
            try:
                return sent(self, call, connection, unsure)
            finally:
                if connection.pgconn.transaction_status != _IDLE \
                        or time.monotonic() - single[1] > SINGLE_LIFETIME:
                    # Broken, interrupted mid-statement, or old: the next call opens another.
                    self._single = None
                    self._single_broke = connection.closed
                    connection.close()
        finally:
            lock.release()

    def run_pooled(self, call: Callable[[psycopg.Connection], Any], unsure: str = UNSURE) -> Any:
        """Run ``call(connection)`` on a pooled autocommit connection (the sync twin of
        ``run_pooled_async``).

        Like ``run_single``: a connection found dead before the call is replaced first; one
        that breaks after the statement was sent raises ``ConnectionLost``.
        """
        pool = self.pool()
        connection = self.live_pooled(pool)
        try:
            return sent(self, call, connection, unsure)
        finally:
            pool.putconn(connection)

    # --- an async pool per event loop -----------------------------------------------------

    async def live_pooled_async(
        self, pool: psycopg_pool.AsyncConnectionPool, timeout: float | None = None,
        on_dead: Callable[[], None] | None = None,
    ) -> psycopg.AsyncConnection:
        """Async twin of ``live_pooled``; ``timeout`` overrides the pool's, ``on_dead`` is
        called for each dead connection replaced."""
        limit = pool.timeout if timeout is None else timeout
        deadline = time.monotonic() + limit
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise psycopg_pool.PoolTimeout(
                    f"no live connection in pool {pool.name!r} within {limit:g}s")
            connection = await pool.getconn(left)
            if self.usable(connection):
                return connection
            if on_dead is not None:
                on_dead()
            await connection.close()
            await pool.putconn(connection)

    def usable(self, connection: psycopg.AsyncConnection) -> bool:
        """Whether ``connection``, idle (just taken from a pool, or held by its user between
        two calls), may be sent the next call: not found dead (``found_dead``). One opened
        before ``stop_preparing`` stops preparing here."""
        if found_dead(connection):
            return False
        if self.prepare_threshold is None and connection.prepare_threshold is not None:
            connection.prepare_threshold = None
        return True

    def async_pool(self) -> psycopg_pool.AsyncConnectionPool:
        """The async pool of autocommit connections for the running event loop."""
        loop = asyncio.get_running_loop()
        pool = self._async_pools.get(loop)
        if pool is None:
            pool = psycopg_pool.AsyncConnectionPool(
                self.database_url, min_size=1, max_size=self.pool_size, timeout=10,
                kwargs=dict(self.connection_kwargs), name="akadze-async", open=False,
            )
            self._async_pools[loop] = pool
            self._own_async_pools.add(pool)
        return pool

    async def use_async_pool(self, pool: psycopg_pool.AsyncConnectionPool) -> None:
        """Make ``pool`` this loop's pool (the worker shares its pool with the tasks it runs).

        A pool this app opened for the loop before is closed: nothing else holds it. Another
        worker's pool is left alone (two workers of one app may share a loop).
        """
        loop = asyncio.get_running_loop()
        previous = self._async_pools.get(loop)
        self._async_pools[loop] = pool
        if previous is None or previous is pool or previous not in self._own_async_pools:
            return
        if self._async_users.get(previous):
            # A call holds it: typically the loop's first enqueue, made just before a worker
            # started, still waiting for the pool to open. Closed now, that call waited for
            # an opening that never completed ("PoolTimeout: pool initialization incomplete
            # after 10 sec"). It is closed when the last such call is done.
            self._retired_async_pools.add(previous)
        elif not previous.closed:
            await previous.close()

    def forget_async_pool(self, pool: psycopg_pool.AsyncConnectionPool) -> None:
        """Stop using ``pool`` for this loop (its owner is closing it)."""
        loop = asyncio.get_running_loop()
        if self._async_pools.get(loop) is pool:
            del self._async_pools[loop]

    async def opened_async_pool(self) -> psycopg_pool.AsyncConnectionPool:
        """This loop's async pool, opened (a connection error is one ``ConfigurationError``)."""
        return await self._open_async_pool(self.async_pool())

    async def _open_async_pool(self, pool: psycopg_pool.AsyncConnectionPool
                               ) -> psycopg_pool.AsyncConnectionPool:
        """``pool`` (this loop's), opened if it is not yet."""
        if pool.closed:
            try:
                await pool.open(wait=True, timeout=10)
            except psycopg_pool.PoolTimeout:
                # psycopg closed the pool for good ("cannot be reused"): the loop's next
                # call makes a new one instead of raising PoolClosed forever.
                loop = asyncio.get_running_loop()
                if self._async_pools.get(loop) is pool:
                    del self._async_pools[loop]
                # The background connection attempts never surfaced their error: ask directly.
                try:
                    await (await psycopg.AsyncConnection.connect(
                        self.database_url, connect_timeout=10)).close()
                except psycopg.Error as exc:
                    raise self.connect_error(exc) from None
                raise
        return pool

    async def run_pooled_async(self, call: Callable[[psycopg.AsyncConnection], Any],
                               unsure: str = UNSURE) -> Any:
        """Run ``await call(connection)`` on a pooled autocommit connection of this loop.

        A pooled connection found dead before the call (a server restart, failover or
        terminated backend) is replaced first, unseen by the caller. One that breaks
        after the statement was sent raises ``ConnectionLost`` (``unsure`` says what is
        left unknown): it is not retried.
        """
        pool = self.async_pool()
        try:
            return await self._run_on_async_pool(pool, call, unsure)
        except psycopg_pool.PoolClosed:
            # Closed before a connection was given, so nothing was sent: a worker of this
            # loop stopped and closed the pool it had handed in (forgotten first, so the
            # loop's pool is another now). Anything else is a real PoolClosed.
            if self._async_pools.get(asyncio.get_running_loop()) is pool:
                raise
            return await self._run_on_async_pool(self.async_pool(), call, unsure)

    async def _run_on_async_pool(self, pool: psycopg_pool.AsyncConnectionPool,
                                 call: Callable[[psycopg.AsyncConnection], Any],
                                 unsure: str) -> Any:
        """``run_pooled_async`` on ``pool``, counted as one of its users from before the first
        await, so ``use_async_pool`` never closes it under this call."""
        users = self._async_users
        users[pool] = users.get(pool, 0) + 1
        try:
            await self._open_async_pool(pool)
            connection = await self.live_pooled_async(pool)
            try:
                return await sent_async(self, call, connection, unsure)
            finally:
                await pool.putconn(connection)
        finally:
            users[pool] -= 1
            if not users[pool]:
                del users[pool]
                if pool in self._retired_async_pools:
                    self._retired_async_pools.discard(pool)
                    await pool.close()

    # --- closing ------------------------------------------------------------------------

    def close(self) -> None:
        """Close the sync pool and ``run_single``'s connection (async pools close with
        ``close_async`` on their loop)."""
        with self._single_lock:
            single, self._single = self._single, None
        if single is not None:
            single[0].close()
        with self._lock:
            pool, self._pool = self._pool, None
        if pool is not None:
            pool.close()

    async def close_async(self) -> None:
        """Close this loop's async pool and the sync pool."""
        pool = self._async_pools.pop(asyncio.get_running_loop(), None)
        if pool is not None and not pool.closed:
            await pool.close()
        self.close()


def close_when_collected(owner: object, pool: psycopg_pool.ConnectionPool) -> None:
    """Close ``pool`` when ``owner`` is garbage-collected, or at exit, unless it was closed.

    An app dropped without ``close()`` would leave the pool to psycopg_pool's ``__del__``,
    which joins the pool's worker threads: when the collection happens on one of those
    threads (the collector runs wherever allocation triggers it) that join raises "cannot
    join current thread", and at interpreter exit it may find its modules gone. Closed here
    instead, from a thread that is not one of the pool's own; never in a forked child,
    where the pool's connections are the parent's sessions (see ``_after_fork``).
    """
    weakref.finalize(owner, _close_pool, pool, os.getpid())


def _close_pool(pool: psycopg_pool.ConnectionPool, pid: int) -> None:
    if pool.closed or os.getpid() != pid:
        return
    if threading.current_thread() is threading.main_thread():
        pool.close()
    else:  # maybe one of the pool's workers, which cannot join itself
        threading.Thread(target=pool.close, name=f"{pool.name}-close", daemon=True).start()


__all__ = ["RECONNECT_WINDOW", "TCP_SETTINGS", "Connections", "close_when_collected"]
