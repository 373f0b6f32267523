"""The tasks every app has (Celery's ``celery.app.builtins``): ``celery.map`` and
``celery.starmap``, which ``task.map(it)``, ``task.starmap(it)`` and ``task.chunks(it, n)``
send: one task calling another task's body for each item, in order, in the worker."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .. import _state
from ..canvas import maybe_signature

if TYPE_CHECKING:
    from .base import Celery

__all__ = ["BUILTIN_TASKS", "add_map_tasks"]

#: The names of the tasks every app has (not the project's: the doctor leaves them out).
BUILTIN_TASKS = frozenset({"celery.map", "celery.starmap", "celery.accumulate"})


@_state.connect_on_app_finalize
def add_map_tasks(app: Celery) -> None:
    """Register ``celery.map`` and ``celery.starmap`` on ``app``."""

    @app.task(name="celery.map", shared=False, lazy=False)
    def xmap(task: Any, it: Any) -> list[Any]:
        body = maybe_signature(task, app=app).type
        return [body(item) for item in it]

    @app.task(name="celery.starmap", shared=False, lazy=False)
    def xstarmap(task: Any, it: Any) -> list[Any]:
        body = maybe_signature(task, app=app).type
        return [body(*item) for item in it]


@_state.connect_on_app_finalize
def add_accumulate_task(app: Celery) -> None:
    """Register ``celery.accumulate`` on ``app``: the body ``Task.replace`` gives a group
    (it returns the header's list of results, ``index=0``), as Celery's."""

    @app.task(name="celery.accumulate", shared=False, lazy=False)
    def accumulate(*args: Any, **kwargs: Any) -> Any:
        index = kwargs.get("index")
        return args[index] if index is not None else args
