"""Sending tasks: ``apply_async``/``send_task`` become akadze_core jobs.

A Celery call becomes one job of the same task name, with args ``{"args": [...],
"kwargs": {...}}`` and the Celery-only data (headers, ids of the parent and root task, eta,
expires, limits) in ``meta["celery"]``. The task id is the one the caller chose
(``task_id=``), or a uuid4 string made here, as Celery makes it, when something sees it
before the row is inserted (a ``before_task_publish``/``after_task_publish`` receiver, a
link): either is kept in ``meta["task_id"]`` (the core's external id, spliced into the meta
encoded once: ``TaskCall.enqueue_with_task_id``), found through its index. Any other call
stores none: it is known by the uuid4-shaped id derived from its job id
(``akadze_core.model.task_ids``, as a group's members are), which ``AsyncResult`` works out when
asked for, so the row and the index stay as small as a plain job's.

Transactional enqueue: ``apply_async(connection=psycopg_conn)``, or any call inside
``with akadze_compat.transaction(conn):``, inserts the job in that connection's transaction.
"""

from __future__ import annotations

import functools
import operator
import sys
import warnings
from collections.abc import Mapping
from datetime import datetime
from typing import TYPE_CHECKING, Any, NamedTuple

import psycopg
from kombu.exceptions import EncodeError

from akadze_core import ConnectionLost, InvalidArgs

from .. import _state, serialization, signals
from ..exceptions import AlwaysEagerIgnored, ImproperlyConfigured
from ..result import AsyncResult
from ..utils import uuid
from ..utils.objects import overrides_default
from . import flow
from .amqp import (
    FOREVER,
    ROUTE_KEYS,
    STANDARD_HEADERS,
    UNSENT,
    PublishConnectionLost,
    PublishUnavailable,
    current_session,
    enclosing_session,
    max_attempts_for,
    message_meta,
    prepare,
    publish_retried,
    publish_with_retry,
    to_datetime,
    transaction,
)
from .routes import settings_router_state

if TYPE_CHECKING:
    from .base import Celery
    from .config import Settings
    from .task import Task

__all__ = ["EXEC_OPTIONS", "FOREVER", "PLAIN_CALL", "ROUTE_KEYS", "STANDARD_HEADERS",
           "PublishConnectionLost", "PublishUnavailable", "apply_async", "apply_on_commit",
           "current_session", "exec_options", "max_attempts_for", "message_meta", "send_plain",
           "send_task", "task_limits", "to_datetime", "transaction"]

#: Options that may be set on a task and apply to each call (Celery's exec options).
EXEC_OPTIONS = ("queue", "routing_key", "exchange", "priority", "expires", "serializer",
                "delivery_mode", "compression", "time_limit", "soft_time_limit")
#: Where a task keeps what its plain calls reuse (``send_plain``).
PLAIN_CALL = "_akadze_plain_call"


def exec_options(task: Task) -> dict[str, Any]:
    """The task's own execution options (``Task._get_exec_options``, which a subclass may
    override as in Celery; the senders call that)."""
    return {name: getattr(task, name, None) for name in EXEC_OPTIONS}

