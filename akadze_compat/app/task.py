"""Celery's ``Task`` class and its request ``Context``, on top of akadze_core.

A task is an instance of a ``Task`` subclass made by ``@app.task``: its ``run`` is the
decorated function. Calling it runs the body inline; ``delay``/``apply_async`` enqueue a job
(see ``publish``); ``apply`` runs it eagerly and returns an ``EagerResult``; the worker runs
it through ``execution``.
"""

from __future__ import annotations

import contextvars
import inspect
import sys
import threading
import types
from collections.abc import Callable
from datetime import datetime
from typing import TYPE_CHECKING, Any

from akadze_core.integration import attempts_left

from .. import _state
from ..backends.base import update_state
from ..canvas import chunks, signature, xmap, xstarmap
from ..exceptions import MaxRetriesExceededError, Retry
from ..utils.objects import default, overrides_default
from . import amqp, eager, publish
from .annotations import resolve_all as resolve_all_annotations
from .context import Context
from .publish import EXEC_OPTIONS, PLAIN_CALL
from .replace import prepare_replacement, send_replacement
from .trace import RetryCall

if TYPE_CHECKING:
    from ..canvas import Signature
    from ..result import AsyncResult, EagerResult
    from .base import Celery

__all__ = ["EXEC_OPTIONS", "Context", "RetryCall", "Task"]

#: Task attribute -> the setting it falls back to when left at None.
FROM_CONFIG = (
    ("serializer", "task_serializer"), ("rate_limit", "task_default_rate_limit"),
    ("priority", "task_default_priority"), ("time_limit", "task_time_limit"),
    ("soft_time_limit", "task_soft_time_limit"), ("track_started", "task_track_started"),
    ("acks_late", "task_acks_late"),
    ("acks_on_failure_or_timeout", "task_acks_on_failure_or_timeout"),
    ("reject_on_worker_lost", "task_reject_on_worker_lost"),
    ("ignore_result", "task_ignore_result"), ("store_eager_result", "task_store_eager_result"),
    ("store_errors_even_if_ignored", "task_store_errors_even_if_ignored"),
)


_request_var_lock = threading.Lock()


class ArgumentCheck:
    """The argument check of one task body: its signature, read once.

    ``inspect.signature`` costs several microseconds, a third of what the rest of ``delay()``
    costs in Python, so it is read once per body (Celery likewise builds its checking
    function once per task). A call that plainly fits a signature made only of ordinary
    parameters is accepted by a few set and length tests; every other call (one that does
    not fit, positional-only parameters, args that are not a list or tuple) goes to
    ``Signature.bind``, which raises the same TypeError as before. The fast test only ever
    accepts calls ``bind`` accepts.
    """

    __slots__ = ("key", "min_positional", "names", "positional", "required_keywords",
                 "signature", "simple", "var_keyword", "var_positional")

    def __init__(self, key: Any, signature: inspect.Signature | None) -> None:
        self.key = key
        self.signature = signature
        parameters = list(signature.parameters.values()) if signature is not None else []
        kinds = {parameter.kind for parameter in parameters}
        self.simple = inspect.Parameter.POSITIONAL_ONLY not in kinds
        self.positional = tuple(parameter.name for parameter in parameters
                                if parameter.kind is inspect.Parameter.POSITIONAL_OR_KEYWORD)
        # Parameters without a default precede those with one, so the required positional
        # parameters are the first ``min_positional``.
        self.min_positional = sum(
            1 for parameter in parameters
            if parameter.kind is inspect.Parameter.POSITIONAL_OR_KEYWORD
            and parameter.default is inspect.Parameter.empty)
        self.required_keywords = tuple(
            parameter.name for parameter in parameters
            if parameter.kind is inspect.Parameter.KEYWORD_ONLY
            and parameter.default is inspect.Parameter.empty)
        self.names = frozenset(parameter.name for parameter in parameters
                               if parameter.kind in (inspect.Parameter.POSITIONAL_OR_KEYWORD,
                                                     inspect.Parameter.KEYWORD_ONLY))
        self.var_positional = inspect.Parameter.VAR_POSITIONAL in kinds
        self.var_keyword = inspect.Parameter.VAR_KEYWORD in kinds

    def fits(self, args: Any, kwargs: Any) -> bool:
        """True only if ``bind(*args, **kwargs)`` would succeed (False: ask ``bind``)."""
        if not self.simple or type(args) not in (tuple, list) or type(kwargs) is not dict:
            return False
        count = len(args)
        positional = self.positional
        if count > len(positional) and not self.var_positional:
            return False
        if not kwargs:
            return count >= self.min_positional and not self.required_keywords
        taken = positional[:count]
        for name in kwargs:
            if type(name) is not str or name in taken:
                return False
            if not self.var_keyword and name not in self.names:
                return False
        return (all(name in kwargs for name in positional[count:self.min_positional])
                and all(name in kwargs for name in self.required_keywords))

    def __call__(self, args: Any, kwargs: Any) -> None:
        """Raise TypeError, as calling the body would, if the arguments do not fit."""
        if self.signature is None or self.fits(args, kwargs):
            return
        self.signature.bind(*args, **kwargs)


