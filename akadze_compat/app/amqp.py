"""Building what one task call sends (Celery's ``celery.app.amqp``): here, the job row.

Celery's ``amqp.as_task_v2`` builds a message's headers and body; here a call becomes a
``JobRequest`` of the same task name, with args ``{"args": [...], "kwargs": {...}}`` and the
Celery-only data (headers, parent and root ids, eta, expires, limits, callbacks) in
``meta["celery"]``, and its id in ``meta["task_id"]`` when chosen. A single ``apply_async``
inserts that row; a canvas adds one such row per task to a workflow (``app.flow``): both
build it here, so a chain step is routed, limited and retried exactly as the same task sent
alone.
"""

from __future__ import annotations

import contextlib
import contextvars
import logging
import os
import socket
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from typing import TYPE_CHECKING, Any, ClassVar, TypeVar

import psycopg
import psycopg_pool
from kombu import Exchange, Queue
from kombu.exceptions import EncodeError, OperationalError
from kombu.utils.functional import fxrange

from akadze_core import ConnectionLost, DatabaseUnavailable, InvalidArgs
from akadze_core import Task as CoreTask

from .. import _state, serialization, signals
from .routes import prepare as prepare_routes
from .routes import queue_name, settings_router

if TYPE_CHECKING:
    from akadze_core import TaskCall
    from akadze_core.integration import JobRequest

    from .base import Celery
    from .context import Context
    from .task import Task

__all__ = ["AMQP", "FOREVER", "MESSAGE_PROPERTIES", "ROUTE_KEYS", "STANDARD_HEADERS", "UNSENT",
           "Message", "PublishConnectionLost", "PublishUnavailable", "current_session",
           "enclosing_session", "max_attempts_for", "message_meta", "prepare",
           "publish_retried", "publish_retry", "to_datetime", "transaction"]

logger = logging.getLogger("akadze_compat.publish")

#: Core attempts for "retry forever" (max_retries=None): the largest int4.
FOREVER = 2**31 - 1
#: Options the router sees (and may override).
ROUTE_KEYS = frozenset({"queue", "routing_key", "exchange", "priority", "exchange_type"})
#: Celery's own message headers; the others are the caller's custom headers.
STANDARD_HEADERS = frozenset({
    "lang", "task", "id", "shadow", "eta", "expires", "group", "group_index", "retries",
    "timelimit", "root_id", "parent_id", "argsrepr", "kwargsrepr", "origin", "ignore_result",
    "replaced_task_nesting", "stamped_headers", "stamps",
})


#: The ``apply_async`` options that kombu sends as message properties (Celery's
#: ``request.properties``): kept in the job's meta so the task reads them back.
MESSAGE_PROPERTIES = frozenset({"app_id", "user_id", "type", "message_id", "cluster_id",
                                "delivery_mode", "expiration"})


class PublishConnectionLost(ConnectionLost, OperationalError):
    """``ConnectionLost`` from ``delay``/``apply_async``/``send_task``: the connection broke
    after the insert was sent, so the task may or may not have been sent (not retried).

    Also kombu's ``OperationalError``, what Celery raises when publishing to a broker it
    cannot reach, so ``except kombu.exceptions.OperationalError`` keeps catching it.
    """


class PublishUnavailable(DatabaseUnavailable, OperationalError):
    """``DatabaseUnavailable`` from ``delay``/``apply_async``/``send_task`` and canvases,
    after Celery's publish retry policy: the database could not be reached or had no free
    connection, and nothing was sent.

    Also kombu's ``OperationalError``, what Celery raises when it cannot publish to its
    broker, so ``except kombu.exceptions.OperationalError`` catches it as before.
    """


T = TypeVar("T")

#: Failures before anything was sent: retried under the publish retry policy. A pool timeout
#: is one (no connection was handed out, so no statement went).
UNSENT = (DatabaseUnavailable, psycopg_pool.PoolTimeout)


