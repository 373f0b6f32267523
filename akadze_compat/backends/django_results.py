"""``result_backend='django-db'``: django_celery_results' ``TaskResult`` rows, kept by the worker.

Celery's ``django-db`` backend (django_celery_results) writes one ``TaskResult`` row per task
id when a task ends (and when it retries), which Django's admin and the project's own views
read. Here the job row stays the result store, and the same row is written for the admin: in
the outcome's own transaction (``akadze_core.integration.OutcomeWriter``), so the two never
disagree, and only when that Django app is installed, ``result_backend`` names
``django-db`` and the table is in the queue's database (a table it cannot see is skipped,
never an outcome that fails to store).

Written as django_celery_results 2.6 writes them: ``status`` the Celery state, ``result``
the JSON of the return value (or of the exception, as ``{"exc_type", "exc_message",
"exc_module"}``), ``content_type``/``content_encoding`` ``application/json``/``utf-8``,
``meta`` ``{"children": []}``, ``date_created`` at the first write and ``date_done`` at
every write; ``task_name``, ``task_args``, ``task_kwargs`` and ``traceback`` only with
``result_extended`` (the backend writes them only then). Times come from the database clock.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from psycopg import sql

from akadze_core import Job

from .. import serialization, states
from ..serialization import revive
from .base import failure_traceback, job_result, job_state

if TYPE_CHECKING:
    from akadze_core import App as CoreApp

    from ..app.base import Celery

__all__ = ["TABLE", "TaskResultWriter", "register", "wanted"]

#: django_celery_results' ``TaskResult`` table (the model sets no other name).
TABLE = "django_celery_results_taskresult"
_APP = "django_celery_results"
#: The model's CharField lengths (255 unless the project's settings raise the task id's).
_NAME_MAX = 255
#: Celery's ``argsrepr_maxsize``/``kwargsrepr_maxsize``.
_REPR_MAX = 1024
_WORKER_MAX = 100

_SELECT = sql.SQL(
    "SELECT id, task, queue, args, state, priority, scheduled_at, attempt, max_attempts, "
    "run_count, errors, result, meta, finished_at FROM akadze.jobs "
    # The table is looked for in the same statement: a database without it records nothing
    # (rather than failing the outcome's transaction).
    "WHERE id = ANY(%(ids)s) AND to_regclass({table}) IS NOT NULL").format(
        table=sql.Literal(TABLE))

_COLUMNS = ("task_id", "status", "result", "traceback", "task_name", "task_args",
            "task_kwargs", "worker")
_UPSERT = sql.SQL(
    "INSERT INTO {table} (task_id, status, content_type, content_encoding, result, "
    "traceback, meta, task_name, task_args, task_kwargs, periodic_task_name, worker, "
    "date_created, date_done) "
    "SELECT r.task_id, r.status, 'application/json', 'utf-8', r.result, r.traceback, "
    "'{{\"children\": []}}', r.task_name, r.task_args, r.task_kwargs, NULL, r.worker, now(), now() "
    "FROM unnest(%(task_id)s::text[], %(status)s::text[], %(result)s::text[], "
    "%(traceback)s::text[], %(task_name)s::text[], %(task_args)s::text[], "
    "%(task_kwargs)s::text[], %(worker)s::text[]) "
    "AS r(task_id, status, result, traceback, task_name, task_args, task_kwargs, worker) "
    "ON CONFLICT (task_id) DO UPDATE SET status = EXCLUDED.status, "
    "content_type = EXCLUDED.content_type, content_encoding = EXCLUDED.content_encoding, "
    "result = EXCLUDED.result, traceback = EXCLUDED.traceback, meta = EXCLUDED.meta, "
    "task_name = EXCLUDED.task_name, task_args = EXCLUDED.task_args, "
    "task_kwargs = EXCLUDED.task_kwargs, worker = EXCLUDED.worker, "
    "date_done = EXCLUDED.date_done").format(
        table=sql.Identifier(TABLE))


def _repr(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= _REPR_MAX else text[:_REPR_MAX - 3] + "..."


def _exception_meta(exc: BaseException) -> dict[str, Any]:
    """Celery's JSON form of an exception result (``prepare_exception``): the facade's own
    exception classes named by the module Celery's have (``celery.exceptions``)."""
    module = type(exc).__module__
    if module.startswith("akadze_compat."):
        module = "celery." + module.split(".", 1)[1]
    return {"exc_type": type(exc).__name__, "exc_message": list(exc.args),
            "exc_module": module}


