"""The App: the task registry, the database it talks to, and its connection pools."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import select
import threading
import time
import weakref
from collections.abc import Callable, Iterable, Mapping
from datetime import timedelta
from typing import Any, TypeVar, overload

import psycopg
import psycopg_pool

from . import lookup
from .dberrors import PREPARED_STATEMENT_LOST, is_too_many_connections, is_transient
from .dsn import configured_url, listen_url, password_of, redact_password
from .dsn import prepare_threshold as resolve_prepare_threshold
from .embedded import embedded_url
from .errors import AkadzeError, ConfigurationError, ConnectionLost, DatabaseUnavailable
from .jobs import Job
from .migrations import MIGRATE_COMMAND, migrate
from .retry import BackoffPolicy
from .runtime_schedules import RuntimeSchedules
from .schedules import Schedule, ScheduleSource
from .serialization import (
    DEFAULT_MAX_ARGS_BYTES,
    DEFAULT_MAX_RESULT_BYTES,
    MAX_RESULT_BYTES_CEILING,
    Dumps,
    Loads,
    strict_dumps,
)
from .task_ids import TaskIds
from .tasks import Task
from .triggers import Trigger
from .workflow import Workflow

logger = logging.getLogger("akadze.app")

F = TypeVar("F", bound=Callable[..., Any])
T = TypeVar("T")

#: Seconds ``App.run_single``'s connection is used before it is replaced by a new one (the
#: pool's own ``max_lifetime`` default): a long-lived client moves with a rebalanced pooler
#: and gives back the server memory a backend accumulates.
SINGLE_LIFETIME = 3600.0
#: Seconds a connection found dead is replaced for before giving up: after a restart or a
#: failover the server may refuse connections (connection refused, 57P03 cannot_connect_now)
#: for a while, and the call waits that out instead of failing.
RECONNECT_WINDOW = 15.0
_IDLE = psycopg.pq.TransactionStatus.IDLE
_OK = psycopg.pq.ConnStatus.OK

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

#: What a lost connection leaves unknown, for ``ConnectionLost``'s message.
UNSURE = "the statement may or may not have taken effect"


if hasattr(select, "poll"):
    def _readable(fd: int) -> bool:
        poller = select.poll()  # poll, not select: no FD_SETSIZE limit on the descriptor
        poller.register(fd, select.POLLIN)
        return bool(poller.poll(0))  # POLLHUP and POLLERR count too
else:  # Windows
    def _readable(fd: int) -> bool:
        return bool(select.select([fd], [], [], 0)[0])


def found_dead(connection: psycopg.Connection | psycopg.AsyncConnection) -> bool:
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
    """
    pgconn = connection.pgconn
    if pgconn.status != _OK:
        return True
    try:
        return _readable(pgconn.socket)
    except (psycopg.OperationalError, OSError, ValueError):
        return True


def _lost(app: App, exc: psycopg.Error, unsure: str) -> ConnectionLost:
    """The ``ConnectionLost`` for a connection that broke after its statement was sent."""
    cause = " ".join(str(exc).split()) or "the connection was closed"
    return ConnectionLost(app.redact(
        f"the connection to Postgres broke after the statement was sent, so {unsure}; "
        "akadze does not send it again, since that could do it twice "
        f"({type(exc).__name__}: {cause})"))


def _sent(app: App, call: Callable[[psycopg.Connection], T], connection: psycopg.Connection,
          unsure: str) -> T:
    """``call(connection)``; an error that left the connection closed happened after the
    statement was sent, so it becomes ``ConnectionLost`` (``unsure``: what is unknown)."""
    try:
        return call(connection)
    except ConnectionLost:
        raise
    except psycopg.Error as exc:
        if connection.closed:
            raise _lost(app, exc, unsure) from exc
        if not app.lost_a_prepared_statement(exc, connection):
            raise
    # The statement never ran (Parse or Bind failed): run it again, now unprepared.
    return call(connection)


