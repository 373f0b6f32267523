"""``celery.worker.request``: the worker's per-message ``Request`` (not provided).

A task's request is ``self.request`` (``akadze_compat.app.task.Context``), built from the job;
there is no message object to subclass (``Task.Request = "proj.MyRequest"``).
"""

from __future__ import annotations

from ..utils.unsupported import not_provided

__all__: list[str] = []

__getattr__ = not_provided(__name__, {
    "Request": ("the worker runs jobs, not messages: use self.request in the task, the "
                "Task handlers (on_failure, on_retry, after_return) and the signals where a "
                "Request subclass hooked in", "signals"),
})
