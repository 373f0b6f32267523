"""``AkadzeBackend``: a backend of Django's task framework (``django.tasks``, Django 6.0+)
whose tasks are akadze jobs, run by ``akadze worker``.

Each Django task is registered as an akadze task named by its ``module_path``, whose body
calls the Django function with the job's ``{"args": [...], "kwargs": {...}}``. A task is
registered when it is defined (Django's ``Task`` asks its backend to validate it as it is
made), so a worker knows the tasks of the modules it imported (``akadze_core.contrib.
django.app`` imports every installed app's ``tasks`` module) and never imports a module a
row names.

What it adds to Django's own backends: retries with backoff (``@task(max_attempts=...,
backoff=...)``), enqueue on the commit of Django's transaction or inside it, results kept
in the jobs table, read back from any process.
"""

from __future__ import annotations

import inspect
import sys
import threading
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import datetime
from functools import partial
from typing import Any

import psycopg
from asgiref.sync import sync_to_async
from django.core import checks
from django.core.exceptions import ImproperlyConfigured
from django.db import close_old_connections, connections, transaction
from django.tasks.backends.base import BaseTaskBackend
from django.tasks.base import (
    Task,
    TaskContext,
    TaskError,
    TaskResult,
    TaskResultStatus,
)
from django.tasks.exceptions import InvalidTask, TaskResultDoesNotExist
from django.tasks.signals import task_enqueued, task_finished, task_started
from django.utils import timezone
from django.utils.json import normalize_json
from psycopg.conninfo import make_conninfo

from ...app import App
from ...enqueue.tasks import Task as CoreTask
from ...enqueue.tasks import TaskCall
from ...execution.context import JobContext, current
from ...model.jobs import Job
from ...model.retry import BackoffPolicy

#: The ways ``enqueue`` sends a job (``OPTIONS["ENQUEUE"]``): after the commit of the
#: Django transaction it is called in (``transaction.on_commit``; at once outside one), in
#: that transaction on Django's own connection, or at once on the queue's own connection.
ON_COMMIT, IN_TRANSACTION, NOW = "on_commit", "in_transaction", "now"
ENQUEUE_MODES = (ON_COMMIT, IN_TRANSACTION, NOW)

#: The job's ``meta`` key naming the Django backend alias that enqueued it: ``get_result``
#: answers only for its own jobs, not for any akadze job with the same id.
META_BACKEND = "django_backend"
#: The ``meta`` key of the workers that ran the job (Django's ``TaskResult.worker_ids``).
META_WORKERS = "django_worker_ids"
#: The ``meta`` key of the job's ``run_after``, as ISO 8601 (read back into ``result.task``).
META_RUN_AFTER = "django_run_after"

#: libpq parameters of Django's ``DATABASES[...]["OPTIONS"]`` passed on to the queue's own
#: connections (Django's other options are its own: ``isolation_level``, ``pool``...).
LIBPQ_OPTIONS = frozenset({
    "sslmode", "sslrootcert", "sslcert", "sslkey", "sslpassword", "application_name",
    "connect_timeout", "options", "target_session_attrs", "service", "passfile",
    "keepalives", "keepalives_idle", "keepalives_interval", "keepalives_count",
})

_STATUS = {
    "waiting": TaskResultStatus.READY,
    "queued": TaskResultStatus.READY,
    "running": TaskResultStatus.RUNNING,
    "succeeded": TaskResultStatus.SUCCESSFUL,
    "failed": TaskResultStatus.FAILED,
    "cancelled": TaskResultStatus.FAILED,
}


