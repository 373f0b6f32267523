"""Running a Celery task: the tracer shared by the worker and ``apply()``.

``trace`` runs one call the way Celery's tracer does: ``task_prerun``, ``before_start``, the
body, then per outcome ``on_success``/``task_success``, ``on_retry``/``task_retry`` or
``on_failure``/``task_failure``, ``after_return`` and ``task_postrun``. The worker side
(``entry.py``) then turns the outcome into what akadze_core understands.

Celery's patch point: the worker runs each task through ``build_tracer(name, task, ...)``
looked up on this module when the task runs (so ``celery.app.trace.build_tracer`` replaced
after import, as Sentry and New Relic do, applies), with Celery's call shape: the tracer it
returns is called ``tracer(task_id, args, kwargs, request_dict)`` and returns a
``trace_ok_t``. What the worker needs beyond that call (the time limits around the body, the
revoke check, the early outcome store) reaches the tracer through ``worker_run``, not
through its arguments, which wrappers pass on as they are. An ``async def`` body (which
Celery's tracer cannot run) is traced by ``trace_async`` directly: instrumentations see it
through the signals only.
"""

from __future__ import annotations

import contextvars
import logging
import sys
import time
import traceback as traceback_module
from collections import namedtuple
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any, NamedTuple

from kombu.exceptions import EncodeError

from .. import serialization, signals, states
from .._state import task_stack, worker_request
from ..exceptions import Ignore, Reject, Retry
from ..result import stored_value
from ..utils.objects import is_default, overrides_default, wraps_default
from ..utils.unsupported import not_provided
from .context import Context

if TYPE_CHECKING:
    from .task import Task

__all__ = ["IGNORE_STATES", "ExceptionInfo", "RetryCall", "TraceInfo", "TraceResult",
           "WorkerRun", "build_tracer", "call_body", "task_has_custom", "trace", "trace_async",
           "trace_ok_t", "worker_run"]

logger = logging.getLogger("celery.app.trace")


class RetryCall(NamedTuple):
    """What ``Task.retry`` asks for: the next run's arguments, delay and options.

    ``max_retries`` is the limit this retry was checked against (the call's
    ``max_retries=``, else the task's; None: no limit): the worker raises the job's attempt
    budget to match, since the job was sent with the task's ``max_retries``.
    """

    args: Any
    kwargs: Any
    countdown: float | None
    eta: datetime | None
    options: dict[str, Any]
    max_retries: int | None = None
    #: The next run's custom headers, when the publish signals' receivers were sent the
    #: retry's message (None: the job's stay as they are).
    headers: dict[str, Any] | None = None


class ExceptionInfo:
    """What Celery hands to ``on_failure``/``on_retry`` and ``task_failure`` as ``einfo``:
    billiard's ``ExceptionInfo`` interface (``type``, ``exception``, ``tb``, ``traceback``
    as text, ``exc_info``, ``internal``).

    ``ExceptionInfo()`` takes the exception being handled (``sys.exc_info()``), as
    billiard's does; ``exc_info`` may be that triple or an exception instance.
    ``exception`` is the exception itself (billiard wraps it for pickling, which nothing
    here needs), ``tb`` its traceback object.
    """

    #: Set to true if this is an internal error.
    internal = False

    def __init__(self, exc_info: BaseException | tuple[Any, Any, Any] | None = None,
                 internal: bool = False) -> None:
        if isinstance(exc_info, BaseException):
            exc: BaseException | None = exc_info
            etype: Any = type(exc_info)
            tb = exc_info.__traceback__
        else:
            etype, exc, tb = exc_info or sys.exc_info()
        self.exception = exc
        self.type = etype
        self.tb = tb
        self.traceback = "".join(traceback_module.format_exception(etype, exc, tb))
        self.internal = internal

    @property
    def exc_info(self) -> tuple[Any, BaseException | None, Any]:
        """``(type, exception, traceback)``, as ``sys.exc_info()`` gave them."""
        return self.type, self.exception, self.tb

    def __str__(self) -> str:
        return self.traceback

    def __repr__(self) -> str:
        return f"<ExceptionInfo: {self.exception!r}>"


@dataclass
class TraceResult:
    """How a call ended: its Celery state and the return value or exception."""

    state: str
    retval: Any
    einfo: ExceptionInfo | None = None

    @property
    def exception(self) -> BaseException | None:
        """The exception the body raised (None on success)."""
        return self.retval if isinstance(self.retval, BaseException) else None


def call_body(task: Task, args: Any, kwargs: Any) -> Any:
    """Call the task as Celery's tracer does: through a custom ``__call__`` if the class
    has one, else straight to ``run``."""
    if overrides_default(task, "__call__"):
        return task(*args, **kwargs)
    return task.run(*args, **kwargs)