def publish_with_retry(app: Celery, send: Callable[[], T], retry: Any = None,
                       retry_policy: Mapping[str, Any] | None = None) -> T:
    """``send()``, retried as Celery retries a publish while the database is unreachable
    or full: ``retry`` (``apply_async(retry=)``, else ``task_publish_retry``) and the
    policy (``retry_policy=`` over ``task_publish_retry_policy``: ``max_retries``,
    ``interval_start``, ``interval_step``, ``interval_max``, as kombu reads them). The
    last failure raises ``PublishUnavailable``. A connection lost after the insert was
    sent is never retried (``PublishConnectionLost``, raised by the caller)."""
    try:
        return send()  # the first try costs nothing more than this try
    except UNSENT as exc:
        return publish_retried(app, send, exc, retry, retry_policy)


def publish_retried(app: Celery, send: Callable[[], T], error: Exception, retry: Any = None,
                    retry_policy: Mapping[str, Any] | None = None) -> T:
    """``publish_with_retry`` after its first ``send()`` failed with ``error`` (one of
    ``UNSENT``): a caller that makes the first try itself, without a closure for it (a
    plain ``delay()``), goes on here."""
    conf = app.conf
    if retry is None:
        retry = conf["task_publish_retry"]
    if retry:
        policy = {**(conf["task_publish_retry_policy"] or {}), **(retry_policy or {})}
        max_retries = policy.get("max_retries", 3)
        start = float(policy.get("interval_start", 0) or 0)
        intervals = fxrange(start, float(policy.get("interval_max", 1) or 0) + start,
                            float(policy.get("interval_step", 0.2) or 0), repeatlast=True)
        retries = 0
        while max_retries is None or retries < max_retries:
            retries += 1
            delay = float(next(intervals))
            logger.warning("cannot publish: %s; retry %d in %.2fs", error, retries, delay)
            time.sleep(delay)
            try:
                return send()
            except UNSENT as exc:
                error = exc
    raise PublishUnavailable(str(error)) from error


# --- the caller's transaction -------------------------------------------------------------

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


def enclosing_session() -> psycopg.Connection | None:
    """The connection of the enclosing ``transaction()`` block, or None."""
    return _session.get()


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


# --- one call ------------------------------------------------------------------------------


@dataclass(slots=True)
class Message:
    """One task call made ready to insert: its configured core call and arguments, and what
    the publish signals and the returned result need afterwards."""

    app: Celery
    name: str
    args: Any
    kwargs: Any
    call: TaskCall
    routed: dict[str, Any]
    session: psycopg.Connection | None
    parent: Context | None
    ignore_result: bool | None
    #: The message headers and body the publish signals receive (None without receivers).
    headers: dict[str, Any] | None
    body: tuple[list[Any], dict[str, Any], dict[str, Any]] | None

    def request(self) -> JobRequest:
        """The row to insert (raises ``EncodeError`` for arguments that are not JSON)."""
        try:
            return self.call.request({"args": list(self.args), "kwargs": dict(self.kwargs)})
        except InvalidArgs as exc:
            raise EncodeError(str(exc)) from exc

    def published(self, result_id: str) -> None:
        """Send ``after_task_publish`` (when it has receivers) for the inserted row."""
        if self.headers is not None and self.body is not None:
            self.headers["id"] = result_id
            signals.after_task_publish.send(sender=self.name, body=self.body,
                                            headers=self.headers, exchange="",
                                            routing_key=self.routed["queue"])