def apply_async(task: Task, args: Any = None, kwargs: Any = None, *, task_id: str | None = None,
                link: Any = None, link_error: Any = None, shadow: str | None = None,
                **options: Any) -> AsyncResult:
    """``Task.apply_async``: check the call, then run it eagerly or enqueue it.

    Which settings are read at every call and which are kept: see the note above
    ``_LIMITS_KEY``; what a plain call reuses: ``PLAIN_CALL``; the body's signature is read
    once per body (``Task.check_arguments``).
    """
    if not options and task_id is None and link is None and link_error is None \
            and shadow is None:
        kept = task.__dict__.get(PLAIN_CALL)
        if kept is not None:
            sent = send_plain(task, kept, args, kwargs)
            if sent is not None:
                return sent
    app = task.app
    conf = app.conf
    given = bool(options)
    hard, soft = task.time_limit, task.soft_time_limit
    if hard is None or soft is None:
        default_hard, default_soft = conf.derived(_LIMITS_KEY, _settings_limits)
        hard = default_hard if hard is None else hard
        soft = default_soft if soft is None else soft
    if soft and hard and soft > hard:
        raise ValueError("soft_time_limit must be less than or equal to time_limit")
    typing = task.typing if task.typing is not None else app.strict_typing
    if typing:
        task.check_arguments(args, kwargs)
    options = {**task._get_exec_options(), **options}
    options.setdefault("ignore_result", task.ignore_result)
    if conf["task_always_eager"]:
        check_serializers(app, options.get("serializer"))
        # Like Celery: the arguments make the JSON round trip even when eager.
        args, kwargs = serialization.loads(serialization.dumps([args or (), kwargs or {}]))
        return task.apply(args, kwargs, task_id=task_id or uuid(), link=link,
                          link_error=link_error, **options)
    shadow = shadow or task.shadow_name(args, kwargs, options)
    if _stock_send_task(app):
        # Celery.send_task only hands its arguments on to send_task here (dropping kombu's
        # producer/router/chord... options, which send_task ignores anyway), and send_task
        # only checks the serializers and task_always_eager (just read) before _send. Each
        # layer of keyword forwarding costs about 2 us with a dozen options, so this goes
        # straight to _send. A send_task that is overridden, wrapped or mocked is called
        # as Celery calls it.
        check_serializers(app, options.pop("serializer", None))
        plain = None
        if not given and task_id is None and link is None and link_error is None \
                and shadow is None and _plain_now(args, kwargs) and _keepable(task, conf):
            plain = _plain_key(task, app, conf)
        return _send(app, str(task.name), args, kwargs, options, task_id=task_id, link=link,
                     link_error=link_error, shadow=shadow, task_type=task, plain_key=plain)
    return app.send_task(str(task.name), args, kwargs, task_id=task_id, link=link,
                         link_error=link_error, shadow=shadow, task_type=task, **options)


# A plain call (``delay(...)`` or ``apply_async(args, kwargs)`` with no option, outside a
# worker's task, outside transaction(), no publish signal receiver) enqueues the same job but
# for its arguments every time, as long as the task's attributes, the app's settings and the
# router's answer stay the same: the configured core call (queue, priority, max_attempts,
# meta) is kept on the task after the first such call built it through the full path (_send),
# and reused while the key that decided it (_plain_key) is unchanged. Such a call goes
# straight from apply_async to the core enqueue (send_plain): no option handling, routing,
# meta building or core configure(), and no re-check of the time limits and serializers,
# which depend only on what the key holds. What may differ per call is still done per call:
# the argument check, task_always_eager (read live, as Celery does), the publish signals'
# receivers, the transaction() block and the parent task.
#: The task attributes a plain call's configured core call (and its checks) depend on.
_PLAIN_ATTRIBUTES = operator.attrgetter("name", "max_retries", "ignore_result", "typing",
                                        *EXEC_OPTIONS)


class _Plain(NamedTuple):
    """What a task keeps for its plain calls (see ``PLAIN_CALL``)."""

    key: tuple[Any, ...]
    call: Any  # the configured akadze_core TaskCall
    # The app and conf the key names by id: kept alive with it, so no other object has
    # their ids while it exists.
    owners: tuple[Any, ...]
    # Decided by what the key holds: whether calls are checked against the body's signature
    # (typing), and whether delay() may come here directly (the class's apply_async is the
    # stock one; an override is called, and reaches the kept call through super()).
    typed: bool
    direct: bool
    # What the key fixes of the result: the task's name as a str, and its ignore_result
    # (None: the task leaves it to task_ignore_result, read at each call as Celery does).
    name: str
    ignored: bool | None


