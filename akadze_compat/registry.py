"""``celery.registry``: Celery's old module name for the current app's task registry.

Celery still answers ``from celery import registry; registry.tasks`` with the current app's
``tasks``; tracing add-ons look tasks up by name this way.
"""

from __future__ import annotations

from typing import Any

from ._state import get_current_app

__all__: list[str] = []  # ``tasks`` is looked up at each access (module __getattr__)


def __getattr__(name: str) -> Any:
    # Looked up at each access, as Celery's: the current app may change.
    if name == "tasks":
        return get_current_app().tasks
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