async def _sent_async(app: App, call: Callable[[psycopg.AsyncConnection], Any],
                      connection: psycopg.AsyncConnection, unsure: str) -> Any:
    """Async twin of ``_sent``."""
    try:
        return await call(connection)
    except ConnectionLost:
        raise
    except psycopg.Error as exc:
        if connection.closed:
            raise _lost(app, exc, unsure) from exc
        if not app.lost_a_prepared_statement(exc, connection):
            raise
    return await call(connection)


def _after_fork() -> None:
    """In a forked child, every App lets go of its parent's connections unclosed.

    They are the parent's sockets: a statement sent on one would interleave two processes'
    messages on one session, and closing one (psycopg sends Terminate) would end the
    parent's session. Dropped, they are not closed: psycopg finishes a connection on garbage
    collection only in the process that opened it. The locks are new too, since one held
    by another thread at the fork would stay held in the child. Each app opens connections
    of its own on first use (gunicorn ``--preload``, multiprocessing's fork start method).
    """
    for app in list(_APPS):
        app._no_connections()


# Every App, so that _after_fork can find them (weak: an App may be dropped).
_APPS: weakref.WeakSet[App] = weakref.WeakSet()
if hasattr(os, "register_at_fork"):  # POSIX; elsewhere there is no fork
    os.register_at_fork(after_in_child=_after_fork)


def _seconds(value: timedelta | float | int | None) -> float | None:
    if value is None:
        return None
    return value.total_seconds() if isinstance(value, timedelta) else float(value)


def _left(timeout: float | None, deadline: float | None) -> float | None:
    """What is left of ``timeout`` at ``deadline`` (None: no timeout)."""
    return None if deadline is None else max(0.0, deadline - time.monotonic())


#: Sets ``App.max_result_bytes`` when ``App(max_result_bytes=...)`` does not.
MAX_RESULT_BYTES_VAR = "AKADZE_MAX_RESULT_BYTES"


def resolve_max_result_bytes(value: int | None) -> int:
    """``value``, else ``$AKADZE_MAX_RESULT_BYTES``, else ``DEFAULT_MAX_RESULT_BYTES``;
    ValueError unless between 1 and ``MAX_RESULT_BYTES_CEILING`` (Postgres refuses a jsonb
    value of 256 MiB)."""
    if value is None:
        text = os.environ.get(MAX_RESULT_BYTES_VAR, "").strip()
        try:
            value = int(text) if text else DEFAULT_MAX_RESULT_BYTES
        except ValueError:
            raise ValueError(f"{MAX_RESULT_BYTES_VAR}={text!r} is not a number of bytes") \
                from None
    if type(value) is not int or not 0 < value <= MAX_RESULT_BYTES_CEILING:
        raise ValueError(f"max_result_bytes must be an int from 1 to "
                         f"{MAX_RESULT_BYTES_CEILING} (Postgres refuses a jsonb value of "
                         f"256 MiB), not {value!r}")
    return value