def _handler(task: Task, name: str) -> Callable[..., Any] | None:
    """``task``'s handler ``name``, or None when it is Task's no-op (marked ``@default``
    in ``Task``; calling it would only cost time).

    Looked up on every call, not cached: a class patched later is still seen. Asked of the
    class first: a default left on it and not set on the instance needs no bound method.
    """
    if name not in task.__dict__ and is_default(getattr(type(task), name, None)):
        return None
    handler: Callable[..., Any] = getattr(task, name)
    if is_default(getattr(handler, "__func__", None)):
        return None
    return handler


def _safely(what: str, handler: Callable[..., Any], *args: Any, eager: bool) -> None:
    """Run a handler; its exception is logged (the outcome is decided already), or raised
    when eager, as in Celery."""
    try:
        handler(*args)
    except Exception:
        if eager:
            raise
        logger.exception("%s handler raised", what)


def _on_exception(task: Task, request: Context, args: Any, kwargs: Any, exc: Exception,
                  *, eager: bool, propagate: bool,
                  revoked: Callable[[], bool | None] | None) -> TraceResult:
    if isinstance(exc, Reject):
        logger.info("Task %s[%s] rejected: %r", task.name, request.id, exc)
        return TraceResult(states.REJECTED, exc, ExceptionInfo(exc))
    if isinstance(exc, Ignore):
        logger.info("Task %s[%s] ignored", task.name, request.id)
        return TraceResult(states.IGNORED, exc, ExceptionInfo(exc))
    if propagate:
        raise exc
    einfo = ExceptionInfo(exc)
    expired = revoked() if revoked is not None else None
    if expired is not None:
        # A revoke requested while it ran: the job ends REVOKED whatever was raised.
        signals.task_revoked.send(sender=task, request=request, terminated=False,
                                  signum=None, expired=expired)
        return TraceResult(states.REVOKED, exc, einfo)
    if isinstance(exc, Retry):
        on_retry = _handler(task, "on_retry")
        if on_retry is not None:
            _safely("on_retry", on_retry, exc.exc, request.id, args, kwargs, einfo,
                    eager=eager)
        signals.task_retry.send(sender=task, request=request, reason=exc, einfo=einfo)
        logger.info("Task %s[%s] retry: %s", task.name, request.id, exc)
        return TraceResult(states.RETRY, exc, einfo)
    on_failure = _handler(task, "on_failure")
    if on_failure is not None:
        _safely("on_failure", on_failure, exc, request.id, args, kwargs, einfo, eager=eager)
    signals.task_failure.send(sender=task, task_id=request.id, exception=exc, args=args,
                              kwargs=kwargs, traceback=exc.__traceback__, einfo=einfo)
    if task.throws and isinstance(exc, task.throws):
        logger.info("Task %s[%s] raised expected: %r", task.name, request.id, exc)
    else:
        logger.error("Task %s[%s] raised unexpected: %r", task.name, request.id, exc,
                     exc_info=None if eager else (type(exc), exc, exc.__traceback__))
    return TraceResult(states.FAILURE, exc, einfo)


def _on_return(task: Task, request: Context, args: Any, kwargs: Any, retval: Any,
               started: float, *, eager: bool, propagate: bool,
               revoked: Callable[[], bool | None] | None) -> TraceResult:
    if not eager and not request.ignore_result:
        try:
            serialization.dumps(stored_value(retval))
        except (TypeError, ValueError) as exc:
            # Celery's EncodeError when storing the result: the task fails.
            error = EncodeError(f"the task returned a value that is not JSON: {exc}")
            try:
                raise error from exc
            except EncodeError as raised:
                return _on_exception(task, request, args, kwargs, raised, eager=eager,
                                     propagate=propagate, revoked=revoked)
    on_success = _handler(task, "on_success")
    if on_success is not None:
        _safely("on_success", on_success, retval, request.id, args, kwargs, eager=eager)
    # A signal without receivers and a disabled level cost nothing beyond these checks:
    # no keyword dict, no clock read, no log record.
    if signals.task_success.receivers:
        signals.task_success.send(sender=task, result=retval,
                                  runtime=time.monotonic() - started)
    if logger.isEnabledFor(logging.INFO):
        # Celery's line, the runtime as a plain float: a fast body takes microseconds.
        logger.info("Task %s[%s] succeeded in %ss: %r", task.name, request.id,
                    time.monotonic() - started, retval)
    return TraceResult(states.SUCCESS, retval)


def _after_return(task: Task, request: Context, args: Any, kwargs: Any, result: TraceResult,
                  eager: bool) -> None:
    if result.state in (states.SUCCESS, states.FAILURE):
        after_return = _handler(task, "after_return")
        if after_return is not None:
            _safely("after_return", after_return, result.state, result.retval, request.id,
                    args, kwargs, None, eager=eager)


