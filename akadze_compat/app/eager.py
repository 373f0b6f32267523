"""``Task.apply()`` and ``task_always_eager``: run a task here, as the worker would.

The call goes through ``build_tracer`` as in the worker (signals and handlers included);
nothing touches the database. A ``retry()`` runs the task again at once with the retry's
arguments (Celery does not wait for the countdown either).
"""

from __future__ import annotations

import asyncio
import inspect
import socket
import threading
from traceback import format_exception
from typing import TYPE_CHECKING, Any

from .. import _state, states
from ..canvas.signatures import listed, maybe_signature
from ..exceptions import Retry
from ..result import EagerResult
from ..utils import uuid
from ..worker.canvas import new_style_errback
from . import trace as trace_module
from .context import Context
from .trace import RetryCall, WorkerRun, call_body, worker_run

if TYPE_CHECKING:
    from .task import Task

__all__ = ["apply_eagerly"]


def _run_coroutine(coroutine: Any) -> Any:
    """Run an ``async def`` body to completion from sync code."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(coroutine)
    # Called from inside a running loop: that loop cannot be blocked on, use another one.
    outcome: dict[str, Any] = {}

    def target() -> None:
        try:
            outcome["value"] = asyncio.run(coroutine)
        except BaseException as exc:
            outcome["error"] = exc

    thread = threading.Thread(target=target, name="akadze-eager")
    thread.start()
    thread.join()
    if "error" in outcome:
        raise outcome["error"]
    return outcome.get("value")


def _traced(task: Task, request: Context, args: Any, kwargs: Any, body: Any,
            throw: bool) -> Any:
    """One call through ``build_tracer(..., eager=True)`` as it is now (Celery's apply()
    builds one per call, so a wrapper around it sees eager calls too)."""
    tracer = trace_module.build_tracer(str(task.name), task, eager=True, propagate=throw,
                                       app=task.app)
    run = WorkerRun(request, body, None, None, eager=True, propagate=throw)
    token = worker_run.set(run)
    try:
        tracer(request.id, args, kwargs, request.__dict__)
    finally:
        worker_run.reset(token)
    if run.result is None:
        raise RuntimeError(f"the tracer of {task.name!r} did not run the task")
    return run.result


def apply_eagerly(task: Task, args: Any, kwargs: Any, *, task_id: str | None, retries: int,
                  throw: bool | None, link: Any, link_error: Any, headers: Any,
                  logfile: Any, loglevel: Any, options: dict[str, Any]) -> EagerResult:
    """Run ``task`` now and return its ``EagerResult``."""
    app = task.app
    if throw is None:
        throw = bool(app.conf.task_eager_propagates)
    args, kwargs = tuple(args or ()), dict(kwargs or {})
    task_id = task_id or uuid()
    parent = _state.get_current_task()
    parent_request = parent.request if parent is not None else None
    parent_id = parent_request.id if parent_request is not None else None
    root_id = (parent_request.root_id or task_id) if parent_request is not None else task_id
    hard, soft = task.time_limit, task.soft_time_limit
    ignore_result = options.get("ignore_result", task.ignore_result)
    while True:
        request = Context(
            id=task_id, task=task.name, parent_id=parent_id, root_id=root_id,
            retries=retries, is_eager=True, called_directly=False, logfile=logfile,
            loglevel=loglevel or 0, hostname=socket.gethostname(), args=args, kwargs=kwargs,
            callbacks=link if link is None or isinstance(link, list) else [link],
            errbacks=link_error if link_error is None or isinstance(link_error, list)
            else [link_error],
            headers=headers, group=options.get("group_id"),
            group_index=options.get("group_index"),
            timelimit=None if hard is None and soft is None else [hard, soft],
            ignore_result=bool(ignore_result),
            delivery_info={"is_eager": True, "exchange": options.get("exchange"),
                           "routing_key": options.get("routing_key"),
                           "priority": options.get("priority")})

        def body(called: Any, args: Any, kwargs: Any) -> Any:
            value = call_body(called, args, kwargs)
            return _run_coroutine(value) if inspect.iscoroutine(value) else value

        try:
            result = _traced(task, request, args, kwargs, body, throw)
        except Exception as exc:  # propagated (throw): the errbacks run first, as in Celery
            if link_error and not isinstance(exc, Retry):
                call_errbacks(app, request, exc, "".join(format_exception(exc)), link_error)
            raise
        sig = getattr(result.exception, "sig", None)
        if result.state == states.RETRY and isinstance(sig, RetryCall):
            retries += 1
            if sig.args is not None:
                args, kwargs = tuple(sig.args), dict(sig.kwargs or {})
            continue
        traceback = result.einfo.traceback if result.einfo else None
        if result.state == states.SUCCESS and link:
            call_callbacks(app, link, result.retval)
        elif result.state == states.FAILURE and link_error and result.exception is not None:
            call_errbacks(app, request, result.exception, traceback, link_error)
        return EagerResult(task_id, result.retval, result.state, traceback=traceback,
                           name=task.name)


def call_callbacks(app: Any, link: Any, retval: Any) -> None:
    """A task's ``link`` callbacks, given its result (sent: eagerly when
    ``task_always_eager``, as Celery's tracer sends them)."""
    for callback in listed(link):
        maybe_signature(callback, app=app).apply_async((retval,))


def call_errbacks(app: Any, request: Context, exc: BaseException, traceback: str | None,
                  link_error: Any) -> None:
    """A failed eager run's errbacks, Celery's way: a new-style one (a function of more
    than one argument) called ``(request, exc, traceback)`` here; an old-style one run
    eagerly with the task id."""
    for errback in listed(link_error):
        sig = maybe_signature(errback, app=app)
        task = sig.known_type
        if task is not None and new_style_errback(task, sig.args, sig.kwargs,
                                                  immutable=bool(sig.immutable)):
            sig(request, exc, traceback)
        else:
            sig.apply((request.id,), parent_id=request.id, root_id=request.root_id)
