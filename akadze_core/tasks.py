"""Tasks and the ways to enqueue them: now, later, in the caller's transaction, in bulk."""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta, timezone
from typing import TYPE_CHECKING, Any

import psycopg

from . import database
from .database import JobRequest
from .retry import BackoffPolicy
from .serialization import encode_args

if TYPE_CHECKING:
    from .app import App
    from .schedules import Schedule
    from .triggers import Trigger


@dataclass(frozen=True)
class EnqueueOptions:
    """Per-call overrides of a task's defaults (see ``Task.configure``)."""

    delay: float | None = None
    at: datetime | None = None
    queue: str | None = None
    priority: int | None = None
    expires_at: datetime | None = None
    max_attempts: int | None = None
    unique_key: str | None = None
    meta: Mapping[str, Any] = field(default_factory=dict)
    session: Any = None


def _aware(moment: datetime | None) -> datetime | None:
    """A naive datetime is taken as UTC, not as the database session's time zone."""
    if moment is not None and moment.tzinfo is None:
        return moment.replace(tzinfo=timezone.utc)
    return moment


class TaskCall:
    """A task with enqueue options applied; made by ``Task.configure`` and ``Task.using``."""

    def __init__(self, task: Task, options: EnqueueOptions) -> None:
        self.task = task
        self.options = options

    def configure(
        self,
        *,
        delay: timedelta | float | None = None,
        at: datetime | None = None,
        queue: str | None = None,
        priority: int | None = None,
        expires_at: datetime | None = None,
        max_attempts: int | None = None,
        unique_key: str | None = None,
        meta: Mapping[str, Any] | None = None,
    ) -> TaskCall:
        """Override when (``delay`` or ``at``), where and how the next enqueue runs.

        ``unique_key``: while a job with this key is queued or running, enqueue returns its
        id instead of inserting a duplicate.
        """
        if delay is not None and at is not None:
            raise ValueError("give either delay or at, not both")
        if max_attempts is not None and max_attempts < 1:
            raise ValueError("max_attempts must be at least 1 (it includes the first run)")
        seconds = delay.total_seconds() if isinstance(delay, timedelta) else delay
        given: dict[str, Any] = {
            "queue": queue, "priority": priority, "expires_at": expires_at,
            "max_attempts": max_attempts, "unique_key": unique_key, "meta": meta,
        }
        changes = {key: value for key, value in given.items() if value is not None}
        if delay is not None or at is not None:
            # One replaces the other, so a later configure(at=...) beats an earlier delay.
            changes.update(delay=seconds, at=at)
        return TaskCall(self.task, replace(self.options, **changes))

    def using(self, *, session: psycopg.Connection | psycopg.AsyncConnection) -> TaskCall:
        """Enqueue on ``session`` (a psycopg connection), inside its current transaction.

        The job commits or rolls back with the caller's transaction. With a sync connection
        ``enqueue`` returns the id; with an async one it returns an awaitable of the id.
        """
        return TaskCall(self.task, replace(self.options, session=session))

    def request(self, kwargs: Mapping[str, Any]) -> JobRequest:
        """Validate ``kwargs`` and build the row to insert (raises ``InvalidArgs``)."""
        app, task, options = self.task.app, self.task, self.options
        args = encode_args(dict(kwargs), app.json_dumps, app.max_args_bytes)
        meta = encode_args(dict(options.meta), app.json_dumps, app.max_args_bytes)
        return JobRequest(
            task=task.name,
            queue=options.queue or task.queue,
            args=args,
            priority=task.priority if options.priority is None else options.priority,
            scheduled_at=_aware(options.at),
            delay=options.delay or 0.0,
            max_attempts=options.max_attempts or task.max_attempts,
            expires_at=_aware(options.expires_at),
            unique_key=options.unique_key,
            meta=meta,
        )

    def requests(self, kwargs_list: Iterable[Mapping[str, Any]]) -> tuple[JobRequest, list[str]]:
        """The bulk form of ``request``: one row template (the options, resolved and encoded
        once) and each job's validated args (the bulk path's hot loop)."""
        template = self.request({})
        dumps, limit = self.task.app.json_dumps, self.task.app.max_args_bytes
        return template, [encode_args(dict(kwargs), dumps, limit) for kwargs in kwargs_list]

    def enqueue(self, **kwargs: Any) -> Any:
        """Insert a job; returns its id (an awaitable of it when using an async session)."""
        request = self.request(kwargs)
        session = self.options.session
        if isinstance(session, psycopg.AsyncConnection):
            return database.insert_job_async(session, request)
        if session is not None:
            return database.insert_job(session, request)
        return self.task.app.run_sync(lambda connection: database.insert_job(connection, request))

    async def enqueue_async(self, **kwargs: Any) -> int:
        """Async insert of one job; returns its id."""
        request = self.request(kwargs)
        session = self.options.session
        if session is not None:
            if not isinstance(session, psycopg.AsyncConnection):
                raise TypeError("enqueue_async needs an async session; use enqueue()")
            return await database.insert_job_async(session, request)
        return int(await self.task.app.run_async(
            lambda connection: database.insert_job_async(connection, request)))

    def enqueue_many(self, kwargs_list: Iterable[Mapping[str, Any]]) -> Any:
        """Insert many jobs in one round trip; returns their ids in order.

        Every job is validated first: one bad argument set inserts nothing.
        """
        template, args = self.requests(kwargs_list)
        session = self.options.session
        if isinstance(session, psycopg.AsyncConnection):
            return database.insert_jobs_async(session, template, args)
        if session is not None:
            return database.insert_jobs(session, template, args)
        return self.task.app.run_sync(
            lambda connection: database.insert_jobs(connection, template, args))

    async def enqueue_many_async(self, kwargs_list: Iterable[Mapping[str, Any]]) -> list[int]:
        """Async twin of ``enqueue_many``."""
        template, args = self.requests(kwargs_list)
        session = self.options.session
        if session is not None:
            if not isinstance(session, psycopg.AsyncConnection):
                raise TypeError("enqueue_many_async needs an async session; use enqueue_many()")
            return await database.insert_jobs_async(session, template, args)
        return list(await self.task.app.run_async(
            lambda connection: database.insert_jobs_async(connection, template, args)))