def _plain_key(task: Task, app: Celery, conf: Settings) -> tuple[Any, ...]:
    """What decides a plain call's configured core call. The app and conf by identity (a new
    Settings object starts its generation again); the router's answer is fixed while the
    generation of conf is (``_keepable`` checked it is static); the task's and the app's
    classes and their overridable methods by identity (a method replaced on the class, a
    mock, changes the key), the task's attributes by value."""
    cls = type(task)
    # The attributes as attrgetter's own tuple, nested: unpacking them into this one cost
    # as much again as the whole comparison.
    return (id(app), id(conf), conf.generation(), app.strict_typing, cls, cls.shadow_name,
            cls._get_exec_options, cls.apply_async, type(app).send_task,
            _PLAIN_ATTRIBUTES(task))


def _plain_now(args: Any, kwargs: Any) -> bool:
    """Whether this call, by what may change between calls, may be a kept plain call."""
    if args is not None and type(args) is not tuple and type(args) is not list:
        return False  # send_task's type errors come from the full path
    if kwargs is not None and type(kwargs) is not dict:
        return False
    if signals.before_task_publish.receivers or signals.after_task_publish.receivers:
        return False
    # A transaction() block, or ids and priority inherited from a parent task.
    return enclosing_session() is None and _state.get_current_worker_request() is None


def _keepable(task: Task, conf: Settings) -> bool:
    """Whether the task's plain calls may be kept at all: relative expiry differs at every
    call, a router function may answer differently for other arguments, and an overridden
    shadow_name or _get_exec_options is called as Celery calls it."""
    return (task.expires is None and bool(settings_router_state(conf)[1])
            and not overrides_default(task, "shadow_name") and "shadow_name" not in task.__dict__
            and not overrides_default(task, "_get_exec_options"))


def send_plain(task: Task, kept: _Plain, args: Any, kwargs: Any) -> AsyncResult | None:
    """Enqueue a plain call with its kept core call; None when this call is not one (the
    full path then handles it)."""
    app = task.app
    conf = app.conf
    # The key holds the classes' methods; what is set on the instances is looked at here.
    if kept.key != _plain_key(task, app, conf) or not _plain_now(args, kwargs) \
            or "shadow_name" in task.__dict__ or "send_task" in app.__dict__:
        return None
    if kept.typed:
        task.check_arguments(args, kwargs)
    if conf["task_always_eager"]:
        return None
    # Tuples encode as the lists Celery sends; nothing here keeps or changes them. No task
    # id is stored: nothing saw one before the insert (no publish signal receiver, no
    # task_id=, no link), so the job is known by the id derived from its job id. The first
    # try is made here, not through publish_with_retry and a closure: a plain call's Python
    # is what it adds to the insert (measured live, three times its cost in a warm loop).
    call = kept.call
    if args is None:
        args = ()
    if kwargs is None:
        kwargs = {}
    try:
        try:
            job_id = int(call.enqueue(args=args, kwargs=kwargs))
        except UNSENT as exc:
            job_id = int(publish_retried(
                app, lambda: call.enqueue(args=args, kwargs=kwargs), exc))
    except InvalidArgs as exc:
        raise EncodeError(str(exc)) from exc
    except ConnectionLost as exc:
        raise PublishConnectionLost(str(exc)) from exc.__cause__
    ignored = kept.ignored
    if ignored is None:
        ignored = bool(task.option("ignore_result", "task_ignore_result"))
    return AsyncResult.of_job(app, kept.name, job_id, ignored=ignored)


#: Classes whose ``send_task`` was checked: class -> (its send_task, whether it is stock).
_send_task_checked: dict[type, tuple[Any, bool]] = {}


