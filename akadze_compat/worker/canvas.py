"""What a worker does for a canvas step: the results it was released with become its
partial arguments, and an errback job calls its task Celery's way.

A chain step gets the previous step's result as its first argument, a chord body the list
of the header's results (``current().job.upstream_results``, written by the database when
it released the job), unless immutable (then none was passed). An errback job (marked in
``meta["celery"]["errback"]``) was inserted when the job in ``current().job.upstreams[0]``
failed: a new-style errback, a function taking more than one positional argument, is
called ``(request, exc, traceback)``; an old-style one runs as a task given the failed
task's id, as Celery's ``_call_task_errbacks`` does.
"""

from __future__ import annotations

import functools
import inspect
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..app.flow import ERRBACK, PASS
from ..backends.base import celery_meta, job_failure
from ..serialization import revive

if TYPE_CHECKING:
    from akadze_core import Job

    from ..app.base import Celery
    from ..app.task import Task

__all__ = ["ErrbackCall", "errback_call", "is_new_style_errback", "new_style_errback",
           "step_args"]


def new_style_errback(task: Task, args: Any = (), kwargs: dict[str, Any] | None = None,
                      immutable: bool = False) -> bool:
    """Whether ``task`` is a new-style errback: Celery's test, a decorated function (not
    ``bind=True``, not a class's ``run``) taking more than one positional argument.

    A mutable signature's stored ``args`` and ``kwargs`` take their parameters first, as in
    Celery 5.7: only the parameters the failure could still fill are counted, so that
    ``on_error(task_id, path=None)`` sent as ``.s(path=...)`` is old style. If they do not
    fit the function, the function alone decides."""
    body = getattr(task, "_orig_run", None) or task.run
    if inspect.ismethod(body):
        return False
    if not immutable and (args or kwargs):
        try:
            return _more_than_one_positional(functools.partial(body, *args, **(kwargs or {})))
        except (TypeError, ValueError):
            pass
    try:
        return _more_than_one_positional(body)
    except TypeError:
        return False


def _more_than_one_positional(fun: Any) -> bool:
    spec = inspect.getfullargspec(fun)
    return spec.varargs is not None or len(spec.args) > 1


def is_new_style_errback(task: Task, meta: dict[str, Any], args: Any = (),
                         kwargs: dict[str, Any] | None = None) -> bool:
    """Whether this run is an errback job to call ``(request, exc, traceback)``; ``args``
    and ``kwargs``: the errback signature's own, as stored on its row."""
    errback = meta.get(ERRBACK)
    return isinstance(errback, dict) and new_style_errback(
        task, args, kwargs, immutable=bool(errback.get("immutable")))


def step_args(task: Task, job: Job, meta: dict[str, Any], args: list[Any],
              kwargs: dict[str, Any] | None = None) -> list[Any]:
    """The args a canvas step runs with: the upstream results first (a chain step, a
    chord body), or the failed task's id (an old-style errback)."""
    errback = meta.get(ERRBACK)
    if isinstance(errback, dict):
        if errback.get("immutable") or is_new_style_errback(task, meta, args, kwargs):
            return args
        return [failed_task_id(job), *args]
    if meta.get(PASS):
        return [revive(job.upstream_results), *args]
    return args


def failed_task_id(job: Job) -> str:
    """The task id of the job whose failure inserted the errback ``job``."""
    parent_id = celery_meta(job).get("parent_id")
    if parent_id:
        return str(parent_id)
    return str(job.upstreams[0]) if job.upstreams else ""


@dataclass(frozen=True)
class ErrbackCall:
    """The ``exc`` and ``traceback`` a new-style errback is called with."""

    exception: Exception
    traceback: str | None


def errback_call(app: Celery, job: Job, failed: Job | None) -> ErrbackCall:
    """The failure the errback ``job`` reports: the failed job's last error entry (which
    the database gave the errback when inserting it), rebuilt as its exception (a failed
    chord body's is ``ChordError``)."""
    entry = job.upstream_results if isinstance(job.upstream_results, dict) else None
    if entry is None and failed is not None and failed.errors:
        entry = failed.errors[-1]
    entry = entry or {"type": "Exception", "message": "unknown failure"}

    def task_id_of(job_id: int) -> str:
        found = app.core.get_job(job_id)
        return app.core.task_id_of(found) if found is not None else str(job_id)

    return ErrbackCall(job_failure(failed, entry, task_id_of), entry.get("traceback"))
