"""The task registry (``app.tasks``, Celery's ``celery.app.registry``), and how tasks are made
and registered: ``@app.task`` (``task_from_fun``), class-based tasks (``register_task``),
``@shared_task`` and the default task name (``gen_task_name``)."""

from __future__ import annotations

import os
import sys
import warnings
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from .. import _state
from ..exceptions import DuplicateTaskNameWarning, NotRegistered
from .autoretry import add_autoretry_behaviour
from .task import Task
from .validation import pydantic_wrapper

if TYPE_CHECKING:
    from .base import Celery

__all__ = ["TaskRegistry", "gen_task_name", "register_task", "shared_task", "task_from_fun"]


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


def gen_task_name(app: Celery, name: str, module_name: str | None) -> str:
    """Celery's default task name: ``module.name``; ``main.name`` for ``__main__``."""
    module_name = module_name or "__main__"
    module = sys.modules.get(module_name)
    if module is not None:
        module_name = module.__name__
        main_file = os.environ.get("MP_MAIN_FILE")
        if main_file and getattr(module, "__file__", None) == main_file:
            module_name = "__main__"
    if module_name == "__main__" and app.main:
        return f"{app.main}.{name}"
    return ".".join(part for part in (module_name, name) if part)


def task_from_fun(app: Celery, fun: Callable[..., Any], name: str | None = None,
                  base: type[Task] | None = None, bind: bool = False,
                  **options: Any) -> Task:
    """The task ``@app.task`` makes of ``fun``: an instance of a new subclass of ``base``
    whose ``run`` is ``fun``, options as class attributes. A name taken already keeps its
    first task (with a warning when the function differs)."""
    if not app.finalized and not app.autofinalize:
        raise RuntimeError("Contract breach: app not finalized")
    name = name or app.gen_task_name(fun.__name__, fun.__module__)
    existing = app.registry.get(name)
    if existing is not None:
        if getattr(existing, "_decorated_fun", fun) is not fun:
            warnings.warn(DuplicateTaskNameWarning(
                f"task {name!r} is already registered with another function; "
                "the first one is kept"), stacklevel=4)
        return existing
    base = base or app.Task
    use_pydantic = options.pop("pydantic", False)
    strict = options.pop("pydantic_strict", False)
    context = options.pop("pydantic_context", None)
    dump_kwargs = options.pop("pydantic_dump_kwargs", None)
    original = fun  # what a second registration of the same function is compared with
    if use_pydantic is True:
        fun = pydantic_wrapper(app, fun, name, strict, context, dump_kwargs)
    attributes = {
        "_app": app, "name": name, "run": fun if bind else staticmethod(fun),
        "_decorated": True, "_decorated_fun": staticmethod(original), "__doc__": fun.__doc__,
        "__module__": fun.__module__, "__wrapped__": fun, **options,
    }
    task = type(fun.__name__, (base,), attributes)()
    task.__qualname__ = getattr(fun, "__qualname__", fun.__name__)
    app.registry[name] = task
    if app.finalized:
        type(task).bind(app)
    add_autoretry_behaviour(task, **options)
    app.register_core_task(task)
    return task


def register_task(app: Celery, task: Task | type[Task], **options: Any) -> Task:
    """Register a class-based task (an instance or the class) on ``app``."""
    instance = task() if isinstance(task, type) else task
    if not instance.name:
        cls = type(instance)
        class_name: str = type.__getattribute__(cls, "__name__")  # not Task.__name__
        instance.name = app.gen_task_name(class_name, cls.__module__)
    type(instance).attach_app(app)
    add_autoretry_behaviour(instance, **options)
    app.registry[str(instance.name)] = instance
    if app.finalized:
        type(instance).bind(app)
    app.register_core_task(instance)
    return instance


def shared_task(*args: Any, **options: Any) -> Any:
    """A task for every app (``@shared_task``): used through the current app.

    Returns a proxy to the current app's copy of the task, as Celery does.
    """

    def create(fun: Callable[..., Any]) -> Any:
        if isinstance(fun, _state.Proxy):
            raise TypeError("@shared_task was applied more than once to the same function. "
                            "Remove the extra @shared_task decorator.")
        name = options.get("name")
        _state.connect_on_app_finalize(lambda app: task_from_fun(app, fun, **options))

        def current_copy() -> Task:
            app = _state.get_current_app()
            return app.tasks[name or app.gen_task_name(fun.__name__, fun.__module__)]

        return _state.Proxy(current_copy, name or fun.__name__)

    if len(args) == 1 and callable(args[0]):
        return create(args[0])
    return create