def prepare(app: Celery, name: str, args: Any, kwargs: Any, options: dict[str, Any], *,
            task_id: str | None, link: Any, link_error: Any, shadow: str | None,
            task_type: Task | None, extra_meta: Mapping[str, Any] | None = None,
            id_in_meta: bool = True) -> Message:
    """Route one call and build its core call; ``options`` (consumed) holds every option of
    ``send_task`` but the keyword-only ones here, the serializer checked already.

    The message headers and body that Celery's publish signals receive are only built when
    ``before_task_publish`` or ``after_task_publish`` has a receiver (which is then sent
    ``before_task_publish``); the router is built once per configuration
    (``routing.settings_router``). ``extra_meta`` goes into ``meta["celery"]`` as it is (a
    canvas node's group id and index, an errback's marks). ``id_in_meta=False`` leaves the
    task id out of the configured call's meta, for a call kept and reused by plain sends
    (``TaskCall.enqueue_with_task_id`` adds each one's).
    """
    conf = app.conf
    pop = options.pop
    time_limit, soft_time_limit = pop("time_limit", None), pop("soft_time_limit", None)
    expires, ignore_result = pop("expires", None), pop("ignore_result", None)
    countdown, eta, connection = pop("countdown", None), pop("eta", None), pop("connection", None)
    root_id, parent_id = pop("root_id", None), pop("parent_id", None)
    # Per-key concurrency (akadze's, as a Celery-style option of the call or the task).
    concurrency_key = pop("concurrency_key", None) or getattr(task_type, "concurrency_key", None)
    max_concurrency = pop("max_concurrency", None) or getattr(task_type, "max_concurrency", None)
    route_name, headers = pop("route_name", None), pop("headers", None)
    args = [] if args is None else args
    kwargs = {} if kwargs is None else kwargs
    if not isinstance(args, (list, tuple)):
        raise TypeError("task args must be a list or tuple")
    if type(kwargs) is not dict and not isinstance(kwargs, Mapping):  # dict: skip the ABC
        raise TypeError("task keyword arguments must be a mapping")
    routed = settings_router(conf).route(
        {key: value for key, value in options.items() if key in ROUTE_KEYS},
        route_name or name, args, kwargs, task_type)
    parent = _state.get_current_worker_request()
    if parent is not None:
        root_id = root_id or parent.root_id or parent.id
        parent_id = parent_id or parent.id
        if conf["task_inherit_parent_priority"] and routed.get("priority") is None:
            routed["priority"] = (parent.delivery_info or {}).get("priority")
    at = to_datetime(eta, app) if eta is not None and not countdown else None
    eta_text = (at.isoformat() if at else (datetime.now(timezone.utc) + timedelta(
        seconds=float(countdown))).isoformat() if countdown else None)
    expires_at = _expires_at(expires, app)
    expires_text = expires_at.isoformat() if expires_at else None
    message_headers: dict[str, Any] | None = None
    body: tuple[list[Any], dict[str, Any], dict[str, Any]] | None = None
    if headers is not None and type(headers) is not dict:
        headers = {**headers}  # what the full headers' {..., **headers} accepts, or its error
    extra = extra_meta or {}
    if signals.before_task_publish.receivers or signals.after_task_publish.receivers:
        message_headers = {
            "lang": "py", "task": name, "id": task_id, "shadow": shadow, "eta": eta_text,
            "expires": expires_text, "group": extra.get("group_id"),
            "group_index": extra.get("group_index"), "retries": 0,
            "timelimit": [time_limit, soft_time_limit], "root_id": root_id,
            "parent_id": parent_id, "argsrepr": repr(args)[:1024],
            "kwargsrepr": repr(kwargs)[:1024], "origin": f"gen{os.getpid()}@{socket.gethostname()}",
            "ignore_result": ignore_result, "replaced_task_nesting": 0,
            "stamped_headers": None, "stamps": {}, **(headers or {}),
        }
        body = (list(args), dict(kwargs), {"callbacks": link, "errbacks": link_error,
                                           "chain": None, "chord": None})
        signals.before_task_publish.send(
            sender=name, body=body, exchange="", routing_key=routed["queue"], declare=[],
            headers=message_headers, properties={"correlation_id": task_id, "reply_to": ""},
            retry_policy=None)
    # Without receivers the custom headers are the caller's: the same ones message_meta
    # would keep of the full headers (the standard ones are dropped either way); with
    # receivers, what they changed in the headers is kept, as in Celery.
    celery_meta = message_meta(
        routed, headers=headers if message_headers is None else message_headers,
        root_id=root_id, parent_id=parent_id, eta=eta_text, expires=expires_text,
        ignore_result=ignore_result, time_limit=time_limit, soft_time_limit=soft_time_limit,
        shadow=shadow, link=link, link_error=link_error)
    if extra:
        celery_meta.update(extra)
    if options and not MESSAGE_PROPERTIES.isdisjoint(options):
        kept = {key: options[key] for key in MESSAGE_PROPERTIES.intersection(options)
                if options[key] is not None}
        if kept:
            celery_meta["properties"] = kept
    meta: dict[str, Any] = {"celery": celery_meta}
    if task_id is not None and id_in_meta:
        meta["task_id"] = str(task_id)
    core = app.core
    core_task = core.tasks.get(name) or CoreTask(core, name, _not_here, queue=routed["queue"])
    priority = routed.get("priority")
    call = core_task.configure(
        queue=routed["queue"], priority=None if priority is None else int(priority),
        delay=float(countdown) if countdown else None, at=at, expires_at=expires_at,
        max_attempts=max_attempts_for(task_type), meta=meta,
        concurrency_key=concurrency_key, max_concurrency=max_concurrency)
    return Message(app, name, args, kwargs, call, routed, current_session(connection), parent,
                   ignore_result, message_headers, body)


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
    meta = {
        "headers": _json_or_none(custom, "headers") or None, "root_id": root_id,
        "parent_id": parent_id, "eta": eta, "expires": expires,
        "ignore_result": ignore_result, "time_limit": time_limit,
        "soft_time_limit": soft_time_limit, "shadow": shadow,
        "link": _json_or_none(_listed(link), "link"),
        "link_error": _json_or_none(_listed(link_error), "link_error"),
        "routing_key": routed.get("routing_key"), "exchange": _name(routed.get("exchange")),
        "priority": routed.get("priority"),
    }
    # Only what was given: readers take a missing key as None (no headers: {}), and every
    # byte is in each job's row and WAL (a plain delay()'s meta went from 264 bytes to ~40).
    return {key: value for key, value in meta.items() if value is not None}


