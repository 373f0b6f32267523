"""``celery.contrib.abortable``: tasks that can be asked to stop, on akadze_core's cancel flag.

``AbortableAsyncResult(id).abort()`` requests the job's cancellation (what ``revoke`` does):
a task still queued never runs, and a running one sees ``self.is_aborted()`` become true (it
reads the job's ``cancel_requested`` flag from the database) and may stop early. As with
``revoke``, a body that returns ends SUCCESS and one that raises ends REVOKED.
"""

from __future__ import annotations

from typing import Any

from ..app.task import Task
from ..backends.base import lookup_job
from ..result import AsyncResult, EagerResult

__all__ = ["ABORTED", "AbortableAsyncResult", "AbortableTask"]

#: Celery's state name for an aborted task (here it is never stored: see the module doc).
ABORTED = "ABORTED"


class AbortableAsyncResult(AsyncResult):
    """An ``AsyncResult`` with ``abort()`` and ``is_aborted()``."""

    def is_aborted(self) -> bool:
        """Whether the task was asked to stop (its job's cancel was requested)."""
        job = lookup_job(self.app.core, self.id)
        return bool(job is not None and job.cancel_requested)

    def abort(self) -> None:
        """Ask the task to stop: a queued one never runs, a running one sees
        ``is_aborted()``."""
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
        """Whether this call (or the one of ``task_id=``) was asked to stop."""
        task_id = kwargs.get("task_id", self.request.id)
        return self.AsyncResult(str(task_id)).is_aborted()