class _Tracing:
    """Push the request (and the worker marker) for the duration of one traced call."""

    __slots__ = ("_request_token", "_requests", "_stack_token", "_worker_token", "args",
                 "eager", "kwargs", "request", "result", "task")

    def __init__(self, task: Task, request: Context, args: Any, kwargs: Any,
                 eager: bool) -> None:
        self.task, self.request, self.args, self.kwargs, self.eager = \
            task, request, args, kwargs, eager
        self.result: TraceResult | None = None

    def __enter__(self) -> _Tracing:
        requests = self._requests = self.task.request_var
        self._request_token = requests.set((*requests.get(), self.request))
        self._stack_token = task_stack.set((*task_stack.get(), self.task))
        self._worker_token = None if self.eager else worker_request.set(
            (self.task, self.request))
        if signals.task_prerun.receivers:  # no receivers: not even the keyword dict
            signals.task_prerun.send(sender=self.task, task_id=self.request.id,
                                     task=self.task, args=self.args, kwargs=self.kwargs)
        return self

    def __exit__(self, *exc_info: Any) -> None:
        try:
            if signals.task_postrun.receivers:
                result = self.result
                signals.task_postrun.send(
                    sender=self.task, task_id=self.request.id, task=self.task,
                    args=self.args, kwargs=self.kwargs,
                    retval=result.retval if result else None,
                    state=result.state if result else None)
        finally:
            if self._worker_token is not None:
                worker_request.reset(self._worker_token)
            task_stack.reset(self._stack_token)
            self._requests.reset(self._request_token)


def trace(task: Task, request: Context, args: Any, kwargs: Any, body: Callable[[], Any], *,
          eager: bool, propagate: bool = False,
          revoked: Callable[[], bool | None] | None = None,
          store: Callable[[TraceResult], None] | None = None) -> TraceResult:
    """Run ``body()`` as the call of ``task`` described by ``request``.

    ``propagate`` re-raises the body's exception (eager runs with eager_propagates).
    ``revoked()`` says, after an exception, whether a revoke was requested meanwhile (None:
    no; else whether it expired). ``store(result)`` writes the outcome before
    ``task_postrun`` is sent, called only when that signal has receivers: Celery stores the
    state first, so a receiver reading ``AsyncResult(task_id).state`` sees it.
    """
    with _Tracing(task, request, args, kwargs, eager) as tracing:
        started = time.monotonic()
        try:
            before_start = _handler(task, "before_start")
            if before_start is not None:
                before_start(str(request.id), args, kwargs)
            retval = body()
        except Exception as exc:
            tracing.result = _on_exception(task, request, args, kwargs, exc, eager=eager,
                                           propagate=propagate, revoked=revoked)
        else:
            tracing.result = _on_return(task, request, args, kwargs, retval, started,
                                        eager=eager, propagate=propagate, revoked=revoked)
        _after_return(task, request, args, kwargs, tracing.result, eager)
        if store is not None and signals.task_postrun.receivers:
            store(tracing.result)
        return tracing.result


async def trace_async(task: Task, request: Context, args: Any, kwargs: Any,
                      body: Callable[[], Awaitable[Any]], *,
                      revoked: Callable[[], Awaitable[bool | None]] | None = None,
                      store: Callable[[TraceResult], Awaitable[None]] | None = None) \
        -> TraceResult:
    """``trace`` for an ``async def`` body run by the worker (``store`` awaited)."""
    with _Tracing(task, request, args, kwargs, False) as tracing:
        started = time.monotonic()
        try:
            before_start = _handler(task, "before_start")
            if before_start is not None:
                before_start(str(request.id), args, kwargs)
            retval = await body()
        except Exception as exc:
            # Only the exceptions _on_exception asks about need the (awaited) answer:
            # Reject and Ignore end as they are, whatever a revoke says.
            asks = not isinstance(exc, (Reject, Ignore))
            expired = await revoked() if revoked is not None and asks else None
            tracing.result = _on_exception(task, request, args, kwargs, exc, eager=False,
                                           propagate=False, revoked=lambda: expired)
        else:
            tracing.result = _on_return(task, request, args, kwargs, retval, started,
                                        eager=False, propagate=False, revoked=None)
        _after_return(task, request, args, kwargs, tracing.result, False)
        if store is not None and signals.task_postrun.receivers:
            await store(tracing.result)
        return tracing.result


class TraceInfo:
    """Celery's ``TraceInfo``: the state a traced call ended in and its exception (the
    ``info`` of the ``trace_ok_t`` a tracer returns when the call did not succeed)."""

    __slots__ = ("retval", "state")

    def __init__(self, state: str, retval: Any = None) -> None:
        self.state = state
        self.retval = retval