@dataclass(frozen=True, slots=True, kw_only=True)
class AkadzeTask(Task):
    """Django's ``Task`` with akadze's retries: ``@task(max_attempts=5, backoff=...)``.

    ``max_attempts`` counts the first run (None: the backend's ``OPTIONS["MAX_ATTEMPTS"]``,
    1 unless set); ``backoff`` maps the attempt number that failed (1 for the first run)
    to the ``timedelta`` before the next (None: the backend's ``OPTIONS["BACKOFF"]``, else
    akadze's curve: 2^(n-1) s capped at 300 s, with jitter)."""

    max_attempts: int | None = None
    backoff: BackoffPolicy | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class StoredTaskError(TaskError):
    """Django's ``TaskError`` read from a job's row: its ``exception_class`` is looked up
    among the modules this process has loaded, never imported (a stored path is the row's
    word, and importing a module runs its code)."""

    @property
    def exception_class(self) -> type[BaseException]:
        """The exception class the path names, if its module is loaded here; ValueError
        otherwise, as Django's raises for a path that names no exception class."""
        module, _, name = self.exception_class_path.rpartition(".")
        found = getattr(sys.modules.get(module), name, None) if module else None
        if not (isinstance(found, type) and issubclass(found, BaseException)):
            raise ValueError(f"{self.exception_class_path!r} is not an exception class of a "
                             "module loaded in this process (a stored error's module is never "
                             "imported)")
        return found


def database_conninfo(settings: Mapping[str, Any]) -> str:
    """The libpq connection string of a Django ``DATABASES`` entry (its ``settings_dict``:
    the test runner's ``test_<NAME>`` once it made the test database)."""
    params: dict[str, Any] = {"dbname": settings.get("NAME") or None}
    for key, name in (("HOST", "host"), ("PORT", "port"), ("USER", "user"),
                      ("PASSWORD", "password")):
        value = settings.get(key)
        if value not in (None, ""):
            params[name] = str(value)
    for key, value in (settings.get("OPTIONS") or {}).items():
        if key in LIBPQ_OPTIONS and isinstance(value, str | int):
            params[key] = str(value)
    return make_conninfo(**{key: value for key, value in params.items() if value is not None})


class _Shared:
    """What every backend of one ``TASKS`` entry shares: Django makes a backend per thread
    (its connection handler is thread-local), but one registry of tasks and one akadze App
    (one pool) serve them all."""

    def __init__(self) -> None:
        self.tasks: dict[str, Task] = {}
        self.app: App | None = None
        self.lock = threading.Lock()


# By alias and the entry's settings (``override_settings(TASKS=...)`` makes new backends).
_SHARED: dict[tuple[str, str], _Shared] = {}
_SHARED_LOCK = threading.Lock()


