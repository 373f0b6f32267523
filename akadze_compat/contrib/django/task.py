"""``celery.contrib.django.task``: ``DjangoTask``, Celery's task base with ``delay_on_commit``.

Every akadze_compat task has ``delay_on_commit`` and ``apply_async_on_commit`` already (see
migration_guide/django.md), so ``DjangoTask`` is the plain ``Task``, kept for the projects
that name it (``Celery(task_cls="celery.contrib.django.task:DjangoTask")``).
"""

from __future__ import annotations

from ...app.task import Task

__all__ = ["DjangoTask"]


class DjangoTask(Task):
    """Celery's ``DjangoTask``: a ``Task`` (``delay_on_commit`` is on every task here)."""

    abstract = True
