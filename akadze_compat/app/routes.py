"""Task routing: which queue a task goes to (Celery's ``task_routes``), as pure functions.

``task_routes`` may be a dict (exact names, ``"feed.tasks.*"`` globs, ``re.compile(...)``
patterns), a router function ``route(name, args, kwargs, options, task=None, **kw)``, a
``"pkg.module:func"`` / ``"pkg.module.func"`` string naming one, or a list/tuple of those:
the first router that answers wins. A route is a queue name or a dict of options
(``{"queue": "feeds", "priority": 3}``). An explicit ``queue=`` (on the call or the task)
beats every route; with no queue at all the task goes to ``task_default_queue``.

Queues exist in Postgres as soon as a job names them, so the only queue check is Celery's
``task_create_missing_queues=False``: then a queue not declared in ``task_queues`` (or, with
no ``task_queues``, other than the default queue) raises ``QueueNotFound``.

Sending uses ``settings_router(conf)``: the router is built from ``task_routes``,
``task_queues``, ``task_default_queue`` and ``task_create_missing_queues`` at first use and
kept until a setting changes through ``conf`` (``conf.task_routes = ...``, ``conf.update()``,
``config_from_object()``...). Celery builds its router once, at first use, and never again;
here any change made through ``conf`` is still honoured. What neither sees is a change made
inside a live configuration source after the first send (a settings module's attribute
reassigned, or Django's ``override_settings(CELERY_TASK_ROUTES=...)``).
"""

from __future__ import annotations

import fnmatch
import re
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from ..exceptions import QueueNotFound
from .config import Settings, import_object

__all__ = ["MapRoute", "Router", "prepare", "queue_name", "queue_names", "settings_router",
           "settings_router_state"]

RouterFunction = Callable[..., Any]


def queue_name(queue: Any) -> str:
    """The name of a queue given as a string or a kombu ``Queue``."""
    return queue if isinstance(queue, str) else str(queue.name)


def queue_names(task_queues: Any) -> list[str]:
    """The names declared by ``task_queues``: kombu Queues, names, or ``{name: options}``."""
    if not task_queues:
        return []
    if isinstance(task_queues, Mapping):
        return [str(name) for name in task_queues]
    return [queue_name(queue) for queue in task_queues]


def _as_route(route: Any) -> dict[str, Any]:
    """A route value as a dict: a queue name (or kombu Queue) becomes ``{"queue": ...}``."""
    if isinstance(route, Mapping):
        return dict(route)
    try:
        return dict(route)
    except (TypeError, ValueError):
        return {"queue": route}


class MapRoute:
    """A router made of a mapping (or pairs): exact names first, then patterns in order.

    A key containing ``*`` is a glob matched against the whole name; a compiled regex is
    matched from the start of the name (``re.match``), as in Celery.
    """

    def __init__(self, mapping: Mapping[Any, Any] | Iterable[tuple[Any, Any]]) -> None:
        pairs = mapping.items() if isinstance(mapping, Mapping) else mapping
        self.exact: dict[str, Any] = {}
        self.patterns: list[tuple[re.Pattern[str], Any]] = []
        for key, route in pairs:
            if isinstance(key, re.Pattern):
                self.patterns.append((key, route))
            elif "*" in key:
                self.patterns.append((re.compile(fnmatch.translate(key)), route))
            else:
                self.exact[key] = route

    def __call__(self, name: str, *args: Any, **kwargs: Any) -> dict[str, Any] | None:
        if name in self.exact:
            return _as_route(self.exact[name])
        for pattern, route in self.patterns:
            if pattern.match(name):
                return _as_route(route)
        return None

    def __repr__(self) -> str:
        return f"MapRoute(exact={list(self.exact)}, patterns={len(self.patterns)})"