def publish_retry(task: Task, request: Context, args: Any, kwargs: Any, *,
                  countdown: float | None, eta: datetime | str | None) -> dict[str, Any] | None:
    """The publish signals of a retry, sent from ``Task.retry`` in the running task, as
    Celery sends them (it publishes the retry as a new message there); None without
    receivers. Returns the custom headers for the next run: the job's, as the receivers
    left them in the message headers (django-structlog puts the task's logging context
    there, for instance), or None when they are not JSON; the rest of the message is the
    job's already."""
    if not (signals.before_task_publish.receivers or signals.after_task_publish.receivers):
        return None
    meta = getattr(request, "_akadze_meta", None) or {}
    at = to_datetime(eta, task.app) if eta else (
        datetime.now(timezone.utc) + timedelta(seconds=float(countdown or 0)))
    hard, soft = request.timelimit or (None, None)
    headers: dict[str, Any] = {
        "lang": "py", "task": request.task, "id": request.id, "shadow": request.shadow,
        "eta": at.isoformat(), "expires": request.expires, "group": request.group,
        "group_index": request.group_index, "retries": request.retries + 1,
        "timelimit": [hard, soft], "root_id": request.root_id,
        "parent_id": request.parent_id, "argsrepr": repr(args)[:1024],
        "kwargsrepr": repr(kwargs)[:1024], "origin": f"gen{os.getpid()}@{socket.gethostname()}",
        "ignore_result": request.ignore_result, "replaced_task_nesting": 0,
        "stamped_headers": None, "stamps": {}, **(meta.get("headers") or {}),
    }
    body = (list(args), dict(kwargs), {"callbacks": request.callbacks,
                                       "errbacks": request.errbacks, "chain": None,
                                       "chord": None})
    delivery = request.delivery_info or {}
    queue = delivery.get("routing_key") or delivery.get("queue") or ""
    properties: dict[str, Any] = {"correlation_id": request.id, "reply_to": ""}
    if delivery.get("priority") is not None:  # Celery's retry keeps the message's priority
        properties["priority"] = delivery["priority"]
    signals.before_task_publish.send(
        sender=task.name, body=body, exchange="", routing_key=queue, declare=[],
        headers=headers, properties=properties, retry_policy=None)
    signals.after_task_publish.send(sender=task.name, body=body, headers=headers,
                                    exchange="", routing_key=queue)
    custom = {key: value for key, value in headers.items() if key not in STANDARD_HEADERS}
    # Headers that are not JSON are logged and left out: the job keeps the ones it had.
    return _json_or_none(custom, "headers")


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
    if value is None or (not value and type(value) in (dict, list)):
        return value  # trivially JSON: no need to encode it to find out
    try:
        serialization.dumps(value)
    except (TypeError, ValueError):
        logger.warning("%s is not JSON and is not stored with the job: %r", what, value)
        return None
    return value


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