#: What a tracer returns, as in Celery: the return value (the exception when the call did
#: not succeed), None or the ``TraceInfo`` of a call that did not succeed, the seconds it
#: took, and the text of the return value (None here: nothing reads it).
trace_ok_t = namedtuple("trace_ok_t", ("retval", "info", "runtime", "retstr"))
#: The states after which Celery stores nothing.
IGNORE_STATES = frozenset({states.IGNORED, states.RETRY, states.REJECTED})


def task_has_custom(task: Any, attr: str) -> type | None:
    """The class that gives ``task`` its own ``attr`` (None: it is the base Task's), as
    Celery's ``task_has_custom``. Asked of ``task.__class__``, which an instrumentation
    proxy around a task answers with the task's class. An ``attr`` replaced on the base class
    itself (a wrapper around its method) counts as custom, as Celery's check of the
    method's module does."""
    for node in task.__class__.__mro__:
        value = node.__dict__.get(attr)
        if node.__dict__.get("__akadze_base_task__") or node is object:
            if value is None:
                return None
            own = getattr(value, "__module__", None) == node.__module__
            return None if own and not wraps_default(value) else node
        if value is not None:
            return node
    return None


@dataclass(slots=True)
class WorkerRun:
    """What the worker hands to the tracer of the call it runs, beside the tracer's
    arguments: the request as built from the job, the body's caller (time limits around it),
    the revoke check and the early outcome store (see ``trace``); the tracer leaves the
    ``TraceResult`` in ``result``."""

    request: Context
    call: Callable[[Any, Any, Any], Any]
    revoked: Callable[[], bool | None] | None
    store: Callable[[TraceResult], None] | None
    result: TraceResult | None = None
    #: ``apply()``'s run (eager), and whether it re-raises the body's exception.
    eager: bool = False
    propagate: bool = False


#: The run the worker is about to trace in this context (None outside it).
worker_run: contextvars.ContextVar[WorkerRun | None] = contextvars.ContextVar(
    "akadze_compat.worker_run", default=None)


def build_tracer(name: str, task: Any, loader: Any = None, hostname: str | None = None,
                 store_errors: bool = True, Info: type = TraceInfo, eager: bool = False,
                 propagate: bool = False, app: Any = None,
                 monotonic: Callable[[], float] = time.monotonic,
                 trace_ok_t: Callable[..., Any] = trace_ok_t,
                 IGNORE_STATES: frozenset[str] = IGNORE_STATES) -> Callable[..., Any]:
    """Celery's ``build_tracer``: a function ``trace_task(uuid, args, kwargs, request=None)``
    that runs one call of ``task`` with its handlers and signals and returns a
    ``trace_ok_t``.

    The worker builds one per task and process, and again when this function was replaced
    (a wrapper installed later applies from the next task on); ``apply()`` builds one per
    call with ``eager=True``, as Celery's does. ``task`` is used as given,
    so a proxy around the task (New Relic's) is what the body is called through. ``loader``,
    ``hostname``, ``store_errors``, ``app`` and ``IGNORE_STATES`` are accepted for Celery's
    callers; results are stored by the worker, from the job, whatever they say.
    """
    del name, loader, hostname, store_errors, app, IGNORE_STATES

    def trace_task(uuid: Any, args: Any, kwargs: Any, request: Any = None) -> Any:
        run = worker_run.get()
        started = monotonic()
        if run is not None and run.result is None and run.eager == eager:
            # the run of the worker or of apply() that built this tracer, traced once
            result = trace(task, run.request, args, kwargs,
                           lambda: run.call(task, args, kwargs), eager=run.eager,
                           propagate=run.propagate, revoked=run.revoked, store=run.store)
            run.result = result
        else:  # called on its own: a request from what was passed
            context = Context(dict(request or {}), id=uuid, args=args, kwargs=kwargs,
                              is_eager=eager)
            result = trace(task, context, args, kwargs,
                           lambda: call_body(task, args, kwargs), eager=eager,
                           propagate=propagate)
        if result.state == states.SUCCESS:
            return trace_ok_t(result.retval, None, monotonic() - started, None)
        return trace_ok_t(result.retval, Info(result.state, result.retval),
                          monotonic() - started, None)

    return trace_task


__getattr__ = not_provided(__name__, {
    name: ("the worker builds its tracers itself; hook in with build_tracer, the "
           "task_prerun / task_postrun / task_success / task_failure signals or the "
           "Task handlers", "signals")
    for name in ("trace_task", "setup_worker_optimizations", "reset_worker_optimizations")})
