"""Sending tasks: ``apply_async``/``send_task`` become akadze_core jobs.

A Celery call becomes one job of the same task name, with args ``{"args": [...],
"kwargs": {...}}`` and the Celery-only data (headers, ids of the parent and root task, eta,
expires, limits) in ``meta["celery"]``. The task id is the job id, unless the caller chose
one (``task_id=``): that one is kept in ``meta["task_id"]``.

Transactional enqueue: ``apply_async(connection=psycopg_conn)``, or any call inside
``with akadze_compat.transaction(conn):``, inserts the job in that connection's transaction.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import logging
import os
import socket
import warnings
from collections.abc import Iterator, Mapping
from datetime import datetime, timedelta, timezone
from typing import TYPE_CHECKING, Any

import psycopg
from kombu.exceptions import EncodeError

from akadze_core import InvalidArgs
from akadze_core import Task as CoreTask

from . import serialization, signals
from .exceptions import AlwaysEagerIgnored, ImproperlyConfigured
from .utils import uuid

if TYPE_CHECKING:
    from .app import Celery
    from .result import AsyncResult
    from .task import Task

__all__ = ["apply_async", "apply_on_commit", "current_session", "max_attempts_for",
           "message_meta", "send_task", "transaction"]

logger = logging.getLogger("akadze_compat.publish")

#: Core attempts for "retry forever" (max_retries=None): the largest int4.
FOREVER = 2**31 - 1

_session: contextvars.ContextVar[psycopg.Connection | None] = contextvars.ContextVar(
    "akadze_compat_session", default=None)


@contextlib.contextmanager
def transaction(connection: psycopg.Connection) -> Iterator[psycopg.Connection]:
    """Enqueue in ``connection``'s transaction: ``with transaction(conn): task.delay(...)``.

    The block runs in ``connection.transaction()`` (a savepoint when a transaction is
    already open), so the jobs commit or roll back with the writes made in it.
    """
    if not isinstance(connection, psycopg.Connection):
        raise TypeError("transaction() needs a sync psycopg connection "
                        f"(got {type(connection).__name__})")
    token = _session.set(connection)
    try:
        with connection.transaction():
            yield connection
    finally:
        _session.reset(token)


def current_session(connection: Any = None) -> psycopg.Connection | None:
    """The psycopg connection to enqueue on: ``connection`` if it is one, else the one of
    the enclosing ``transaction()`` block, else None (autocommit)."""
    if isinstance(connection, psycopg.AsyncConnection):
        raise TypeError("apply_async(connection=...) needs a sync psycopg connection: "
                        "apply_async cannot await an async one")
    if isinstance(connection, psycopg.Connection):
        return connection
    # Anything else (a kombu Connection from Celery code) has no meaning here.
    return _session.get()


def max_attempts_for(task: Task | None) -> int:
    """Core attempts for a task: Celery's ``max_retries + 1`` (forever for None).

    A task this process does not know (``send_task`` by name) gets forever: the worker's
    copy of the task decides with its own ``max_retries``.
    """
    if task is None or task.max_retries is None:
        return FOREVER
    return min(FOREVER, int(task.max_retries) + 1)


def apply_async(task: Task, args: Any = None, kwargs: Any = None, *, task_id: str | None = None,
                link: Any = None, link_error: Any = None, shadow: str | None = None,
                **options: Any) -> AsyncResult:
    """``Task.apply_async``: check the call, then run it eagerly or enqueue it."""
    hard = task.option("time_limit", "task_time_limit")
    soft = task.option("soft_time_limit", "task_soft_time_limit")
    if soft and hard and soft > hard:
        raise ValueError("soft_time_limit must be less than or equal to time_limit")
    typing = task.typing if task.typing is not None else task.app.strict_typing
    if typing:
        task.check_arguments(args, kwargs)
    options = {**task._get_exec_options(), **options}
    options.setdefault("ignore_result", task.ignore_result)
    app = task.app
    if app.conf.task_always_eager:
        check_serializers(app, options.get("serializer"))
        # Like Celery: the arguments make the JSON round trip even when eager.
        args, kwargs = serialization.loads(serialization.dumps([args or (), kwargs or {}]))
        return task.apply(args, kwargs, task_id=task_id or uuid(), link=link,
                          link_error=link_error, **options)
    return app.send_task(str(task.name), args, kwargs, task_id=task_id, link=link,
                         link_error=link_error, shadow=shadow or task.shadow_name(
                             args, kwargs, options), task_type=task, **options)


def apply_on_commit(task: Task, args: Any, kwargs: Any, options: dict[str, Any]) \
        -> AsyncResult:
    """``delay_on_commit``/``apply_async_on_commit``: enqueue with Django's transaction.

    When Django's connection is the queue's database, the job is inserted inside the open
    transaction; otherwise it is sent on commit under a task id chosen now.
    """
    try:
        from django.db import connection as django_connection
        from django.db import transaction as django_transaction
    except ImportError as exc:
        raise ImproperlyConfigured("delay_on_commit needs Django; use "
                                   "akadze_compat.transaction(conn) otherwise") from exc
    if not django_connection.in_atomic_block:
        return task.apply_async(args, kwargs, **options)
    raw = django_connection.connection
    if isinstance(raw, psycopg.Connection) and same_database(raw, task.app.core.database_url):
        return task.apply_async(args, kwargs, connection=raw, **options)
    task_id = options.pop("task_id", None) or uuid()
    django_transaction.on_commit(
        functools.partial(task.apply_async, args, kwargs, task_id=task_id, **options))
    return task.AsyncResult(task_id)


def same_database(connection: psycopg.Connection, url: str) -> bool:
    """Whether ``connection`` is connected to the database ``url`` names."""
    wanted = psycopg.conninfo.conninfo_to_dict(url)
    info = connection.info
    return (str(wanted.get("dbname") or wanted.get("user") or "") == info.dbname
            and str(wanted.get("port") or 5432) == str(info.port)
            and str(wanted.get("host") or info.host) == info.host)


def check_serializers(app: Celery, serializer: str | None = None) -> None:
    """Refuse any serializer but JSON (settings and the call's ``serializer=``)."""
    serialization.check_serializer(serializer, "serializer")
    serialization.check_serializer(app.conf.task_serializer, "task_serializer")
    serialization.check_accept_content(app.conf.accept_content)


def to_datetime(value: datetime | str, app: Celery) -> datetime:
    """An aware datetime from a datetime or ISO string (naive means the app's timezone)."""
    moment = datetime.fromisoformat(value) if isinstance(value, str) else value
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=app.timezone)
    return moment


