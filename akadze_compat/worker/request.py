"""``celery.worker.request``: what ``task_received`` receivers get as ``request``.

Celery's worker builds a ``Request`` per message and sends ``task_received`` with it when
the message arrives. Here a worker claims a job and runs it at once: ``task_received`` is
sent in the process that runs the job, just before ``task_prerun``, once the job is known
to run (not revoked, not expired, as Celery sends it), with a ``Request`` over the job's
``self.request``: the attributes receivers read (id, name, args, kwargs, eta, expires,
hostname, delivery_info...). There is no message to acknowledge or reject, and no
``Task.Request = "proj.MyRequest"`` subclass is used.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

from .. import signals
from ..utils.unsupported import not_provided

if TYPE_CHECKING:
    from ..app.context import Context
    from ..app.task import Task

__all__ = ["Request", "send_received"]


class Request:
    """A task call as the worker received it (Celery's ``Request``, read-only here)."""

    def __init__(self, task: Task, context: Context) -> None:
        self._task = task
        self._context = context
        self.id: str = str(context.id)
        self.name: str = str(context.shadow or context.task or task.name)
        self.stamps: dict[str, Any] = {}
        self.stamped_headers: list[str] = []

    task_id = property(lambda self: self.id, doc="The task id (Celery's older name).")
    task_name = property(lambda self: self._context.task or self._task.name,
                         doc="The task's registered name (``name`` is its shadow name).")
    type = task_name
    task = property(lambda self: self._task, doc="The task object.")
    app = property(lambda self: self._task.app, doc="The app.")
    args = property(lambda self: self._context.args, doc="Positional arguments.")
    kwargs = property(lambda self: self._context.kwargs, doc="Keyword arguments.")
    eta = property(lambda self: self._context.eta, doc="When it was due (ISO text or None).")
    expires = property(lambda self: self._context.expires, doc="Its expiry, or None.")
    hostname = property(lambda self: self._context.hostname, doc="This worker's name.")
    delivery_info = property(lambda self: self._context.delivery_info,
                             doc="exchange, routing_key, priority, redelivered.")
    root_id = property(lambda self: self._context.root_id, doc="The workflow's root id.")
    parent_id = property(lambda self: self._context.parent_id, doc="The calling task's id.")
    correlation_id = property(lambda self: self._context.correlation_id, doc="The task id.")
    reply_to = property(lambda self: self._context.reply_to, doc="Always empty.")
    ignore_result = property(lambda self: self._context.ignore_result,
                             doc="Whether the result is dropped.")
    replaced_task_nesting = property(
        lambda self: self._context.replaced_task_nesting or 0,
        doc="How many times the task was replaced (Task.replace) on the way here.")
    groups = property(lambda self: [self._context.group] if self._context.group else [],
                      doc="The group this call belongs to, if any.")
    utc = True
    time_limits = property(lambda self: (self._context.time_limit,
                                         self._context.soft_time_limit),
                           doc="(hard, soft) time limits of this call.")
    argsrepr = property(lambda self: repr(self._context.args), doc="repr of the args.")
    kwargsrepr = property(lambda self: repr(self._context.kwargs), doc="repr of the kwargs.")

    @property
    def request_dict(self) -> dict[str, Any]:
        """The request's fields as a dict (what becomes ``self.request``)."""
        return {key: value for key, value in vars(self._context).items()
                if not key.startswith("_")}

    @property
    def worker_pid(self) -> int:
        """The process running the task."""
        return os.getpid()

    def __repr__(self) -> str:
        return f"<Request: {self.name}[{self.id}] {self.args!r} {self.kwargs!r}>"


def send_received(task: Task, context: Context) -> None:
    """Send ``task_received`` for a run about to start (only built with receivers)."""
    if signals.task_received.receivers:
        signals.task_received.send(sender=None, request=Request(task, context))


__getattr__ = not_provided(__name__, {
    "create_request_cls": ("the worker runs jobs, not messages: a Request subclass "
                           "(Task.Request) is not used; hook in with the Task handlers and "
                           "the signals", "signals"),
})