class AkadzeBackend(BaseTaskBackend):
    """``TASKS = {"default": {"BACKEND": "akadze_core.contrib.django.AkadzeBackend"}}``.

    ``OPTIONS``: ``DATABASE`` (the Django database alias the queue lives in, "default"),
    ``DATABASE_URL`` (another Postgres instead; not with ``ENQUEUE="in_transaction"``),
    ``ENQUEUE`` (``"on_commit"``, ``"in_transaction"`` or ``"now"``), ``MAX_ATTEMPTS`` (1),
    ``BACKOFF`` (a callable, attempt -> timedelta), ``MODULES`` (modules the worker imports
    besides every installed app's ``tasks``). ``QUEUES`` is Django's: the queue names a
    task may use (every name when empty).
    """

    task_class = AkadzeTask
    supports_defer = True
    supports_async_task = True
    supports_get_result = True
    supports_priority = True

    def __init__(self, alias: str, params: Mapping[str, Any]) -> None:
        super().__init__(alias, params)
        options = self.options
        known = {"DATABASE", "DATABASE_URL", "ENQUEUE", "MAX_ATTEMPTS", "BACKOFF", "MODULES"}
        unknown = sorted(set(options) - known)
        if unknown:
            raise ImproperlyConfigured(f"TASKS[{alias!r}]['OPTIONS'] has unknown keys "
                                       f"{unknown}; known: {sorted(known)}")
        self.database: str = options.get("DATABASE", "default")
        self.database_url: str | None = options.get("DATABASE_URL")
        self.enqueue_mode: str = options.get("ENQUEUE", ON_COMMIT)
        if self.enqueue_mode not in ENQUEUE_MODES:
            raise ImproperlyConfigured(f"TASKS[{alias!r}]['OPTIONS']['ENQUEUE'] is one of "
                                       f"{ENQUEUE_MODES}, not {self.enqueue_mode!r}")
        if self.enqueue_mode == IN_TRANSACTION and self.database_url:
            raise ImproperlyConfigured(
                f"TASKS[{alias!r}]: ENQUEUE='in_transaction' inserts jobs on Django's "
                "connection, so the queue is Django's database: drop DATABASE_URL")
        self.max_attempts: int = options.get("MAX_ATTEMPTS", 1)
        if type(self.max_attempts) is not int or self.max_attempts < 1:
            raise ImproperlyConfigured(f"TASKS[{alias!r}]['OPTIONS']['MAX_ATTEMPTS'] is an "
                                       f"int of at least 1, not {self.max_attempts!r}")
        self.backoff: BackoffPolicy | None = options.get("BACKOFF")
        self.modules: list[str] = list(options.get("MODULES", ()))
        with _SHARED_LOCK:
            self._shared = _SHARED.setdefault((alias, repr(params)), _Shared())
        #: The Django tasks defined so far, by ``module_path`` (the akadze task's name),
        #: shared by this entry's backends of every thread.
        self.tasks: dict[str, Task] = self._shared.tasks

    # --- the akadze app ------------------------------------------------------------------

    @property
    def app(self) -> App:
        """The akadze ``App`` of this backend, made on first use from Django's database
        settings as they are then (a test database's name included), with every Django
        task defined so far registered."""
        shared = self._shared
        app = shared.app
        if app is None:
            with shared.lock:
                app = shared.app
                if app is None:
                    app = App(self.queue_database(), default_queue=self._default_queue())
                    for task in self.tasks.values():
                        self._register(app, task)
                    shared.app = app
        return app

    def queue_database(self) -> str:
        """Where this backend's jobs live: its ``DATABASE_URL``, else the conninfo of its
        Django database (backends with the same one share the jobs table)."""
        return self.database_url or database_conninfo(connections[self.database].settings_dict)

    def add_tasks_to(self, app: App) -> None:
        """Register this backend's tasks in ``app`` (another backend's on the same
        database), each run with this backend's settings: a worker claims the jobs of a
        queue whatever backend enqueued them, so it must know every task they name."""
        for task in list(self.tasks.values()):
            self._register(app, task)

    def _default_queue(self) -> str:
        queues = sorted(self.queues)
        return "default" if not queues or "default" in queues else queues[0]

    def validate_task(self, task: Task) -> None:
        """Django's checks, then akadze's (``max_attempts``), then the task is registered:
        Django calls this for every task it defines, and before every enqueue."""
        super().validate_task(task)
        attempts = getattr(task, "max_attempts", None)
        if attempts is not None and (type(attempts) is not int or attempts < 1):
            raise InvalidTask("max_attempts must be an int of at least 1 (it counts the "
                              "first run).")
        backoff = getattr(task, "backoff", None)
        if backoff is not None and not callable(backoff):
            raise InvalidTask("backoff must be a callable: attempt number -> timedelta.")
        if task.module_path not in self.tasks:
            shared = self._shared
            with shared.lock:  # not while the app is made from the tasks defined so far
                if task.module_path not in self.tasks:
                    self.tasks[task.module_path] = task
                    if shared.app is not None:
                        self._register(shared.app, task)

    def _register(self, app: App, task: Task) -> CoreTask:
        name = task.module_path
        found = app.tasks.get(name)
        if found is not None:
            return found
        attempts = getattr(task, "max_attempts", None) or self.max_attempts
        backoff = getattr(task, "backoff", None) or self.backoff
        return app.task(name, max_attempts=attempts, backoff=backoff)(
            _body(self, task.func, task.takes_context))

    def _core_task(self, task: Task) -> CoreTask:
        self.validate_task(task)
        return self._register(self.app, self.tasks[task.module_path])

    # --- enqueue -------------------------------------------------------------------------

    def _call(self, task: Task) -> TaskCall:
        """The akadze call of ``task`` with its queue, priority and run_after."""
        meta: dict[str, Any] = {META_BACKEND: self.alias}
        at = None
        if task.run_after is not None:
            at = task.run_after
            if timezone.is_naive(at):  # USE_TZ = False: Django's local time
                at = timezone.make_aware(at)
            meta[META_RUN_AFTER] = at.isoformat()
        # Django: larger runs first, -100..100; akadze: smaller runs first.
        return self._core_task(task).configure(
            queue=task.queue_name, priority=-int(task.priority), at=at, meta=meta)

    def enqueue(self, task: Task, args: Any, kwargs: Any) -> TaskResult:
        """Queue ``task(*args, **kwargs)`` as ``OPTIONS["ENQUEUE"]`` says; the arguments are
        checked (JSON) now, whenever the job is sent."""
        call = self._call(task)
        job_args = {"args": list(args), "kwargs": dict(kwargs)}
        call.encode_args(job_args)  # InvalidArgs now, not at the commit
        result = TaskResult(
            task=task, id=str(uuid.uuid4()), status=TaskResultStatus.READY,
            enqueued_at=None, started_at=None, last_attempted_at=None, finished_at=None,
            args=job_args["args"], kwargs=job_args["kwargs"], backend=self.alias,
            errors=[], worker_ids=[])
        if self.enqueue_mode == IN_TRANSACTION:
            connection = connections[self.database]
            connection.ensure_connection()
            session = connection.connection
            if not isinstance(session, psycopg.Connection):
                raise ImproperlyConfigured(
                    "ENQUEUE='in_transaction' needs Django on psycopg 3 (its connection is "
                    f"a {type(session).__module__}.{type(session).__name__})")
            call.using(session=session).enqueue_with_task_id(result.id, **job_args)
            transaction.on_commit(partial(self._sent, result), using=self.database)
        elif self.enqueue_mode == ON_COMMIT:
            transaction.on_commit(partial(self._send, call, result, job_args),
                                  using=self.database)
        else:
            self._send(call, result, job_args)
        return result

    def _send(self, call: TaskCall, result: TaskResult, job_args: dict[str, Any]) -> None:
        call.enqueue_with_task_id(result.id, **job_args)
        self._sent(result)

    def _sent(self, result: TaskResult) -> None:
        task_enqueued.send(type(self), task_result=result)

    # --- results -------------------------------------------------------------------------

    def get_result(self, result_id: str) -> TaskResult:
        """The result of the job enqueued with this id, from the jobs table; raises
        ``TaskResultDoesNotExist`` for an unknown id (or a rolled-back enqueue)."""
        return self._result(result_id, self.app.find_job(str(result_id)))

    async def aget_result(self, result_id: str) -> TaskResult:
        """Async twin of ``get_result``."""
        app = await sync_to_async(lambda: self.app, thread_sensitive=True)()
        return self._result(result_id, await app.find_job_async(str(result_id)))

    def _result(self, result_id: str, job: Job | None) -> TaskResult:
        if job is None or not isinstance(job.meta, dict) \
                or job.meta.get(META_BACKEND) != self.alias:
            raise TaskResultDoesNotExist(result_id)
        task = self.tasks.get(job.task)
        if task is None:
            # Its module was not imported here; a row never makes us import one.
            raise TaskResultDoesNotExist(
                f"{result_id}: its task {job.task!r} is not defined in this process "
                "(import its module, or ask the task: my_task.get_result(id))")
        return result_of(self, task, job)

    def check(self, **kwargs: Any) -> list[checks.CheckMessage]:
        """Django's system check: the queue's database must be Postgres."""
        if self.database_url is None and connections[self.database].vendor != "postgresql":
            return [checks.Error(
                f"TASKS[{self.alias!r}] puts the queue in database {self.database!r}, which "
                "is not PostgreSQL", hint="set OPTIONS['DATABASE'] or OPTIONS['DATABASE_URL']",
                id="akadze.E001")]
        return []


