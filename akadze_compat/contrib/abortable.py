"""``celery.contrib.abortable``: tasks that can be asked to stop, on akadze_core's cancel flag.

As in Celery, a running task asked to stop (``AbortableAsyncResult(id).abort()``) reads
ABORTED and ``self.is_aborted()`` becomes true in its body, which should check it now and
then and return early; what it returns then ends it SUCCESS, as in Celery.

Where akadze differs (``abort()`` is the job's cancel request, what ``revoke`` does, so
every worker and ``akadze jobs show`` see it):

- a task aborted before it starts never runs and ends REVOKED (Celery would still run it,
  its ``is_aborted()`` true from the start);
- a body that raises after the abort ends REVOKED, its attempt unspent (Celery: FAILURE);
- ``revoke()`` of an abortable task is seen by ``is_aborted()`` too.

``is_aborted()`` is true while the task is ABORTED (asked to stop, not ended) and after it
ended REVOKED by the request; false once it ended otherwise (SUCCESS, FAILURE), as Celery's
``state == ABORTED`` then is. Each call is one query, as in Celery (one backend read): call
it every few seconds of work, not in a tight loop.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..app.task import Task
from ..result import AsyncResult, EagerResult

if TYPE_CHECKING:
    from akadze_core import Job

__all__ = ["ABORTED", "AbortableAsyncResult", "AbortableTask"]

#: Celery's state of a task asked to stop that has not ended yet.
ABORTED = "ABORTED"
# The job states in which an abort shows as ABORTED (it has not ended).
_ACTIVE = frozenset({"waiting", "queued", "running"})


class AbortableAsyncResult(AsyncResult):
    """An ``AsyncResult`` with ``abort()`` and ``is_aborted()``; its state is ABORTED while
    the task runs after an abort."""

    def _meta(self) -> tuple[Job | None, str]:
        job, state = super()._meta()
        if job is not None and job.cancel_requested and job.state in _ACTIVE:
            return job, ABORTED
        return job, state

    def is_aborted(self) -> bool:
        """Whether the task was asked to stop: its state is ABORTED (it has not ended), or
        REVOKED by that request. False once it ended otherwise (SUCCESS...), as Celery's
        ``state == ABORTED`` is. Reads the database (only finished jobs are cached)."""
        job, state = self._meta()
        return state == ABORTED or bool(job is not None and job.cancel_requested
                                        and job.state == "cancelled")

    def abort(self) -> None:
        """Ask the task to stop: a running one reads ``is_aborted()`` true (and ABORTED
        until it ends); one that has not started never runs (REVOKED). Nothing happens to a
        task that has ended, or to an unknown id."""
        self.app.control.revoke(self.id)


class AbortableTask(Task):
    """A task that checks ``self.is_aborted()`` now and then to stop early."""

    abstract = True

    def apply_async(self, *args: Any, **kwargs: Any) -> Any:
        """``Task.apply_async``, returning an ``AbortableAsyncResult`` (an ``EagerResult``
        when eager), as Celery's ``delay()`` of an abortable task does."""
        sent = super().apply_async(*args, **kwargs)
        if not isinstance(sent, AsyncResult) or isinstance(sent, EagerResult):
            return sent
        result = self.AsyncResult(sent.id)
        result.ignored = sent.ignored
        return result

    def AsyncResult(self, task_id: str, **kwargs: Any) -> AbortableAsyncResult:
        """The result of the call with ``task_id``, abortable."""
        return AbortableAsyncResult(task_id, task_name=self.name, app=self.app)

    def is_aborted(self, **kwargs: Any) -> bool:
        """Whether this call (or the one of ``task_id=``, any task's) was asked to stop and
        has not ended. False for an eager call (it has no job to abort)."""
        task_id = kwargs.get("task_id", self.request.id)
        if task_id is None:
            return False
        result = self.AsyncResult(str(task_id))
        if not isinstance(result, AbortableAsyncResult):
            return False
        return result.is_aborted()
