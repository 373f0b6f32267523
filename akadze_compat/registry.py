"""The task registry (``app.tasks``), Celery's ``celery.app.registry``."""

from __future__ import annotations

from .exceptions import NotRegistered
from .task import Task

__all__ = ["TaskRegistry"]


class TaskRegistry(dict[str, Task]):
    """Task name -> task (``app.tasks``); a missing name raises ``NotRegistered``."""

    def __missing__(self, key: str) -> Task:
        raise NotRegistered(key)

    def register(self, task: Task) -> None:
        """Add a task instance under its name."""
        self[str(task.name)] = task

    def unregister(self, name: str | Task) -> None:
        """Remove a task (by name or instance)."""
        self.pop(name if isinstance(name, str) else str(name.name))

    def regular(self) -> dict[str, Task]:
        """Every task (there are no periodic task classes here)."""
        return dict(self)