def _expires_at(expires: Any, app: Celery) -> datetime | None:
    if expires is None:
        return None
    if isinstance(expires, (int, float)):
        return datetime.now(timezone.utc) + timedelta(seconds=max(0.0, float(expires)))
    if isinstance(expires, timedelta):
        return datetime.now(timezone.utc) + expires
    return to_datetime(expires, app)


def _json_or_none(value: Any, what: str) -> Any:
    try:
        serialization.dumps(value)
    except (TypeError, ValueError):
        logger.warning("%s is not JSON and is not stored with the job: %r", what, value)
        return None
    return value


def send_task(app: Celery, name: str, args: Any = None, kwargs: Any = None, *,
              countdown: float | None = None, eta: datetime | str | None = None,
              task_id: str | None = None, connection: Any = None, expires: Any = None,
              link: Any = None, link_error: Any = None, time_limit: float | None = None,
              soft_time_limit: float | None = None, root_id: str | None = None,
              parent_id: str | None = None, route_name: str | None = None,
              shadow: str | None = None, task_type: Task | None = None,
              headers: Mapping[str, Any] | None = None, **options: Any) -> AsyncResult:
    """``Celery.send_task``: enqueue the task called ``name`` and return its AsyncResult."""
    from .execution import current_worker_request
    from .result import AsyncResult

    if app.conf.task_always_eager:
        warnings.warn(AlwaysEagerIgnored("task_always_eager has no effect on send_task"),
                      stacklevel=3)
    check_serializers(app, options.pop("serializer", None))
    if task_type is None:
        task_type = app._tasks.get(name)
        if task_type is not None:
            defaults = {key: value for key, value in task_type._get_exec_options().items()
                        if value is not None}
            options = {**defaults, **options}
    time_limit = options.pop("time_limit", None) if time_limit is None else time_limit
    soft_time_limit = (options.pop("soft_time_limit", None) if soft_time_limit is None
                       else soft_time_limit)
    expires = options.pop("expires", None) if expires is None else expires
    ignore_result = options.pop("ignore_result", None)
    args = [] if args is None else args
    kwargs = {} if kwargs is None else kwargs
    if not isinstance(args, (list, tuple)):
        raise TypeError("task args must be a list or tuple")
    if not isinstance(kwargs, Mapping):
        raise TypeError("task keyword arguments must be a mapping")
    routed = app.router().route(
        {key: value for key, value in options.items() if key in ROUTE_KEYS},
        route_name or name, args, kwargs, task_type)
    parent = current_worker_request()
    if parent is not None:
        root_id = root_id or parent.root_id or parent.id
        parent_id = parent_id or parent.id
        if app.conf.task_inherit_parent_priority and routed.get("priority") is None:
            routed["priority"] = (parent.delivery_info or {}).get("priority")
    at = to_datetime(eta, app) if eta is not None and not countdown else None
    eta_text = (at.isoformat() if at else (datetime.now(timezone.utc) + timedelta(
        seconds=float(countdown))).isoformat() if countdown else None)
    expires_at = _expires_at(expires, app)
    message_headers = {
        "lang": "py", "task": name, "id": task_id, "shadow": shadow, "eta": eta_text,
        "expires": expires_at.isoformat() if expires_at else None, "group": None,
        "group_index": None, "retries": 0, "timelimit": [time_limit, soft_time_limit],
        "root_id": root_id, "parent_id": parent_id, "argsrepr": repr(args)[:1024],
        "kwargsrepr": repr(kwargs)[:1024], "origin": f"gen{os.getpid()}@{socket.gethostname()}",
        "ignore_result": ignore_result, "replaced_task_nesting": 0, "stamped_headers": None,
        "stamps": {}, **(headers or {}),
    }
    body = (list(args), dict(kwargs), {"callbacks": link, "errbacks": link_error,
                                       "chain": None, "chord": None})
    signals.before_task_publish.send(
        sender=name, body=body, exchange="", routing_key=routed["queue"], declare=[],
        headers=message_headers, properties={"correlation_id": task_id, "reply_to": ""},
        retry_policy=None)
    meta: dict[str, Any] = {"celery": message_meta(
        routed, headers=message_headers, root_id=root_id, parent_id=parent_id, eta=eta_text,
        expires=expires_at.isoformat() if expires_at else None, ignore_result=ignore_result,
        time_limit=time_limit, soft_time_limit=soft_time_limit, shadow=shadow, link=link,
        link_error=link_error)}
    if task_id is not None:
        meta["task_id"] = str(task_id)
    core = app.core
    core_task = core.tasks.get(name) or CoreTask(core, name, _not_here, queue=routed["queue"])
    priority = routed.get("priority")
    call = core_task.configure(
        queue=routed["queue"], priority=None if priority is None else int(priority),
        delay=float(countdown) if countdown else None, at=at, expires_at=expires_at,
        max_attempts=max_attempts_for(task_type), meta=meta)
    session = current_session(connection)
    if session is not None:
        call = call.using(session=session)
    try:
        job_id = int(call.enqueue(args=list(args), kwargs=dict(kwargs)))
    except InvalidArgs as exc:
        raise EncodeError(str(exc)) from exc
    result_id = str(task_id) if task_id is not None else str(job_id)
    message_headers["id"] = result_id
    signals.after_task_publish.send(sender=name, body=body, headers=message_headers,
                                    exchange="", routing_key=routed["queue"])
    result = AsyncResult(result_id, app=app, task_name=name, job_id=job_id)
    if ignore_result is None and task_type is not None:
        ignore_result = task_type.option("ignore_result", "task_ignore_result")
    result.ignored = bool(ignore_result)
    return result


