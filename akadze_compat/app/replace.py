"""``Task.replace(sig)``: the running task hands its task id, its place in a chain or chord
and its callbacks to ``sig``, Celery's way, in the transaction that ends it.

Celery's worker sends the replacement frozen with the task's id, relinks the callbacks and
errbacks onto it, appends the rest of the chain, then raises ``Ignore``; a worker lost
between the send and the ack runs the task, and sends the replacement, again. Here what
waits on the task is already in the database (the chain's next steps, a chord's body, link
callbacks: rows waiting on this job), so the replacement is inserted, those rows are passed
to its last job (``JobContext.hand_over``) and this job's end is written in one
transaction (``complete_tx``): all of it or none, once. The caller's result (by task id,
or holding this job's id: it follows ``replaced_by``) gives the replacement's result.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from akadze_core import current

from ..canvas import group, maybe_signature
from ..canvas.primitives import chain_class
from ..exceptions import Ignore, ImproperlyConfigured
from .flow import Builder

if TYPE_CHECKING:
    from ..canvas import Signature
    from .task import Task

__all__ = ["prepare_replacement", "send_replacement"]


def prepare_replacement(task: Task, sig: Signature) -> Signature:
    """``sig`` made the replacement of the running ``task`` (Celery 5.7's ``replace`` up to
    ``on_replace``): a group becomes a chord whose body gives the list of its results, the
    task's errbacks are linked to it, it is frozen with the task's id and keeps its group,
    group index and root."""
    request = task.request
    if "chord" in sig.options:
        raise ImproperlyConfigured("A signature replacing a task must not be part of a chord")
    if isinstance(sig, chain_class) and not getattr(sig, "tasks", True):
        raise ImproperlyConfigured("Cannot replace with an empty chain")
    # A group, or a chain's last step that is one, becomes a chord whose body gives the
    # list of its results: the task's result, and what waits on it, wait on that body.
    if isinstance(sig, group):
        sig = sig | task.app.tasks["celery.accumulate"].s(index=0)
    if isinstance(sig, chain_class) and isinstance(sig.tasks[-1], group):
        sig.tasks = list(sig.tasks)
        sig.tasks[-1] = sig.tasks[-1] | task.app.tasks["celery.accumulate"].s(index=0)
    # Callbacks and the chain's rest are rows waiting on this job (handed over in the
    # database); errbacks are the job's own row's, so they go with the signature.
    for errback in _listed(request.errbacks):
        sig.link_error(maybe_signature(errback, app=task.app))
    sig.freeze(request.id)
    nesting = int(request.get("replaced_task_nesting", 0) or 0) + 1
    sig.set(group_id=request.group, group_index=request.group_index,
            root_id=request.root_id, replaced_task_nesting=nesting)
    if isinstance(sig, chain_class):
        for step in sig.tasks:
            step.set(replaced_task_nesting=nesting)
    return sig


def _listed(value: Any) -> list[Any]:
    if value is None:
        return []
    return list(value) if isinstance(value, (list, tuple)) else [value]


def send_replacement(task: Task, sig: Signature) -> None:
    """Insert ``sig`` (prepared), hand this job's waiting rows over to its last job and end
    this job, in one transaction; then raise ``Ignore`` as Celery does."""
    try:
        context = current()
    except LookupError:
        # Not in an akadze worker run (a task body called directly): Celery's send.
        sig.delay()
        raise Ignore("Replaced by new task") from None
    with context.complete_tx() as connection:
        builder = Builder(task.app, connection)
        planned = sig.to_flow(builder, (), {}, after=[], many=False, failure="cancel",
                              options={})
        builder.enqueue()
        last = planned.result
        context.hand_over(connection, int(last.job_id))
    raise Ignore("Replaced by new task")