# --- app.amqp ------------------------------------------------------------------------------

class AMQP:
    """``app.amqp``: the queue declarations test suites and apps read (``queues``,
    ``default_queue``, ``router``...). Nothing is published through it: a call becomes a
    job row (``prepare``); the producer and message builders of Celery's AMQP are not
    provided, each named in the error its use raises."""

    #: What Celery's AMQP has that a database queue does not; name -> what to do instead.
    NOT_PROVIDED: ClassVar[dict[str, str]] = {
        name: "there are no messages or producers: a call is a job row (use apply_async, "
              "send_task, or the publish signals to see what is sent)"
        for name in ("producer_pool", "publisher_pool", "send_task_message",
                     "create_task_message", "as_task_v1", "as_task_v2", "Producer",
                     "flush_routes", "_producer_pool", "Consumer")}

    def __init__(self, app: Celery) -> None:
        self.app = app

    def __getattr__(self, name: str) -> Any:
        if name in AMQP.NOT_PROVIDED:
            raise AttributeError(f"app.amqp.{name} (Celery's) is not provided by "
                                 f"akadze_compat: {AMQP.NOT_PROVIDED[name]}")
        raise AttributeError(f"'AMQP' object has no attribute {name!r}")

    def Queues(self, queues: Any, create_missing: bool | None = None,
               autoexchange: Any = None, max_priority: Any = None) -> dict[str, Any]:
        """Queue declarations (kombu ``Queue``s, names or ``{name: options}``) as
        ``{name: Queue}``; none: the default queue alone, as Celery declares it."""
        conf = self.app.conf
        declared: dict[str, Any] = {}
        if isinstance(queues, Mapping):
            for name, options in queues.items():
                declared[str(name)] = Queue(str(name), **dict(options or {}))
        else:
            for queue in queues or ():
                declared[queue_name(queue)] = queue if isinstance(queue, Queue) \
                    else Queue(str(queue), Exchange(str(queue)), str(queue))
        if not declared:
            name = str(conf.task_default_queue or "celery")
            declared[name] = Queue(name, Exchange(str(conf.task_default_exchange or name),
                                                  str(conf.task_default_exchange_type
                                                      or "direct")),
                                   str(conf.task_default_routing_key or name))
        return declared

    @property
    def queues(self) -> dict[str, Any]:
        """``{name: Queue}`` of ``task_queues``, else of the default queue (read from the
        settings at each access)."""
        return self.Queues(self.app.conf.task_queues)

    @property
    def default_queue(self) -> Any:
        """The ``Queue`` of ``task_default_queue``."""
        name = str(self.app.conf.task_default_queue or "celery")
        return self.queues.get(name) or self.Queues(None)[name]

    @property
    def default_exchange(self) -> Any:
        """The kombu ``Exchange`` of ``task_default_exchange``."""
        conf = self.app.conf
        return Exchange(str(conf.task_default_exchange or conf.task_default_queue or "celery"),
                        str(conf.task_default_exchange_type or "direct"))

    @property
    def router(self) -> Any:
        """The task router (``app.router()``): ``router.route(options, name, args, kwargs)``."""
        return self.app.router()

    @property
    def routes(self) -> Any:
        """The prepared ``task_routes``."""
        return prepare_routes(self.app.conf.task_routes)

    @property
    def utc(self) -> bool:
        """Whether times are sent in UTC (always)."""
        return True

    @property
    def argsrepr_maxsize(self) -> int:
        """How much of ``repr(args)`` the publish signals' headers carry (1024)."""
        return 1024

    kwargsrepr_maxsize = argsrepr_maxsize