def _run_after(job: Job) -> datetime | None:
    text = job.meta.get(META_RUN_AFTER) if isinstance(job.meta, dict) else None
    if not isinstance(text, str):
        return None
    try:
        return datetime.fromisoformat(text)
    except ValueError:
        return None


def result_of(backend: AkadzeBackend, task: Task, job: Job,
              status: TaskResultStatus | None = None,
              workers: list[str] | None = None) -> TaskResult:
    """A Django ``TaskResult`` read from ``job`` (its values checked, never trusted)."""
    args = job.args if isinstance(job.args, dict) else {}
    positional = args.get("args")
    keywords = args.get("kwargs")
    meta = job.meta if isinstance(job.meta, dict) else {}
    if workers is None:
        known = meta.get(META_WORKERS)
        workers = [str(w) for w in known] if isinstance(known, list) else []
    errors = []
    for entry in job.errors or []:
        if not isinstance(entry, dict):
            continue
        module, name = entry.get("module"), entry.get("type")
        path = f"{module}.{name}" if module and name else str(name or "Exception")
        errors.append(StoredTaskError(exception_class_path=path,
                                traceback=str(entry.get("traceback") or entry.get("message")
                                              or "")))
    priority = -job.priority if -100 <= -job.priority <= 100 else task.priority
    shown = task.using(priority=priority, queue_name=job.queue, run_after=_run_after(job)) \
        if (priority, job.queue) != (task.priority, task.queue_name) or META_RUN_AFTER in meta \
        else task
    result = TaskResult(
        task=shown, id=str(meta.get("task_id", job.id)),
        status=status or _STATUS.get(job.state, TaskResultStatus.READY),
        enqueued_at=job.created_at, started_at=job.started_at,
        last_attempted_at=job.started_at, finished_at=job.finished_at,
        args=positional if isinstance(positional, list) else [],
        kwargs=keywords if isinstance(keywords, dict) else {},
        backend=backend.alias, errors=errors, worker_ids=workers)
    if job.state == "succeeded":
        object.__setattr__(result, "_return_value", job.result)
    return result