class TaskResultWriter:
    """The ``OutcomeWriter`` of an app whose ``result_backend`` is ``django-db``."""

    @property
    def select(self) -> sql.Composed:
        """The jobs just written, when the table exists (``OutcomeWriter.select``)."""
        return _SELECT

    def __init__(self, core: CoreApp, extended: bool,
                 hostname: Callable[[], str] | None = None) -> None:
        self.core = core
        self.extended = extended
        #: The worker's name (``request.hostname``), read at each write: the command line
        #: names the worker after the app is made.
        self.hostname = hostname

    def row(self, job: Job) -> tuple[str | None, ...] | None:
        """The ``TaskResult`` values of ``job`` (None for a state Celery stores nothing
        for: the job has not ended nor is retrying)."""
        state = job_state(job)
        if state not in states.READY_STATES and state != states.RETRY:
            return None
        value = job_result(job, state)
        if isinstance(value, BaseException):
            value = _exception_meta(value)
        try:
            result = serialization.dumps(value)
        except (TypeError, ValueError):
            # Stored by the job already, so JSON; a value the facade's encoder refuses on the
            # way back (a tagged type it no longer knows) is kept as its text.
            result = serialization.dumps(repr(value))
        task_name = task_args = task_kwargs = traceback = worker = None
        if self.extended:
            worker = self.hostname()[:_WORKER_MAX] if self.hostname is not None else None
            task_name = job.task[:_NAME_MAX]
            call = job.args if isinstance(job.args, dict) else {}
            args, kwargs = call.get("args"), call.get("kwargs")
            # Celery's argsrepr/kwargsrepr (the call's repr, at most 1024 characters),
            # encoded as the backend encodes them (a JSON string).
            task_args = serialization.dumps(_repr(tuple(revive(args))
                                                  if isinstance(args, list) else ()))
            task_kwargs = serialization.dumps(_repr(revive(kwargs)
                                                    if isinstance(kwargs, dict) else {}))
            if state in (states.FAILURE, states.RETRY):
                traceback = failure_traceback(job)
        return (self.core.task_id_of(job), state, result, traceback, task_name, task_args,
                task_kwargs, worker)

    def statement(self, rows: list[dict[str, Any]]) -> tuple[sql.Composed, dict[str, Any]] \
            | None:
        """The upsert of the ``TaskResult`` rows of ``rows`` (jobs just written)."""
        values = [made for made in (self.row(Job.from_row(row)) for row in rows)
                  if made is not None]
        if not values:
            return None
        return _UPSERT, {name: [value[index] for value in values]
                         for index, name in enumerate(_COLUMNS)}


def wanted(app: Celery) -> bool:
    """Whether ``app`` keeps django_celery_results' rows: its ``result_backend`` is
    ``django-db`` and Django's settings install that app. Only then is Django looked at
    (its settings read, which configures them from ``DJANGO_SETTINGS_MODULE`` in a process
    that has not read them yet: a prefork child); settings that cannot be read mean no."""
    backend = app.conf.result_backend
    if not isinstance(backend, str) or backend.split("://")[0] != "django-db":
        return False
    try:
        settings = importlib.import_module("django.conf").settings
        installed = list(settings.INSTALLED_APPS)
    except Exception:  # no Django, or settings not configured (ImproperlyConfigured)
        return False
    return any(name == _APP or str(name).startswith(_APP + ".") for name in installed)


def register(app: Celery, core: CoreApp, hostname: Callable[[], str] | None = None) \
        -> TaskResultWriter | None:
    """Attach (or detach) the ``TaskResult`` writer on ``core`` as ``app``'s configuration
    says (idempotent)."""
    current = [writer for writer in core.outcome_writers
               if isinstance(writer, TaskResultWriter)]
    writer: TaskResultWriter
    if not wanted(app):
        for writer in current:
            core.outcome_writers.remove(writer)
        return None
    extended = bool(app.conf.result_extended)
    if current:
        current[0].extended = extended
        return current[0]
    writer = TaskResultWriter(core, extended, hostname)
    core.outcome_writers.append(writer)
    return writer