def message_meta(routed: Mapping[str, Any], *, headers: Mapping[str, Any] | None,
                 root_id: str | None = None, parent_id: str | None = None,
                 eta: str | None = None, expires: str | None = None,
                 ignore_result: bool | None = None, time_limit: float | None = None,
                 soft_time_limit: float | None = None, shadow: str | None = None,
                 link: Any = None, link_error: Any = None) -> dict[str, Any]:
    """The job's ``meta["celery"]``: what ``entry.build_request`` rebuilds ``self.request``
    from. ``routed`` is the router's answer; of ``headers`` only the custom ones are kept
    (Celery's own are rebuilt from the job). Shared by ``send_task`` and periodic tasks, so
    both kinds of job run the same way."""
    custom = {key: value for key, value in (headers or {}).items()
              if key not in STANDARD_HEADERS}
    return {
        "headers": _json_or_none(custom, "headers") or {}, "root_id": root_id,
        "parent_id": parent_id, "eta": eta, "expires": expires,
        "ignore_result": ignore_result, "time_limit": time_limit,
        "soft_time_limit": soft_time_limit, "shadow": shadow,
        "link": _json_or_none(_listed(link), "link"),
        "link_error": _json_or_none(_listed(link_error), "link_error"),
        "routing_key": routed.get("routing_key"), "exchange": _name(routed.get("exchange")),
        "priority": routed.get("priority"),
    }


def _listed(value: Any) -> Any:
    # Celery keeps callbacks as a list (request.callbacks), one signature or several.
    if value is None or isinstance(value, list):
        return value
    if isinstance(value, tuple):
        return list(value)
    return [value]


def _name(value: Any) -> Any:
    return value if value is None or isinstance(value, str) else getattr(value, "name", None)


def _not_here(**kwargs: Any) -> None:
    raise RuntimeError("this task is only enqueued from here, never run")


#: Options the router sees (and may override).
ROUTE_KEYS = frozenset({"queue", "routing_key", "exchange", "priority", "exchange_type"})
#: Celery's own message headers; the others are the caller's custom headers.
STANDARD_HEADERS = frozenset({
    "lang", "task", "id", "shadow", "eta", "expires", "group", "group_index", "retries",
    "timelimit", "root_id", "parent_id", "argsrepr", "kwargsrepr", "origin", "ignore_result",
    "replaced_task_nesting", "stamped_headers", "stamps",
})
