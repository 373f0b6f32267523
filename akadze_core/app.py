"""The App: the task registry, its settings, and the database it talks to (through its
``Connections``, ``akadze_core.store.connections``)."""

from __future__ import annotations

import json
import os
import threading
import weakref
from collections.abc import Callable, Iterable, Mapping
from datetime import timedelta
from typing import Any, TypeVar, overload

import psycopg
import psycopg_pool

from .enqueue.tasks import Task
from .enqueue.workflow import Workflow
from .model.dsn import by_substrings
from .model.jobs import Job
from .model.limits import Rate, parse_rate
from .model.outcomes import OutcomeWriter
from .model.retry import BackoffPolicy
from .model.serialization import (
    DEFAULT_MAX_ARGS_BYTES,
    DEFAULT_MAX_RESULT_BYTES,
    MAX_RESULT_BYTES_CEILING,
    Dumps,
    Loads,
    strict_dumps,
)
from .model.task_ids import TaskIds
from .schedules.runtime import RuntimeSchedules
from .schedules.scheduler import Schedule, ScheduleSource, ScheduleSpec
from .schedules.triggers import Trigger
from .store import limits, lookup, pauses
from .store.connections import RECONNECT_WINDOW, Connections
from .store.liveness import UNSURE, found_dead
from .store.migrations import MIGRATE_COMMAND, migrate
from .store.queries import use_dialect

F = TypeVar("F", bound=Callable[..., Any])
T = TypeVar("T")


def _seconds(value: timedelta | float | int | None) -> float | None:
    if value is None:
        return None
    return value.total_seconds() if isinstance(value, timedelta) else float(value)


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


def _after_fork() -> None:
    """In a forked child every App gets a new lock: one held by another thread at the fork
    would stay held (its connections are let go of by ``akadze_core.store.connections``)."""
    for app in list(_APPS):
        app._lock = threading.Lock()


# Every App, so that _after_fork can find them (weak: an App may be dropped).
_APPS: weakref.WeakSet[App] = weakref.WeakSet()
if hasattr(os, "register_at_fork"):  # POSIX; elsewhere there is no fork
    os.register_at_fork(after_in_child=_after_fork)