def _stock_send_task(app: Celery) -> bool:
    """Whether ``app.send_task`` is ``akadze_compat.app.base.Celery.send_task`` itself: not set on
    the instance, not overridden in a subclass, not replaced or wrapped on the class (a
    mock, an instrumentation wrapper). Told by its code object, which a wrapper copying
    ``__name__``/``__qualname__`` (functools.wraps) does not share."""
    if "send_task" in app.__dict__:
        return False
    cls = type(app)
    method = getattr(cls, "send_task", None)
    checked = _send_task_checked.get(cls)
    if checked is not None and checked[0] is method:
        return checked[1]
    code = getattr(method, "__code__", None)
    app_module = sys.modules.get("akadze_compat.app.base")
    # Python 3.10's code objects have no co_qualname: there, co_name and the file decide
    # (base.py defines one send_task).
    stock = (code is not None and app_module is not None and code.co_name == "send_task"
             and getattr(code, "co_qualname", "Celery.send_task") == "Celery.send_task"
             and code.co_filename == getattr(app_module, "__file__", None))
    _send_task_checked[cls] = (method, stock)
    return stock


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
    """Refuse any serializer but JSON (settings and the call's ``serializer=``).

    The call's ``serializer=`` is checked at every call; ``task_serializer`` and
    ``accept_content`` once per configuration (see ``_settings_limits``).
    """
    if serializer is not None and serializer != "json":
        serialization.check_serializer(serializer, "serializer")
    app.conf.derived(_SERIALIZERS_KEY, _check_settings_serializers)


# Settings read by every send are kept with Settings.derived, i.e. read again after any
# change made through conf, but not after a change inside a live source (a settings module
# or Django's settings changed in place, override_settings): 2-7 us per lookup that misses
# Django's settings, several per call. Celery itself reads these when a task is bound
# (time limits, serializer), or not at all when sending (accept_content), so this follows
# more changes than Celery does. task_always_eager stays live: Django test suites switch it
# with override_settings, and Celery reads it at every call too.
_LIMITS_KEY = "akadze_compat.publish.time_limits"
_SERIALIZERS_KEY = "akadze_compat.publish.serializers"


def _settings_limits(conf: Settings, previous: Any) -> tuple[Any, Any]:
    """``task_time_limit`` and ``task_soft_time_limit``: what a task left at None uses."""
    return conf.get("task_time_limit"), conf.get("task_soft_time_limit")


def task_limits(task: Task) -> tuple[Any, Any]:
    """(hard, soft): the task's ``time_limit``/``soft_time_limit``, else the settings'.

    ``task.option`` for both, with the settings kept per generation of ``conf`` (as
    ``apply_async`` keeps them): the worker asks this for every job, and two live settings
    lookups were a tenth of the facade's work per job.
    """
    hard, soft = task.time_limit, task.soft_time_limit
    if hard is None or soft is None:
        default_hard, default_soft = task.app.conf.derived(_LIMITS_KEY, _settings_limits)
        hard = default_hard if hard is None else hard
        soft = default_soft if soft is None else soft
    return hard, soft


def _check_settings_serializers(conf: Settings, previous: Any) -> bool:
    """Raise ImproperlyConfigured unless the serializer settings mean JSON (nothing is kept
    then, so every call raises until they are fixed)."""
    serialization.check_serializer(conf["task_serializer"], "task_serializer")
    serialization.check_accept_content(conf["accept_content"])
    return True


def send_task(app: Celery, name: str, args: Any = None, kwargs: Any = None, *,
              countdown: float | None = None, eta: datetime | str | None = None,
              task_id: str | None = None, connection: Any = None, expires: Any = None,
              link: Any = None, link_error: Any = None, time_limit: float | None = None,
              soft_time_limit: float | None = None, root_id: str | None = None,
              parent_id: str | None = None, route_name: str | None = None,
              shadow: str | None = None, task_type: Task | None = None,
              headers: Mapping[str, Any] | None = None, **options: Any) -> AsyncResult:
    """``Celery.send_task``: enqueue the task called ``name`` and return its AsyncResult."""
    if app.conf["task_always_eager"]:
        warnings.warn(AlwaysEagerIgnored("task_always_eager has no effect on send_task"),
                      stacklevel=3)
    check_serializers(app, options.pop("serializer", None))
    if task_type is None:
        task_type = app.registry.get(name)
        if task_type is not None:
            defaults = {key: value for key, value in task_type._get_exec_options().items()
                        if value is not None}
            options = {**defaults, **options}
    # Given here, these beat the registered task's defaults merged into options just above.
    for key, value in (("time_limit", time_limit), ("soft_time_limit", soft_time_limit),
                       ("expires", expires)):
        if value is not None:
            options[key] = value
    options.update(countdown=countdown, eta=eta, connection=connection, root_id=root_id,
                   parent_id=parent_id, route_name=route_name, headers=headers)
    return _send(app, name, args, kwargs, options, task_id=task_id, link=link,
                 link_error=link_error, shadow=shadow, task_type=task_type)