class _NamedRouter:
    """A router given by its import path, imported at its first use (Celery's is lazy too)."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._router: RouterFunction | None = None

    def resolve(self) -> RouterFunction:
        """The router, imported on first use."""
        if self._router is None:
            router = import_object(self.path)
            if isinstance(router, type) and hasattr(router, "route_for_task"):
                router = router()  # a pre-4.0 router class
            self._router = router
        return self._router

    def __repr__(self) -> str:
        return f"<router {self.path}>"


def prepare(routes: Any) -> list[Any]:
    """Turn the ``task_routes`` setting into a list of routers."""
    if routes is None:
        return []
    if not isinstance(routes, (list, tuple)):
        routes = (routes,)
    prepared: list[Any] = []
    for route in routes:
        if isinstance(route, (Mapping, list, tuple)):
            prepared.append(MapRoute(route))
        elif isinstance(route, str):
            prepared.append(_NamedRouter(route))
        else:
            prepared.append(route)
    return prepared


def _ask(router: Any, name: str, args: Any, kwargs: Any, options: dict[str, Any],
         task: Any) -> Any:
    if isinstance(router, _NamedRouter):
        router = router.resolve()
    if hasattr(router, "route_for_task"):
        return router.route_for_task(name, args, kwargs)
    return router(name, args, kwargs, options, task=task)


class Router:
    """Routes task calls to queues.

    ``routes`` is the prepared ``task_routes`` (see ``prepare``); ``queues`` the declared
    queue names (``task_queues``); with ``create_missing`` False, any other queue is an error.
    """

    def __init__(
        self,
        routes: list[Any] | None = None,
        queues: Iterable[str] | None = None,
        default_queue: str = "celery",
        create_missing: bool = True,
    ) -> None:
        self.routes = routes or []
        self.queues = list(queues or [])
        self.default_queue = default_queue
        self.create_missing = create_missing

    def lookup_route(self, name: str, args: Any = None, kwargs: Any = None,
                     options: dict[str, Any] | None = None, task: Any = None) -> Any:
        """The first route a router returns for this call, or None."""
        for router in self.routes:
            route = _ask(router, name, args, kwargs, options or {}, task)
            if route is not None:
                return route
        return None

    def _expand(self, route: Any) -> dict[str, Any]:
        """A route as options with ``queue`` as a checked queue name (if it has one)."""
        options = {"queue": route} if isinstance(route, str) else dict(route)
        queue = options.pop("queue", None)
        if queue:
            if not isinstance(queue, str):
                options["queue"] = queue_name(queue)  # a kombu Queue is taken as declared
            else:
                options["queue"] = self._check(queue)
        return options

    def _check(self, queue: str) -> str:
        known = self.queues or [self.default_queue]
        if self.create_missing or queue in known:
            return queue
        raise QueueNotFound(f"Queue {queue!r} missing from task_queues")

    def route(self, options: Mapping[str, Any], name: str, args: Any = (),
              kwargs: Any = None, task: Any = None) -> dict[str, Any]:
        """The call's options with ``queue`` decided: explicit options beat the route, which
        beats ``default_queue``. Raises ``QueueNotFound`` for an undeclared queue when
        missing queues are not created."""
        options = self._expand(options)
        if self.routes:
            route = self.lookup_route(name, args, kwargs or {}, options, task)
            if route:
                merged = self._expand(route)
                merged.update((key, value) for key, value in options.items()
                              if value is not None)
                options = merged
        if not options.get("queue"):
            options["queue"] = self._check(self.default_queue)
        return options


def _build_router(conf: Settings, previous: tuple[Any, Router, bool] | None) \
        -> tuple[Any, Router, bool]:
    routes = conf["task_routes"]
    # The same task_routes object keeps its prepared routers: a named router is imported
    # (and a router class instantiated) once, not again after an unrelated setting changed.
    prepared = previous[1].routes if previous is not None and previous[0] is routes \
        else prepare(routes)
    router = Router(prepared, queue_names(conf["task_queues"]),
                    conf["task_default_queue"] or "celery",
                    bool(conf["task_create_missing_queues"]))
    # Only mappings: the answer depends on the task name and options, never on the call's
    # arguments, so it may be reused for every call with the same name and options.
    static = all(type(route) is MapRoute for route in router.routes)
    return routes, router, static


def settings_router_state(conf: Settings) -> tuple[Router, bool]:
    """``settings_router(conf)``, and whether its routes are all mappings (``static``)."""
    _, router, static = conf.derived("akadze_compat.routing.router", _build_router)
    return router, static


def settings_router(conf: Settings) -> Router:
    """The router for ``conf``, built at first use and kept until a setting changes through
    ``conf`` (see the module docstring). Treat it as read-only: it is shared."""
    return settings_router_state(conf)[0]