class App:
    """Tasks and the database that queues them.

    ``App(url)`` uses that Postgres; ``App()`` reads ``AKADZE_DATABASE_URL`` and, when that is
    not set either, starts the embedded Postgres of the project and applies the schema. It
    lives in ``$AKADZE_HOME``, else in ``.akadze/`` of the project root (the nearest directory
    upwards with ``pyproject.toml``, ``setup.py``, ``setup.cfg``, ``.git`` or ``.akadze/``),
    else in ``$XDG_DATA_HOME/akadze`` (``~/.local/share/akadze``); see
    ``akadze_core.store.embedded``.
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
        citus: bool = False,
    ) -> None:
        #: Citus mode (docs/how-to/citus.md): the statements of the Citus dialect, for a
        #: coordinator migrated with ``akadze migrate --citus``. The dialect is chosen here,
        #: once, for the whole process (``store.queries.use_dialect``): every App of a
        #: process runs the dialect the first ``citus=True`` chose.
        self.citus = citus
        if citus:
            use_dialect("citus")
        #: The connection room: URL, pools, single-call connection (``Connections``).
        self.connections = Connections(database_url, pool_size=pool_size,
                                       prepare_threshold=prepare_threshold)
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
        self.tasks: dict[str, Task] = {}
        #: Declared schedules by name; every worker of this app enqueues their due runs.
        self.schedules: dict[str, Schedule] = {}
        #: Where more schedules come from, asked on every scheduling pass (``ScheduleSource``).
        self.schedule_sources: list[ScheduleSource] = []
        #: What records outcomes in the outcome's own transaction besides the job row
        #: (``model.outcomes.OutcomeWriter``): empty, the outcome write is one statement.
        self.outcome_writers: list[OutcomeWriter] = []
        #: The command that applies the schema, named by ``SchemaMissing`` when an enqueue or
        #: a lookup finds no schema (the Celery facade names its own).
        self.migrate_command = MIGRATE_COMMAND
        # Guards ``schedules`` (declared from any thread); a new one in a forked child.
        self._lock = threading.Lock()
        self._task_ids: TaskIds | None = None
        _APPS.add(self)

    @property
    def pool_size(self) -> int:
        """The most connections of each of this app's pools."""
        return self.connections.pool_size

    @pool_size.setter
    def pool_size(self, value: int) -> None:
        self.connections.pool_size = value

    @property
    def prepare_threshold(self) -> int | None:
        """psycopg's ``prepare_threshold`` for this app's connections (None: unprepared)."""
        return self.connections.prepare_threshold

    @property
    def connection_kwargs(self) -> dict[str, Any]:
        """The keywords every connection of this app is opened with."""
        return self.connections.connection_kwargs

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
        rate_limit: str | float | None = None,
        concurrency_key: str | None = None,
        max_concurrency: int | None = None,
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
        rate_limit: str | float | None = None,
        concurrency_key: str | None = None,
        max_concurrency: int | None = None,
    ) -> Any:
        """Register a task: ``@app.task("name", queue=..., max_attempts=3, ...)``.

        Works on ``async def`` and plain ``def`` functions (plain ones run in a thread pool).
        Without a name the task is called ``module.function``. ``rate_limit`` ("100/s",
        "10/m", "1000/h"): a global limit on its starts, across every worker;
        ``concurrency_key``/``max_concurrency``: at most that many of its jobs with the key
        run at once (docs/how-to/limits.md).
        """
        if max_attempts < 1:
            raise ValueError("max_attempts must be at least 1 (it includes the first run)")

        def register(func: F) -> Task:
            task_name = name or f"{func.__module__}.{func.__qualname__}"
            task = Task(self, task_name, func, queue=queue or self.default_queue,
                        max_attempts=max_attempts, timeout=_seconds(timeout), backoff=backoff,
                        priority=priority, rate_limit=rate_limit,
                        concurrency_key=concurrency_key, max_concurrency=max_concurrency)
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
        return self.declare_schedule(name, task, ScheduleSpec(
            trigger=trigger, args=args, queue=queue, priority=priority,
            max_attempts=max_attempts, expires=expires, meta=meta, task_ids=task_ids))

    def declare_schedule(self, name: str, task: Task | str, spec: ScheduleSpec) -> Schedule:
        """``add_schedule`` with its keywords held in a ``ScheduleSpec``."""
        schedule = Schedule.from_spec(self, name, task, spec)
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
        ``akadze_core.schedules.runtime``."""
        return RuntimeSchedules(self)

    def remove_schedule(self, name: str) -> bool:
        """Stop declaring schedule ``name`` (its state row stays, harmless); False if unknown."""
        with self._lock:
            return self.schedules.pop(name, None) is not None

    # --- rate limits ----------------------------------------------------------------------

    def set_rate_limit(self, rate: str | float | None, *, task: str | None = None,
                       queue: str | None = None) -> bool:
        """Set the global rate limit ("100/s", "10/m", "1000/h"; None, "" or 0 removes it)
        of ``task`` or of ``queue`` (one of them), for every worker from its next claim on.
        Returns whether a limit is now set (removing: whether there was one)."""
        if (task is None) == (queue is None):
            raise ValueError("give either task= or queue=")
        kind, name = ("task", task) if task is not None else ("queue", queue)
        assert name is not None
        parsed = parse_rate(rate)
        return bool(self.run_pooled(
            lambda connection: limits.set_limit(connection, kind, name, parsed)))

    def rate_limits(self) -> list[dict[str, Any]]:
        """The rate limits set: kind ("queue"/"task"), name, rate and period (seconds)."""
        return list(self.run_pooled(limits.list_limits))

    def declared_rate_limits(self) -> list[tuple[str, str, Rate]]:
        """(kind, name, rate) of each task declared with ``rate_limit`` (a worker sets them
        when it starts)."""
        return [("task", task.name, task.rate) for task in list(self.tasks.values())
                if task.rate is not None]

    # --- database (the connection room's, for callers of the app) --------------------------

    @property
    def database_url(self) -> str:
        """The Postgres URL, starting the embedded server (and migrating it) if none is set."""
        return self.connections.resolve_database_url()

    def resolve_database_url(self, *, create: bool = True) -> str:
        """The Postgres URL (``Connections.resolve_database_url``): with ``create=False`` an
        embedded database that does not exist yet is not made (``NoDatabaseError``)."""
        return self.connections.resolve_database_url(create=create)

    def set_database_url(self, url: str) -> None:
        """Point the app at another database (``akadze --database-url`` overrides the URL
        the app was built with). Only before the app has opened a pool."""
        self.connections.set_database_url(url)

    @by_substrings
    def redact(self, text: str) -> str:
        """``text`` with this app's database password scrubbed out."""
        return self.connections.redact(text)

    def connect(self, **kwargs: Any) -> psycopg.Connection:
        """A new sync connection to the database (the caller closes it), with this app's
        ``prepare_threshold`` unless ``kwargs`` says otherwise."""
        return self.connections.connect(**kwargs)

    async def connect_async(self, **kwargs: Any) -> psycopg.AsyncConnection:
        """Async twin of ``connect``."""
        return await self.connections.connect_async(**kwargs)

    def migrate(self) -> list[int]:
        """Apply the schema; returns the versions applied."""
        with self.connect(autocommit=True) as connection:
            return migrate(connection, citus=self.citus)

    def pool(self) -> psycopg_pool.ConnectionPool:
        """The shared sync pool of autocommit connections (for enqueue from sync code)."""
        return self.connections.pool()

    def run_single(self, call: Callable[[psycopg.Connection], T], unsure: str = UNSURE) -> T:
        """Run ``call(connection)``, one autocommit statement, on the app's single-call
        connection (``Connections.run_single``)."""
        return self.connections.run_single(call, unsure)

    def run_pooled(self, call: Callable[[psycopg.Connection], Any], unsure: str = UNSURE) -> Any:
        """Run ``call(connection)`` on a pooled autocommit connection; one found dead first
        is replaced, one lost after sending raises ``ConnectionLost``."""
        return self.connections.run_pooled(call, unsure)

    async def run_pooled_async(self, call: Callable[[psycopg.AsyncConnection], Any],
                               unsure: str = UNSURE) -> Any:
        """Async twin of ``run_pooled``, on a pooled connection of the running loop."""
        return await self.connections.run_pooled_async(call, unsure)

    def close(self) -> None:
        """Close the sync pool and ``run_single``'s connection (async pools close with
        ``close_async`` on their loop)."""
        self.connections.close()

    async def close_async(self) -> None:
        """Close this loop's async pool and the sync pool."""
        await self.connections.close_async()

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
        """The task ids this database derives from job ids (``akadze_core.model.task_ids``); its
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
        return self.connections.listening(
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
        return self.connections.listening(
            lambda connection, left: lookup.wait_for_jobs(connection, ids, left), timeout)

    async def wait_for_job_async(self, job_id: int, timeout: float | None = None) -> Job:
        """Async twin of ``wait_for_job``."""
        return await self.connections.listening_async(
            lambda connection, left: lookup.wait_for_job_async(connection, job_id, left),
            timeout)

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

    def pause_queue(self, queue: str, *, by: str | None = None) -> bool:
        """Pause ``queue`` for every worker, running or started later, until resumed; True
        when it was not paused already. Once this returns, no worker starts a new job of
        the queue; jobs already running finish, and enqueues still insert (the jobs wait).
        ``by``: who paused it, shown by ``list_queues`` and ``akadze queues list``."""
        return self.run_pooled(lambda connection: pauses.pause(connection, queue, by))

    def resume_queue(self, queue: str) -> bool:
        """Resume a paused ``queue``, waking its idle workers at once; True when it was
        paused."""
        return self.run_pooled(lambda connection: pauses.resume(connection, queue))

    async def pause_queue_async(self, queue: str, *, by: str | None = None) -> bool:
        """Async twin of ``pause_queue``."""
        return await self.run_pooled_async(
            lambda connection: pauses.pause_async(connection, queue, by))

    async def resume_queue_async(self, queue: str) -> bool:
        """Async twin of ``resume_queue``."""
        return await self.run_pooled_async(
            lambda connection: pauses.resume_async(connection, queue))

    def paused_queues(self) -> list[str]:
        """The names of the paused queues, in name order."""
        return [state.queue for state in self.run_pooled(pauses.paused)]

    def list_queues(self) -> list[pauses.QueueState]:
        """Every queue with queued jobs, live workers or a pause: whether it is paused (when,
        by whom), its due jobs and its live workers."""
        return self.run_pooled(pauses.list_queues)


__all__ = ["RECONNECT_WINDOW", "App", "found_dead"]
