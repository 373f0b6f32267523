"""Process-wide state: the current app, every app, shared tasks, the task being run, and
lazy proxies (Celery's ``celery._state``).

Celery keeps the current app per thread; here it is per process, because akadze workers run
tasks in a thread pool and those threads must see the app the project created. The task
being run is per context (a context variable): async bodies and the worker's threads each see
their own. This module is at the bottom of the package and imports none of it: the app
registers how a default app is made (``set_default_app_factory``).
"""

from __future__ import annotations

import contextvars
import threading
import weakref
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .app.base import Celery
    from .app.context import Context
    from .app.task import Task

__all__ = ["connect_on_app_finalize", "current_app", "current_task", "get_current_app",
           "get_current_task", "get_current_worker_request", "get_current_worker_task",
           "set_default_app"]

_lock = threading.RLock()
_apps: weakref.WeakSet[Celery] = weakref.WeakSet()
_current_app: Celery | None = None
_default_app: Celery | None = None
#: Callbacks run for every app once it is finalized (shared tasks register this way).
_on_finalize: list[Callable[[Celery], Any]] = []
#: Makes the default app when none was made (``akadze_compat.app.base`` sets it).
_default_app_factory: Callable[[], Celery] | None = None

#: The request of the task a worker is running in this context (not set for eager runs).
worker_request: contextvars.ContextVar[tuple[Task, Context] | None] = \
    contextvars.ContextVar("akadze_compat_worker_request", default=None)
#: The tasks being traced in this context, innermost last (eager runs included).
task_stack: contextvars.ContextVar[tuple[Task, ...]] = \
    contextvars.ContextVar("akadze_compat_task_stack", default=())


def register_app(app: Celery) -> None:
    """Remember ``app`` (shared tasks are added to every app)."""
    with _lock:
        _apps.add(app)


def unregister_app(app: Celery) -> None:
    """Forget ``app`` (``app.close()``)."""
    with _lock:
        _apps.discard(app)


def all_apps() -> list[Celery]:
    """Every live app."""
    with _lock:
        return list(_apps)


def set_current_app(app: Celery) -> None:
    """Make ``app`` the current app."""
    global _current_app
    _current_app = app


def set_default_app(app: Celery) -> None:
    """Make ``app`` the default app (the current one when none was set)."""
    global _default_app
    _default_app = app


def get_current_app() -> Celery:
    """The current app; a default app named "default" is created when there is none."""
    global _default_app
    app = _current_app or _default_app
    if app is not None:
        return app
    with _lock:
        if _default_app is None:
            if _default_app_factory is None:
                raise RuntimeError("no Celery app: import akadze_compat first")
            _default_app = _default_app_factory()
        return _default_app


def set_default_app_factory(factory: Callable[[], Celery]) -> None:
    """How ``get_current_app`` makes the default app (``Celery("default")``) when the
    project made none: registered by ``akadze_compat.app.base``, which this module does not
    import (it is the bottom layer)."""
    global _default_app_factory
    _default_app_factory = factory


def get_current_worker_request() -> Context | None:
    """The request of the task this worker is running here, or None."""
    current = worker_request.get()
    return current[1] if current else None


def get_current_worker_task() -> Task | None:
    """The task this worker is running here, or None (Celery's ``get_current_worker_task``)."""
    current = worker_request.get()
    return current[0] if current else None


def get_current_task() -> Task | None:
    """The task being run here, by a worker or eagerly (Celery's ``get_current_task``)."""
    stack = task_stack.get()
    return stack[-1] if stack else None


def connect_on_app_finalize(callback: Callable[[Celery], Any]) -> Callable[[Celery], Any]:
    """Run ``callback(app)`` for every app when it is finalized (now, for finalized ones)."""
    with _lock:
        _on_finalize.append(callback)
        finalized = [app for app in _apps if app.finalized]
    for app in finalized:
        callback(app)
    return callback


def finalize_callbacks() -> list[Callable[[Celery], Any]]:
    """The callbacks registered with ``connect_on_app_finalize``."""
    with _lock:
        return list(_on_finalize)


class Proxy:
    """An object that stands for ``factory()``, evaluated at every use (Celery's Proxy).

    ``isinstance`` and the signal machinery (``_get_current_object``) see the real object.
    """

    __slots__ = ("__factory", "__name")

    def __init__(self, factory: Callable[[], Any], name: str | None = None) -> None:
        object.__setattr__(self, "_Proxy__factory", factory)
        object.__setattr__(self, "_Proxy__name", name)

    def _get_current_object(self) -> Any:
        """The object this proxy stands for, now."""
        return self.__factory()

    @property  # type: ignore[misc]
    def __class__(self) -> type:
        return type(self._get_current_object())

    def __getattr__(self, name: str) -> Any:
        return getattr(self._get_current_object(), name)

    def __setattr__(self, name: str, value: Any) -> None:
        setattr(self._get_current_object(), name, value)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self._get_current_object()(*args, **kwargs)

    def __repr__(self) -> str:
        try:
            return repr(self._get_current_object())
        except Exception:
            return f"<Proxy unbound {self.__name or ''}>"

    def __eq__(self, other: object) -> bool:
        return bool(self._get_current_object() == other)

    def __hash__(self) -> int:
        return hash(self._get_current_object())

    def __bool__(self) -> bool:
        return bool(self._get_current_object())


#: The current app, looked up at every use (``from akadze_compat import current_app``).
current_app: Any = Proxy(get_current_app, "current_app")
#: The task being run here (by a worker or eagerly), or a proxy of None.
current_task: Any = Proxy(get_current_task, "current_task")