class App:
    """Tasks and the database that queues them.

    ``App(url)`` uses that Postgres; ``App()`` reads ``AKADZE_DATABASE_URL`` and, when that is
    not set either, starts the embedded Postgres of the project and applies the schema. It
    lives in ``$AKADZE_HOME``, else in ``.akadze/`` of the project root (the nearest directory
    upwards with ``pyproject.toml``, ``setup.py``, ``setup.cfg``, ``.git`` or ``.akadze/``),
    else in ``$XDG_DATA_HOME/akadze`` (``~/.local/share/akadze``); see ``akadze_core.embedded``.
    """

    def __init__(
        self,
        database_url: str | None = None,
        *,
        default_queue: str = "default",
        max_args_bytes: int = DEFAULT_MAX_ARGS_BYTES,
        max_result_bytes: int | None = None,
        succeeded_retention: timedelta | float = timedelta(days=1),
        failed_retention: timedelta | float = timedelta(days=7),
        json_dumps: Dumps = strict_dumps,
        json_loads: Loads = json.loads,
        pool_size: int = 10,
        prepare_threshold: int | str | None = None,
    ) -> None:
        self._explicit_url = database_url
        self._url: str | None = None
        self.default_queue = default_queue
        self.max_args_bytes = max_args_bytes
        #: A task's result as JSON may be this many bytes; a larger one fails its job at once
        #: with ``ResultTooLarge`` (no more attempts): ``max_result_bytes=`` if given, else
        #: ``$AKADZE_MAX_RESULT_BYTES`` (the Celery facade's way to set it), else 16 MiB.
        self.max_result_bytes = resolve_max_result_bytes(max_result_bytes)
        self.succeeded_retention = _seconds(succeeded_retention) or 0.0
        self.failed_retention = _seconds(failed_retention) or 0.0
        self.json_dumps = json_dumps
        self.json_loads = json_loads
        self.pool_size = pool_size
        #: psycopg's ``prepare_threshold`` for every connection this app (and a worker of it)
        #: opens: ``prepare_threshold=`` if given, else ``$AKADZE_PREPARE_THRESHOLD``, else 5;
        #: ``"off"`` (None) behind PgBouncer in transaction mode (see ``dsn.prepare_threshold``).
        self.prepare_threshold = resolve_prepare_threshold(prepare_threshold)
        #: The keywords every connection of this app is opened with (``TCP_SETTINGS`` too).
        self.connection_kwargs: dict[str, Any] = {
            "autocommit": True, "prepare_threshold": self.prepare_threshold, **TCP_SETTINGS}
        self.tasks: dict[str, Task] = {}
        self._redact_url: str | None = None
        self._redact_password: str | None = None
        #: Declared schedules by name; every worker of this app enqueues their due runs.
        self.schedules: dict[str, Schedule] = {}
        #: Where more schedules come from, asked on every scheduling pass (``ScheduleSource``).
        self.schedule_sources: list[ScheduleSource] = []
        #: The command that applies the schema, named by ``SchemaMissing`` when an enqueue or
        #: a lookup finds no schema (the Celery facade names its own).
        self.migrate_command = MIGRATE_COMMAND
        self._no_connections()
        _APPS.add(self)

    def _no_connections(self) -> None:
        """Start with no connection: at creation, and in a forked child (``_after_fork``)."""
        self._lock = threading.Lock()
        self._task_ids: TaskIds | None = None
        self._pool: psycopg_pool.ConnectionPool | None = None
        # run_single's own connection (with when it was opened) and the lock that says who
        # is using it: a caller finding it in use takes a pooled connection instead.
        self._single: tuple[psycopg.Connection, float] | None = None
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

    # --- tasks -------------------------------------------------------------------------------

    @overload
    def task(self, name: F, /) -> Task: ...

    @overload
    def task(
        self,
        name: str | None = None,
        /,
        *,
        queue: str | None = None,
        max_attempts: int = 3,
        timeout: timedelta | float | None = None,
        backoff: BackoffPolicy | None = None,
        priority: int = 0,
    ) -> Callable[[F], Task]: ...

    def task(
        self,
        name: Any = None,
        /,
        *,
        queue: str | None = None,
        max_attempts: int = 3,
        timeout: timedelta | float | None = None,
        backoff: BackoffPolicy | None = None,
        priority: int = 0,
    ) -> Any:
        """Register a task: ``@app.task("name", queue=..., max_attempts=3, ...)``.

        Works on ``async def`` and plain ``def`` functions (plain ones run in a thread pool).
        Without a name the task is called ``module.function``.
        """
        if max_attempts < 1:
            raise ValueError("max_attempts must be at least 1 (it includes the first run)")

        def register(func: F) -> Task:
            task_name = name or f"{func.__module__}.{func.__qualname__}"
            task = Task(self, task_name, func, queue=queue or self.default_queue,
                        max_attempts=max_attempts, timeout=_seconds(timeout), backoff=backoff,
                        priority=priority)
            self.tasks[task_name] = task
            return task

        if callable(name):
            func, name = name, None
            return register(func)
        return register

    # --- schedules -----------------------------------------------------------------------------

    def add_schedule(
        self,
        name: str,
        task: Task | str,
        *,
        trigger: Trigger | str,
        args: Mapping[str, Any] | None = None,
        queue: str | None = None,
        priority: int | None = None,
        max_attempts: int | None = None,
        expires: timedelta | float | None = None,
        meta: Mapping[str, Any] | None = None,
        task_ids: bool = False,
    ) -> Schedule:
        """Run ``task`` (a Task or a task name) with ``args`` at every tick of ``trigger``.

        ``trigger``: ``Cron("0 3 * * *", timezone="Europe/Berlin")``, ``Every(timedelta(...))``,
        a cron string (UTC), or any object with ``spec``, ``latest()`` and ``next()``. The
        workers of this app enqueue each tick once; a tick that passed before the schedule
        existed does not run, and after downtime only the latest missed tick runs. Each job
        expires at its tick plus ``expires``; with ``task_ids`` each job gets its own uuid4
        ``meta["task_id"]`` (see ``find_job``). Raises ValueError on an invalid trigger or a
        duplicate name, ``InvalidArgs`` on arguments that are not JSON.
        """
        schedule = Schedule.declare(
            self, name, task, trigger=trigger, args=args, queue=queue, priority=priority,
            max_attempts=max_attempts, expires=expires, meta=meta, task_ids=task_ids)
        with self._lock:
            if name in self.schedules:
                raise ValueError(f"a schedule named {name!r} is already declared")
            self.schedules[name] = schedule
        return schedule

    @property
    def runtime_schedules(self) -> RuntimeSchedules:
        """The schedules stored in the database, made and changed while workers run:
        ``app.runtime_schedules.add(name, task, trigger=...)``, ``pause``, ``resume``,
        ``remove``, ``get``, ``list`` (each with an ``_async`` twin and ``session=``); see
        ``akadze_core.runtime_schedules``."""
        return RuntimeSchedules(self)

    def remove_schedule(self, name: str) -> bool:
        """Stop declaring schedule ``name`` (its state row stays, harmless); False if unknown."""
        with self._lock:
            return self.schedules.pop(name, None) is not None

    # --- database ------------------------------------------------------------------------------

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
        """Point the app at another database (``akadze --database-url`` overrides the URL
        the app was built with). Only before the app has opened a pool."""
        with self._lock:
            if self._pool is not None or self._single is not None or len(self._async_pools):
                raise ConfigurationError("set_database_url: the app is already connected")
            self._explicit_url = url
            self._url = None

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

    def redact(self, text: str) -> str:
        """``text`` with this app's database password scrubbed out."""
        # Before the app has connected (a pool child whose task never touched the database)
        # its URL is still the one it will use: the explicit one, else the environment's.
        url = self._url or configured_url(self._explicit_url) or ""
        if url != self._redact_url:  # parse the DSN once, not on every log line
            self._redact_url, self._redact_password = url, password_of(url)
        return redact_password(text, self._redact_password)

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

    def migrate(self) -> list[int]:
        """Apply the schema; returns the versions applied."""
        with self.connect(autocommit=True) as connection:
            return migrate(connection)

    def pool(self) -> psycopg_pool.ConnectionPool:
        """The shared sync pool of autocommit connections (for enqueue from sync code)."""
        with self._lock:
            pool = self._pool
        if pool is None:
            # Connect once directly: a wrong URL fails now with the server's own message,
            # not after a pool timeout.
            url = self.database_url
            self._connect_checked(url).close()
            with self._lock:
                if self._pool is None:
                    self._pool = psycopg_pool.ConnectionPool(
                        url, min_size=1, max_size=self.pool_size, timeout=10,
                        kwargs=dict(self.connection_kwargs), name="akadze", open=True,
                    )
                pool = self._pool
        return pool

    def _connect_checked(self, url: str, retry_for: float = 0.0) -> psycopg.Connection:
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
                    raise self._connect_error(exc) from None
            time.sleep(delay)
            delay = min(delay * 2, 1.0)

    def _connect_error(self, exc: psycopg.Error) -> AkadzeError:
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
            if not found_dead(connection):
                if self.prepare_threshold is None and connection.prepare_threshold is not None:
                    connection.prepare_threshold = None  # opened before stop_preparing
                return connection
            if on_dead is not None:
                on_dead()
            await connection.close()
            await pool.putconn(connection)

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
            # after 10 sec", issue 21). It is closed when the last such call is done.
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
                    raise self._connect_error(exc) from None
                raise
        return pool

    # --- reading jobs back -------------------------------------------------------------------

    def workflow(self) -> Workflow:
        """A new ``Workflow``: jobs inserted together, some waiting on others."""
        return Workflow(self)

    def get_job(self, job_id: int) -> Job | None:
        """The job with this id, or None."""
        return self.run_pooled(lambda connection: lookup.get_job(connection, job_id))

    async def get_job_async(self, job_id: int) -> Job | None:
        """Async twin of ``get_job``."""
        return await self.run_pooled_async(
            lambda connection: lookup.get_job_async(connection, job_id))

    def find_job(self, task_id: str) -> Job | None:
        """The job known by the external id ``task_id``: the newest whose
        ``meta["task_id"]`` it is, else the job without one whose derived id it is
        (``task_id_of``)."""
        derived = self.task_ids().job_id(task_id)
        return self.run_pooled(
            lambda connection: lookup.find_job(connection, task_id, derived))

    async def find_job_async(self, task_id: str) -> Job | None:
        """Async twin of ``find_job``."""
        derived = (await self.task_ids_async()).job_id(task_id)
        return await self.run_pooled_async(
            lambda connection: lookup.find_job_async(connection, task_id, derived))

    def task_ids(self) -> TaskIds:
        """The task ids this database derives from job ids (``akadze_core.task_ids``); its
        key is read on the first call and kept (it never changes)."""
        codec = self._task_ids
        if codec is None:
            codec = self._task_ids = TaskIds(self.run_pooled(lookup.task_id_key))
        return codec

    async def task_ids_async(self) -> TaskIds:
        """Async twin of ``task_ids``."""
        codec = self._task_ids
        if codec is None:
            codec = self._task_ids = TaskIds(await self.run_pooled_async(
                lookup.task_id_key_async))
        return codec

    def use_task_id_key(self, key: str) -> None:
        """Take the database's task id key from elsewhere instead of reading it (a worker's
        process children are handed it with each job, so they never connect for it)."""
        if self._task_ids is None or self._task_ids.key != key:
            self._task_ids = TaskIds(key)

    def task_id_of(self, job: Job) -> str:
        """The external id ``job`` is known by: its ``meta["task_id"]`` (an integration's,
        such as a Celery task id), else the uuid4-shaped id derived from its job id."""
        return self.task_ids().of(job.id, job.meta)

    def wait_for_job(self, job_id: int, timeout: float | None = None) -> Job:
        """Block until the job is succeeded, failed or cancelled (woken by NOTIFY, not by
        polling); raises TimeoutError after ``timeout`` seconds."""
        return self._listening(
            lambda connection, left: lookup.wait_for_job(connection, job_id, left), timeout)

    def get_jobs(self, job_ids: Iterable[int]) -> dict[int, Job]:
        """The jobs with these ids, by id (missing ones are absent), in one query."""
        ids = list(job_ids)
        return self.run_pooled(lambda connection: lookup.get_jobs(connection, ids))

    def wait_for_jobs(self, job_ids: Iterable[int],
                      timeout: float | None = None) -> dict[int, Job]:
        """Block until every one of the jobs is finished (one LISTEN for all, woken by
        NOTIFY); returns them by id; TimeoutError after ``timeout`` seconds."""
        ids = list(job_ids)
        return self._listening(
            lambda connection, left: lookup.wait_for_jobs(connection, ids, left), timeout)

    def _listening(self, wait: Callable[[psycopg.Connection, float | None], T],
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
                    return wait(connection, _left(timeout, deadline))
                except psycopg.OperationalError:
                    if not connection.closed:
                        raise
            # Lost (a restart, failover, terminated backend): waiting only reads, so it
            # goes on, on a new connection, for what is left of the timeout.
            connection = self._connect_checked(url, RECONNECT_WINDOW)

    async def wait_for_job_async(self, job_id: int, timeout: float | None = None) -> Job:
        """Async twin of ``wait_for_job``."""
        deadline = None if timeout is None else time.monotonic() + timeout
        url = listen_url(self.database_url)  # as wait_for_job: it LISTENs
        connection = await psycopg.AsyncConnection.connect(url, **self.connection_kwargs)
        while True:
            async with connection:
                try:
                    return await lookup.wait_for_job_async(
                        connection, job_id, _left(timeout, deadline))
                except psycopg.OperationalError:
                    if not connection.closed:
                        raise
            connection = await self._connect_async_retrying(url)

    async def _connect_async_retrying(self, url: str) -> psycopg.AsyncConnection:
        """Async ``_connect_checked(url, RECONNECT_WINDOW)``."""
        deadline = time.monotonic() + RECONNECT_WINDOW
        delay = 0.05
        while True:
            try:
                return await psycopg.AsyncConnection.connect(url, **self.connection_kwargs)
            except psycopg.Error as exc:
                if not is_transient(exc) or time.monotonic() + delay > deadline:
                    raise self._connect_error(exc) from None
            await asyncio.sleep(delay)
            delay = min(delay * 2, 1.0)

    def list_jobs(self, *, state: str | None = None, queue: str | None = None,
                  task: str | None = None, limit: int = 100) -> list[Job]:
        """The newest jobs matching the filters."""
        return self.run_pooled(lambda connection: lookup.list_jobs(
            connection, state=state, queue=queue, task=task, limit=limit))

    def list_scheduled(self, limit: int = 100) -> list[Job]:
        """Queued jobs not due yet (countdowns, retries in backoff), soonest first."""
        return self.run_pooled(lambda connection: lookup.list_scheduled(connection, limit))

    def list_workers(self, live: bool = False) -> list[dict[str, Any]]:
        """The registered workers with their last heartbeat; ``live=True`` keeps only those
        whose heartbeat is within their TTL on the database clock."""
        return self.run_pooled(lambda connection: lookup.list_workers(connection, live))

    def job_counts(self) -> dict[str, dict[str, int]]:
        """Queue -> state -> number of jobs."""
        return self.run_pooled(lookup.job_counts)

    def purge(self, queues: list[str] | None = None) -> int:
        """Delete the queued jobs of ``queues`` (every queue when None); returns how many."""
        return self.run_pooled(lambda connection: lookup.purge(connection, queues))

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

    #: ``close_async`` by its older name (kept: callers use it; see "Twin names").
    aclose = close_async

    # --- the async pool, exposed to the rest of the package ---------------------------------

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
                return await _sent_async(self, call, connection, unsure)
            finally:
                await pool.putconn(connection)
        finally:
            users[pool] -= 1
            if not users[pool]:
                del users[pool]
                if pool in self._retired_async_pools:
                    self._retired_async_pools.discard(pool)
                    await pool.close()

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
                return _sent(self, call, pooled, unsure)
            finally:
                pool.putconn(pooled)
        try:
            single = self._single
            retry_for = 0.0
            if single is not None and found_dead(single[0]):
                # Killed while idle: nothing was sent on it, so a new one may run the call.
                self._single = None
                single[0].close()
                single, retry_for = None, RECONNECT_WINDOW
            if single is None:
                if self._single_broke:
                    # Lost mid-call (ConnectionLost) in a restart or failover that may still
                    # be under way: no writable server for a few seconds is expected.
                    self._single_broke, retry_for = False, RECONNECT_WINDOW
                single = self._single = (self._connect_checked(self.database_url, retry_for),
                                         time.monotonic())
            connection = single[0]
            try:
                return _sent(self, call, connection, unsure)
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
            return _sent(self, call, connection, unsure)
        finally:
            pool.putconn(connection)

    # The older names of the two, both suffixed; kept for callers (see "Twin names").
    #: ``run_pooled`` by its older name.
    run_sync = run_pooled
    #: ``run_pooled_async`` by its older name.
    run_async = run_pooled_async


__all__ = ["RECONNECT_WINDOW", "App", "found_dead"]
