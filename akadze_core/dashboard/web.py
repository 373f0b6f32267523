"""The dashboard's ASGI app (Starlette, Jinja2 templates): pages, actions, authentication.

Safe by default: every value is escaped by Jinja2's autoescape (args, results and
tracebacks are user data), no page runs a script (the Content-Security-Policy forbids
them), actions need credentials and a CSRF token, and ``read_only`` removes them. The
database work runs in Starlette's thread pool on a small pool of its own, apart from the
app's: the dashboard never takes a connection an enqueue or a worker would want.

The pieces live beside this module: ``auth`` (sessions, the login throttle, the body
limit, cookie names and security headers), ``state`` (``DashboardConfig`` and
``Dashboard``: the pool, the authentication and CSRF checks, rendering) and ``pages``
(the request handlers). ``create_app`` puts them together; the names are importable from
here as well.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.routing import BaseRoute, Route

from .auth import CSRF_COOKIE as CSRF_COOKIE
from .auth import HOST_PREFIX as HOST_PREFIX
from .auth import MAX_BODY as MAX_BODY
from .auth import SECURITY_HEADERS as SECURITY_HEADERS
from .auth import SESSION_COOKIE as SESSION_COOKIE
from .auth import BodyLimit as BodyLimit
from .auth import Caller as Caller
from .auth import LoginThrottle as LoginThrottle
from .auth import Sessions as Sessions
from .pages import FOLLOW_REFRESH as FOLLOW_REFRESH
from .pages import Handler as Handler
from .pages import Pages as Pages
from .state import NOTICES as NOTICES
from .state import Dashboard as Dashboard
from .state import DashboardConfig as DashboardConfig
from .state import base_path as base_path

if TYPE_CHECKING:
    from ..app import App


def create_app(app: App | None = None, *, database_url: str | None = None,
               config: DashboardConfig | None = None, **options: Any) -> Starlette:
    """The dashboard as an ASGI app, to serve (``akadze dashboard``) or to mount in a
    Starlette, FastAPI or Django (ASGI) project under any prefix.

    ``app``: the akadze App whose database (and code schedules) to show; else one on
    ``database_url`` (or the environment's). ``config`` or its fields as keywords
    (``read_only=True``, ``basic_auth={...}``, ``tokens=[...]``, ``authorize=...``).
    The returned app has ``state.dashboard`` (its ``Dashboard``; ``close()`` releases
    its connections).
    """
    from ..app import App

    if app is None:
        app = App(database_url)
    elif database_url is not None:
        raise TypeError("give app or database_url, not both")
    if config is None:
        config = DashboardConfig(**options)
    elif options:
        raise TypeError("give config or its fields as keywords, not both")
    dashboard = Dashboard(app, config)
    pages = Pages(dashboard)
    routes: list[BaseRoute] = [
        Route("/", pages.overview, name="overview"),
        Route("/jobs", pages.jobs, name="jobs"),
        Route("/jobs/bulk", pages.bulk, methods=["POST"], name="bulk"),
        Route("/jobs/{job_id:int}", pages.job, name="job"),
        Route("/jobs/{job_id:int}/retry", pages.retry, methods=["POST"], name="retry"),
        Route("/jobs/{job_id:int}/cancel", pages.cancel, methods=["POST"], name="cancel"),
        Route("/jobs/{job_id:int}/terminate", pages.terminate, methods=["POST"],
              name="terminate"),
        Route("/workers/{worker_id:int}/control", pages.worker_control, methods=["POST"],
              name="worker_control"),
        Route("/queues/purge", pages.purge, methods=["POST"], name="purge"),
        Route("/queues/pause", pages.pause, methods=["POST"], name="pause"),
        Route("/queues/resume", pages.resume, methods=["POST"], name="resume"),
        Route("/workers", pages.workers, name="workers"),
        Route("/schedules", pages.schedules, name="schedules"),
        Route("/login", pages.login, methods=["GET", "POST"], name="login"),
        Route("/logout", pages.logout, methods=["POST"], name="logout"),
        Route("/metrics", pages.metrics, name="metrics"),
        Route("/healthz", pages.healthz, name="healthz"),
    ]
    routes = [*(route for extend in config.extensions for route in extend(dashboard)),
              *routes]
    # Every route: no body is read past the limit (a login form must not be a way to fill
    # the process's memory before any credential is checked).
    web = Starlette(routes=routes, middleware=[Middleware(BodyLimit, limit=config.max_body)])
    web.state.dashboard = dashboard
    return web


__all__ = ["Dashboard", "DashboardConfig", "create_app"]