def _send(app: Celery, name: str, args: Any, kwargs: Any, options: dict[str, Any], *,
          task_id: str | None, link: Any, link_error: Any, shadow: str | None,
          task_type: Task | None, plain_key: tuple[Any, ...] | None = None) -> AsyncResult:
    """Enqueue one call; ``options`` (consumed) holds every option of ``send_task`` but the
    keyword-only ones here, the serializer checked already. The row is built by
    ``amqp.prepare`` (as a canvas builds each of its rows); the task id is the caller's, or
    a uuid4 made here, as Celery makes it, when a publish signal's receiver or a link sees
    it before the insert; else none is stored and the job is known by the id derived from
    its job id (see the module's docstring). With ``link``/``link_error`` the call
    is sent as a workflow: its callbacks wait for it and its errbacks are inserted if it
    fails (``flow.send_linked``). With ``plain_key`` (a plain call, see ``PLAIN_CALL``) the
    configured core call is kept on ``task_type`` for the next plain calls: its meta holds
    no task id (``enqueue_with_task_id`` adds a chosen one)."""
    linked = link is not None or link_error is not None
    if task_id is not None:
        task_id = str(task_id)
    elif linked or signals.before_task_publish.receivers \
            or signals.after_task_publish.receivers:
        task_id = uuid()  # seen before the insert: by the workflow's rows, by the receivers
    # Celery's publish retry options: what to do while the database cannot be reached.
    retry, retry_policy = options.pop("retry", None), options.pop("retry_policy", None)
    message = prepare(app, name, args, kwargs, options, task_id=task_id, link=link,
                      link_error=link_error, shadow=shadow, task_type=task_type,
                      id_in_meta=linked)
    if linked:
        assert task_id is not None  # made above for every linked call
        return flow.send_linked(message, task_id, link, link_error, task_type,
                                retry=retry, retry_policy=retry_policy)
    call = message.call
    session = message.session
    if plain_key is not None and task_type is not None and session is None \
            and message.parent is None and message.headers is None:
        # Checked again here: a receiver connected by another thread since _plain_key ran
        # may have added headers to this call's meta.
        typing = task_type.typing if task_type.typing is not None else app.strict_typing
        own_ignore = task_type.ignore_result
        task_type.__dict__[PLAIN_CALL] = _Plain(
            plain_key, call, (app, app.conf), typed=bool(typing),
            direct=not overrides_default(task_type, "apply_async"), name=str(task_type.name),
            ignored=None if own_ignore is None else bool(own_ignore))
    if session is not None:
        call = call.using(session=session)
    args_list, kwargs_dict = list(message.args), dict(message.kwargs)
    try:
        job_id = int(publish_with_retry(
            app, lambda: call.enqueue(args=args_list, kwargs=kwargs_dict) if task_id is None
            else call.enqueue_with_task_id(task_id, args=args_list, kwargs=kwargs_dict),
            retry, retry_policy))
    except InvalidArgs as exc:
        raise EncodeError(str(exc)) from exc
    except ConnectionLost as exc:
        raise PublishConnectionLost(str(exc)) from exc.__cause__
    if task_id is None:
        result = AsyncResult.of_job(app, name, job_id, ignored=False)
        if message.headers is not None:  # a receiver connected since the check above
            message.published(result.id)
    else:
        message.published(task_id)
        result = AsyncResult(task_id, app=app, task_name=name, job_id=job_id)
    ignore_result = message.ignore_result
    if ignore_result is None and task_type is not None:
        ignore_result = task_type.option("ignore_result", "task_ignore_result")
    result.ignored = bool(ignore_result)
    return result