def _signature_key(run: Any) -> Any:
    """What identifies the signature of ``run`` for the cache, or None: do not cache.

    Plain functions and methods of plain functions only: their signature is fixed once
    defined. Anything else (a partial, a callable object) is inspected at every call.
    """
    if type(run) is types.FunctionType:
        return run
    if type(run) is types.MethodType and type(run.__func__) is types.FunctionType:
        return (run.__func__, "method")  # bound: the first parameter is not in the signature
    return None


def retry_arguments(task: Task, request: Context, args: Any, kwargs: Any) -> tuple[Any, Any]:
    """The arguments of the next run when ``retry`` gets ``args`` and/or ``kwargs``.

    Like Celery (#6494): new positional arguments drop the inherited keywords they now
    fill, and a new keyword replaces the inherited positional argument of that name.
    """
    inherited_args = list(request.args or ())
    inherited_kwargs = dict(request.kwargs or {})
    if args is None and kwargs is None:
        return inherited_args, inherited_kwargs
    if args is not None and kwargs is not None:
        return list(args), dict(kwargs)
    try:
        parameters = list(inspect.signature(task.run).parameters.values())
    except (TypeError, ValueError):
        parameters = []
    positional = [p for p in parameters if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    if args is not None:
        for parameter in positional[:len(args)]:
            if parameter.kind is parameter.POSITIONAL_OR_KEYWORD:
                inherited_kwargs.pop(parameter.name, None)
        return list(args), inherited_kwargs
    new_kwargs = dict(kwargs)
    for index, parameter in enumerate(positional[:len(inherited_args)]):
        if parameter.kind is parameter.POSITIONAL_OR_KEYWORD and parameter.name in new_kwargs:
            inherited_args[index] = new_kwargs.pop(parameter.name)
    return inherited_args, {**inherited_kwargs, **new_kwargs}


def raise_with_context(exc: BaseException) -> None:
    """Raise ``exc`` chained to the exception being handled, if any (Celery's helper)."""
    current = sys.exc_info()[1]
    if current is exc:
        raise exc
    raise exc from current


class RequestStack(tuple):  # type: ignore[type-arg]
    """A task's requests, innermost last: a tuple with Celery's ``LocalStack`` reads."""

    __slots__ = ()

    @property
    def top(self) -> Context | None:
        """The innermost request, or None."""
        return self[-1] if self else None

    @property
    def stack(self) -> list[Context]:
        """The requests, innermost last."""
        return list(self)


class _ClassProperty:
    """``Task.app``: read on the class or an instance (``_get_app``); set on an instance, it
    binds the class (``bind``), as Celery's ``class_property``."""

    def __init__(self, getter: Any, setter: Any) -> None:
        self.getter = getter
        self.setter = setter
        # The classmethod's function, called with the class: the same call as binding the
        # classmethod first, without making a bound method at every read (every send
        # reads ``task.app``).
        self._get = getter.__func__
        self.__doc__ = "The app this task belongs to (the current app for an unbound class)."

    def __get__(self, obj: Any, owner: type | None = None) -> Any:
        return self._get(owner if owner is not None else type(obj))

    def __set__(self, obj: Any, value: Any) -> None:
        self.setter.__get__(obj, type(obj))(value)


class Task:
    """Celery's task base class. Subclass it (``base=`` / ``task_cls=``) to share behaviour."""

    #: Where ``task_has_custom`` stops looking: what is defined here is the default.
    __akadze_base_task__ = True

    MaxRetriesExceededError = MaxRetriesExceededError

    _app: Celery | None = None
    #: The task name (``module.function`` unless given).
    name: str | None = None
    #: Check call arguments against the signature (default: the app's ``strict_typing``).
    typing: bool | None = None
    #: Retries allowed after the first run; None means forever.
    max_retries: int | None = 3
    #: Seconds before a retry when ``retry()`` gets no countdown or eta.
    default_retry_delay: float = 3 * 60
    rate_limit: Any = None
    ignore_result: bool | None = None
    trail = True
    send_events = True
    store_errors_even_if_ignored: bool | None = None
    store_eager_result: bool | None = None
    serializer: str | None = None
    #: Hard and soft time limits, in seconds.
    time_limit: float | None = None
    soft_time_limit: float | None = None
    track_started: bool | None = None
    acks_late: bool | None = None
    acks_on_failure_or_timeout: bool | None = None
    reject_on_worker_lost: bool | None = None
    #: Expected exceptions: still failures, logged without a traceback.
    throws: tuple[type[BaseException], ...] = ()
    expires: Any = None
    #: Default priority (lower numbers run first).
    priority: int | None = None
    queue: Any = None
    # Kombu's routing and delivery options, None unless a task sets them (one attribute each
    # for every name of EXEC_OPTIONS, so they can all be read in one attrgetter call).
    routing_key: str | None = None
    exchange: Any = None
    delivery_mode: Any = None
    compression: str | None = None
    resultrepr_maxsize = 1024
    abstract = True
    #: Automatic retries: exceptions to retry on, and how (see ``autoretry``).
    autoretry_for: tuple[type[BaseException], ...] = ()
    dont_autoretry_for: tuple[type[BaseException], ...] = ()
    retry_kwargs: dict[str, Any] = {}  # noqa: RUF012 - Celery's class attribute
    retry_backoff: bool | float = False
    retry_backoff_max: float = 600
    retry_jitter = True
    __bound__ = False

    # --- app binding ------------------------------------------------------------------------

    @classmethod
    def bind(cls, app: Celery) -> Celery:
        """Attach the task class to ``app``; attributes left at None take the app's settings,
        and the first time the app's ``task_annotations`` apply (``annotate``)."""
        was_bound, cls.__bound__ = cls.__dict__.get("__bound__", False), True
        cls._app = app
        if cls.typing is None:
            cls.typing = app.strict_typing
        for attribute, setting in FROM_CONFIG:
            if getattr(cls, attribute, None) is None:
                setattr(cls, attribute, app.conf.get(setting))
        if not was_bound:
            cls.annotate()
        cls.on_bound(app)
        return app

    @classmethod
    def on_bound(cls, app: Celery) -> None:
        """Called each time the class is bound to ``app`` (a hook for subclasses)."""

    @classmethod
    def _get_app(cls) -> Celery:
        """The class's app: the one it is bound to, else the current app (what ``Task.app``
        reads, on the class as on an instance)."""
        app = cls._app
        return app if app is not None else _state.get_current_app()

    @classmethod
    def annotate(cls) -> None:
        """Apply the app's ``task_annotations`` that match this task: attributes are set,
        ``@method`` keys wrap that method (``add_around``)."""
        for found in resolve_all_annotations(cls._get_app().annotations, cls):
            for key, value in found.items():
                if key.startswith("@"):
                    cls.add_around(key[1:], value)
                else:
                    setattr(cls, key, value)

    @classmethod
    def add_around(cls, attr: str, around: Callable[[Any], Any]) -> None:
        """Replace method ``attr`` by ``around(original)`` (once: the original is kept in
        ``__wrapped__`` and a second wrapper wraps it, not the first wrapper)."""
        original = getattr(cls, attr)
        original = getattr(original, "__wrapped__", None) or original
        method = around(original)
        method.__wrapped__ = original
        setattr(cls, attr, method)

    @classmethod
    def attach_app(cls, app: Celery) -> None:
        """Make ``app`` this task class's app, leaving its settings alone (``bind`` also
        fills the attributes left at None from the app's settings)."""
        cls._app = app

    app: Celery = _ClassProperty(_get_app, bind)  # type: ignore[assignment]

    @property
    def backend(self) -> Any:
        """The result backend (``app.backend`` unless one was set on the task)."""
        backend = self.__dict__.get("_backend") or type(self).__dict__.get("_backend")
        return backend if backend is not None else self.app.backend

    @backend.setter
    def backend(self, value: Any) -> None:
        self.__dict__["_backend"] = value

    def option(self, attribute: str, setting: str) -> Any:
        """The task's ``attribute``, or the ``setting`` when it is None (read live)."""
        value = getattr(self, attribute, None)
        return self.app.conf.get(setting) if value is None else value

    # --- requests -----------------------------------------------------------------------------

    @property
    def request_var(self) -> contextvars.ContextVar[tuple[Context, ...]]:
        """The context variable holding this task's request stack (the tracer pushes a
        request on it for each call). A context variable, not a thread local: async bodies
        and the worker's threads each see their own stack."""
        var = self.__dict__.get("_request_var")
        if var is None:
            with _request_var_lock:  # two threads first using a task must share one stack
                var = self.__dict__.get("_request_var")
                if var is None:
                    var = contextvars.ContextVar(f"akadze_compat.request.{self.name}",
                                                 default=())
                    self.__dict__["_request_var"] = var
        return var

    @property
    def request(self) -> Context:
        """The current call's request (a default one outside any call)."""
        stack = self.request_var.get()
        if stack:
            return stack[-1]
        default = self.__dict__.get("_default_request")
        if default is None:
            default = self.__dict__["_default_request"] = Context()
        return default

    @property
    def request_stack(self) -> RequestStack:
        """Every request pushed in this context, innermost last (``.top``: the innermost,
        as on Celery's stack, which instrumentations read)."""
        return RequestStack(self.request_var.get())

    def push_request(self, *args: Any, **kwargs: Any) -> None:
        """Push a request that inherits the current one's attributes."""
        stack = self.request_var.get()
        values = dict(stack[-1].__dict__) if stack else {}
        values.pop("_children", None)
        values.update(*args, **kwargs)
        self.request_var.set((*stack, Context(values)))

    def pop_request(self) -> None:
        """Pop the innermost request."""
        self.request_var.set(self.request_var.get()[:-1])

    # --- calling ------------------------------------------------------------------------------

    @default
    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        """Run the body inline, as a plain function call (``request.called_directly``)."""
        self.push_request(args=args, kwargs=kwargs)
        try:
            return self.run(*args, **kwargs)
        finally:
            self.pop_request()

    def run(self, *args: Any, **kwargs: Any) -> Any:
        """The body of the task."""
        raise NotImplementedError("Tasks must define the run method.")

    def check_arguments(self, args: Any = None, kwargs: Any = None) -> None:
        """Raise TypeError if the arguments do not fit the body's signature (``typing``).

        The signature is read once per body and kept on the task (see ``ArgumentCheck``);
        a body replaced later (``task.run = ...``) is read again.
        """
        run = self.run
        key = _signature_key(run)
        check = self.__dict__.get("_argument_check")
        if check is None or key is None or check.key != key:
            try:
                signature: inspect.Signature | None = inspect.signature(run)
            except (TypeError, ValueError):
                signature = None
            check = ArgumentCheck(key, signature)
            if key is not None:
                self.__dict__["_argument_check"] = check
        check(args or (), kwargs or {})

    def delay(self, *args: Any, **kwargs: Any) -> AsyncResult:
        """``apply_async(args, kwargs)``: enqueue the task with these arguments."""
        kept = self.__dict__.get(PLAIN_CALL)
        # A plain call that the stock apply_async would send with the kept core call goes
        # there directly; an apply_async overridden in a subclass (``kept.direct``, which
        # the kept call's key keeps true) or replaced on the task (a mock) is called as
        # Celery calls it.
        if kept is not None and kept.direct and "apply_async" not in self.__dict__:
            sent = publish.send_plain(self, kept, args, kwargs)
            if sent is not None:
                return sent
        return self.apply_async(args, kwargs)

    @default
    def apply_async(self, args: Any = None, kwargs: Any = None, task_id: str | None = None,
                    producer: Any = None, link: Any = None, link_error: Any = None,
                    shadow: str | None = None, **options: Any) -> AsyncResult:
        """Enqueue the task; returns its ``AsyncResult`` (an ``EagerResult`` when eager).

        Options: countdown, eta (datetime or ISO), expires (seconds, datetime or ISO), queue,
        priority, ignore_result, headers, time_limit, soft_time_limit, connection (a psycopg
        connection whose transaction the job joins); kombu options are accepted and ignored.
        """
        return publish.apply_async(self, args, kwargs, task_id=task_id, link=link,
                                      link_error=link_error, shadow=shadow, **options)

    def apply(self, args: Any = None, kwargs: Any = None, link: Any = None,
              link_error: Any = None, task_id: str | None = None, retries: int | None = None,
              throw: bool | None = None, logfile: str | None = None,
              loglevel: int | None = None, headers: dict[str, Any] | None = None,
              **options: Any) -> EagerResult:
        """Run the task here and now, as a worker would; returns an ``EagerResult``.

        ``throw`` (default ``task_eager_propagates``) re-raises the task's exception.
        """
        return eager.apply_eagerly(
            self, args, kwargs, task_id=task_id, retries=retries or 0, throw=throw,
            link=link, link_error=link_error, headers=headers, logfile=logfile,
            loglevel=loglevel, options=options)

    def delay_on_commit(self, *args: Any, **kwargs: Any) -> AsyncResult:
        """Enqueue as part of Django's current transaction; returns the ``AsyncResult``."""
        return publish.apply_on_commit(self, args, kwargs, {})

    def apply_async_on_commit(self, args: Any = None, kwargs: Any = None,
                              **options: Any) -> AsyncResult:
        """``apply_async`` as part of Django's current transaction; returns the result."""
        return publish.apply_on_commit(self, args, kwargs, options)

    def signature(self, args: Any = None, *starargs: Any, **starkwargs: Any) -> Signature:
        """A signature of this task: ``task.signature(args, kwargs, **options)``."""
        starkwargs.setdefault("app", self.app)
        return signature(self, args, *starargs, **starkwargs)

    subtask = signature

    def s(self, *args: Any, **kwargs: Any) -> Signature:
        """``signature(args, kwargs)``: ``add.s(2, 2)``."""
        return self.signature(args, kwargs)

    def si(self, *args: Any, **kwargs: Any) -> Signature:
        """An immutable signature (``add.si(2, 2)``)."""
        return self.signature(args, kwargs, immutable=True)

    def chunks(self, it: Any, n: int) -> chunks:
        """The items of ``it`` in parts of ``n`` (tuples of arguments), each part one task
        calling this one for each item: ``add.chunks(zip(xs, ys), 10)()``."""
        return chunks(self.s(), it, n, app=self.app)

    def map(self, it: Any) -> xmap:
        """One task calling this one for each item of ``it`` (one argument each)."""
        return xmap(self.s(), it, app=self.app)

    def starmap(self, it: Any) -> xstarmap:
        """One task calling this one for each item of ``it`` (a tuple of arguments)."""
        return xstarmap(self.s(), it, app=self.app)

    @default
    def shadow_name(self, args: Any, kwargs: Any, options: Any) -> str | None:
        """Override to show another name for the task in logs."""
        return None

    @default
    def _get_exec_options(self) -> dict[str, Any]:
        return publish.exec_options(self)

    def AsyncResult(self, task_id: str, **kwargs: Any) -> AsyncResult:
        """The result of the call with ``task_id``."""
        return self.app.AsyncResult(task_id, task_name=self.name, **kwargs)

    # --- inside the task ---------------------------------------------------------------------

    def replace(self, sig: Signature) -> Any:
        """Replace this running task with ``sig`` (a signature or a canvas), which takes
        its task id, its place in a chain or chord, its callbacks and errbacks: the
        caller's result gives the replacement's. Raises ``Ignore`` in a worker (use
        ``return self.replace(...)``); eagerly runs ``sig`` and returns its result. See
        ``app.replace``."""
        return self.on_replace(prepare_replacement(self, sig))

    def on_replace(self, sig: Signature) -> Any:
        """Called by ``replace`` with the prepared replacement: runs it eagerly, or sends
        it, hands this task over to it and raises ``Ignore`` (an override must return
        ``super().on_replace(sig)``)."""
        if self.request.is_eager:
            return sig.apply().get()
        send_replacement(self, sig)
        return None  # send_replacement raises Ignore

    def retry(self, args: Any = None, kwargs: Any = None, exc: BaseException | None = None,
              throw: bool = True, eta: datetime | None = None, countdown: float | None = None,
              max_retries: int | None = None, **options: Any) -> Retry:
        """Run the task again later; raises ``Retry`` (returns it when ``throw`` is False).

        Past ``max_retries`` (this call's, else the task's; None: no limit) the given
        ``exc`` (or ``MaxRetriesExceededError``) is raised instead; a ``max_retries`` above
        the task's raises the job's attempt budget, as Celery allows. Called outside a
        worker (a direct call), ``exc`` is simply raised.
        """
        request = self.request
        retries = request.retries + 1
        if max_retries is not None:
            self.override_max_retries = max_retries
        limit = self.max_retries if max_retries is None else max_retries
        if request.called_directly:
            raise_with_context(exc or Retry("Task can be retried", None))
        if not eta and countdown is None:
            countdown = self.retry_delay()
        call_args, call_kwargs = retry_arguments(self, request, args, kwargs)
        # ``retries`` is this run's attempt number; Celery's ``max_retries=M`` is M + 1
        # attempts, judged by the core's rule (the one the worker applies to the row).
        if limit is not None and not attempts_left(retries, limit + 1):
            if exc:
                raise_with_context(exc)
            raise self.MaxRetriesExceededError(
                f"Can't retry {self.name}[{request.id}] args:{call_args} kwargs:{call_kwargs}",
                task_args=call_args, task_kwargs=call_kwargs)
        changed = args is not None or kwargs is not None
        # Celery publishes the retry here, in the task: its publish signals are sent now
        # (not for a retry returned with throw=False, which is not run again here).
        headers = None if request.is_eager or not throw else amqp.publish_retry(
            self, request, call_args, call_kwargs, countdown=countdown, eta=eta)
        call = RetryCall(call_args if changed else None, call_kwargs if changed else None,
                         countdown, eta, options, limit, headers)
        retry = Retry(exc=exc, when=eta or countdown, is_eager=request.is_eager, sig=call)
        if throw:
            raise retry
        return retry

    def retry_delay(self) -> float:
        """``default_retry_delay``; a task that does not set it takes the
        ``task_default_retry_delay`` setting when there is one (180 s otherwise)."""
        for cls in type(self).__mro__:
            if cls is Task:
                break
            if "default_retry_delay" in cls.__dict__:
                return self.default_retry_delay
        configured = self.app.conf.get("task_default_retry_delay")
        return self.default_retry_delay if configured is None else configured

    def update_state(self, task_id: str | None = None, state: str | None = None,
                     meta: Any = None, **kwargs: Any) -> None:
        """Record a custom state (e.g. ``"PROGRESS"``) and its metadata for the running task;
        ``AsyncResult(id).state`` / ``.info`` read them while it runs."""
        update_state(self, task_id, state, meta)

    # --- handlers (override in a base class) --------------------------------------------------

    @default
    def before_start(self, task_id: str, args: Any, kwargs: Any) -> None:
        """Called before the body runs."""

    @default
    def on_success(self, retval: Any, task_id: str, args: Any, kwargs: Any) -> None:
        """Called after the body returned ``retval``."""

    @default
    def on_retry(self, exc: Any, task_id: str, args: Any, kwargs: Any, einfo: Any) -> None:
        """Called when the task is to be retried (``exc`` is the cause, if any)."""

    @default
    def on_failure(self, exc: BaseException, task_id: str, args: Any, kwargs: Any,
                   einfo: Any) -> None:
        """Called when the task failed with ``exc``."""

    @default
    def after_return(self, status: str, retval: Any, task_id: str, args: Any, kwargs: Any,
                     einfo: Any) -> None:
        """Called after the task succeeded or failed."""

    def __repr__(self) -> str:
        app = type(self)._app
        return f"<@task: {self.name} of {app.main if app else None}>"

    @property
    def __name__(self) -> str:
        return type(self).__name__  # type: ignore[return-value]  # the class's, not this


BaseTask = Task


def task_overrides(task: Task, attribute: str) -> bool:
    """Whether ``task``'s class defines its own ``attribute`` (not Task's)."""
    return overrides_default(task, attribute)