def _started(backend: AkadzeBackend) -> tuple[JobContext, TaskResult]:
    """The running job and its Django result (RUNNING, this worker added to its workers,
    which are stored in the job's meta for ``get_result``), with ``task_started`` sent."""
    context = current()
    job = context.job
    known = job.meta.get(META_WORKERS) if isinstance(job.meta, dict) else None
    workers = [str(w) for w in known] if isinstance(known, list) else []
    workers.append(str(context.worker_id or ""))
    task = backend.tasks[job.task]
    result = result_of(backend, task, job, TaskResultStatus.RUNNING, workers)
    return context, result


def _finished(backend: AkadzeBackend, context: JobContext, result: TaskResult,
              value: Any = None, exc: BaseException | None = None) -> None:
    """``task_finished`` for a run that ends the job: a success, or a failure with no
    attempt left (a run that will be retried is not finished)."""
    if exc is None:
        object.__setattr__(result, "status", TaskResultStatus.SUCCESSFUL)
        object.__setattr__(result, "_return_value", value)
    elif context.attempt >= context.max_attempts:
        object.__setattr__(result, "status", TaskResultStatus.FAILED)
    else:
        return
    task_finished.send(type(backend), task_result=result)


def _body(backend: AkadzeBackend, func: Callable[..., Any],
          takes_context: bool) -> Callable[..., Any]:
    """The akadze task body of a Django task: its arguments from the job's ``args`` and
    ``kwargs``, its context first when it takes one, its return value as Django stores it
    (``normalize_json``). Django's database connections are closed when unusable or
    obsolete before and after a sync run, as Django does around a request."""
    if inspect.iscoroutinefunction(func):
        async def run_async(args: list[Any], kwargs: dict[str, Any]) -> Any:
            context, result = _started(backend)
            await context.update_meta({META_WORKERS: result.worker_ids})
            task_started.send(type(backend), task_result=result)
            call_args = [TaskContext(task_result=result), *args] if takes_context else args
            try:
                value = normalize_json(await func(*call_args, **kwargs))
            except Exception as exc:
                _finished(backend, context, result, exc=exc)
                raise
            _finished(backend, context, result, value)
            return value

        run_async.__name__ = func.__name__
        return run_async

    def run(args: list[Any], kwargs: dict[str, Any]) -> Any:
        context, result = _started(backend)
        context.update_meta_sync({META_WORKERS: result.worker_ids})
        task_started.send(type(backend), task_result=result)
        call_args = [TaskContext(task_result=result), *args] if takes_context else args
        close_old_connections()
        try:
            value = normalize_json(func(*call_args, **kwargs))
        except Exception as exc:
            _finished(backend, context, result, exc=exc)
            raise
        finally:
            close_old_connections()
        _finished(backend, context, result, value)
        return value

    run.__name__ = func.__name__
    return run


__all__ = ["ENQUEUE_MODES", "IN_TRANSACTION", "NOW", "ON_COMMIT", "AkadzeBackend", "AkadzeTask",
           "StoredTaskError", "database_conninfo", "result_of"]
