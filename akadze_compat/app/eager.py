"""``Task.apply()`` and ``task_always_eager``: run a task here, as the worker would.

The call goes through the same tracer as in the worker (signals and handlers included);
nothing touches the database. A ``retry()`` runs the task again at once with the retry's
arguments (Celery does not wait for the countdown either).
"""

from __future__ import annotations

import asyncio
import inspect
import socket
import threading
from typing import TYPE_CHECKING, Any

from .. import _state, states
from ..result import EagerResult
from ..utils import uuid
from .context import Context
from .trace import RetryCall, call_body, trace

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
            headers=headers,
            timelimit=None if hard is None and soft is None else [hard, soft],
            ignore_result=bool(ignore_result),
            delivery_info={"is_eager": True, "exchange": options.get("exchange"),
                           "routing_key": options.get("routing_key"),
                           "priority": options.get("priority")})

        def body(args: Any = args, kwargs: Any = kwargs) -> Any:
            value = call_body(task, args, kwargs)
            return _run_coroutine(value) if inspect.iscoroutine(value) else value

        result = trace(task, request, args, kwargs, body, eager=True, propagate=throw)
        sig = getattr(result.exception, "sig", None)
        if result.state == states.RETRY and isinstance(sig, RetryCall):
            retries += 1
            if sig.args is not None:
                args, kwargs = tuple(sig.args), dict(sig.kwargs or {})
            continue
        traceback = result.einfo.traceback if result.einfo else None
        return EagerResult(task_id, result.retval, result.state, traceback=traceback,
                           name=task.name)