class Task(TaskCall):
    """A registered function plus its defaults. Calling it runs the function directly."""

    def __init__(
        self,
        app: App,
        name: str,
        func: Callable[..., Any],
        *,
        queue: str,
        max_attempts: int = 3,
        timeout: float | None = None,
        backoff: BackoffPolicy | None = None,
        priority: int = 0,
    ) -> None:
        super().__init__(self, EnqueueOptions())
        self.app = app
        self.name = name
        self.func = func
        self.queue = queue
        self.max_attempts = max_attempts
        self.timeout = timeout
        self.backoff = backoff
        self.priority = priority
        self.is_async = inspect.iscoroutinefunction(func)
        self.__doc__ = func.__doc__
        self.__wrapped__ = func

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.func(*args, **kwargs)

    def schedule(
        self,
        name: str | None = None,
        *,
        trigger: Trigger | str,
        args: Mapping[str, Any] | None = None,
        queue: str | None = None,
        priority: int | None = None,
        max_attempts: int | None = None,
        expires: timedelta | float | None = None,
        meta: Mapping[str, Any] | None = None,
    ) -> Schedule:
        """Run this task at every tick of ``trigger``: ``App.add_schedule`` with the task's
        name as the schedule's name unless ``name`` is given."""
        return self.app.add_schedule(
            name or self.name, self, trigger=trigger, args=args, queue=queue,
            priority=priority, max_attempts=max_attempts, expires=expires, meta=meta)

    def __repr__(self) -> str:
        return f"<Task {self.name!r} queue={self.queue!r}>"
