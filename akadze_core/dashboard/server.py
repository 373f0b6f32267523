"""Serving the dashboard on its own: ``akadze dashboard`` and ``akadze-compat flower``.

The command-line options of both are parsed here, so the two stay alike: the address
(127.0.0.1 unless told otherwise), the port, ``--basic-auth user:pass[,user2:pass2]``,
tokens, ``--read-only`` and ``--url-prefix``.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import RedirectResponse, Response
from starlette.routing import Mount, Route

from .web import DashboardConfig, create_app

if TYPE_CHECKING:
    from ..app import App

logger = logging.getLogger("akadze.dashboard")


def parse_basic_auth(value: str | None) -> dict[str, str]:
    """``user:pass[,user2:pass2]`` (Flower's ``--basic-auth``) as user -> password.

    Raises ``ValueError`` naming the malformed entry (without its password).
    """
    users: dict[str, str] = {}
    for entry in (value or "").split(","):
        if not entry.strip():
            continue
        user, colon, password = entry.partition(":")
        if not colon or not user.strip() or not password:
            raise ValueError(f"--basic-auth entries are user:password (got one for user "
                             f"{user.strip()!r} without a password or a user)")
        users[user.strip()] = password
    return users


def normalize_prefix(prefix: str | None) -> str:
    """``flower`` or ``/flower/`` -> ``/flower``; empty -> ``""``."""
    text = (prefix or "").strip().strip("/")
    return f"/{text}" if text else ""


def server_app(app: App, config: DashboardConfig, url_prefix: str = "") -> Starlette:
    """The dashboard under ``url_prefix`` (``/`` redirects there), closing its pool at
    shutdown."""
    dashboard = create_app(app, config=config)
    prefix = normalize_prefix(url_prefix)

    @contextlib.asynccontextmanager
    async def lifespan(_: Starlette) -> AsyncIterator[None]:
        try:
            yield
        finally:
            dashboard.state.dashboard.close()

    if not prefix:
        dashboard.router.lifespan_context = lifespan
        return dashboard

    async def to_prefix(request: Request) -> Response:
        return RedirectResponse(f"{prefix}/", status_code=307)

    outer = Starlette(routes=[Route("/", to_prefix), Route(prefix, to_prefix),
                              Mount(prefix, app=dashboard)], lifespan=lifespan)
    outer.state.dashboard = dashboard.state.dashboard
    return outer


def serve(app: App, config: DashboardConfig, *, host: str, port: int,
          url_prefix: str = "", log_level: str = "info") -> None:
    """Run the dashboard with uvicorn until SIGINT or SIGTERM.

    Logging goes through the root logger (the CLI's scrubbing formatter): uvicorn's own
    configuration is not installed.
    """
    import uvicorn

    web = server_app(app, config, url_prefix)
    settings: dict[str, Any] = {"host": host, "port": port, "log_config": None,
                                "log_level": log_level.lower(), "lifespan": "on",
                                "server_header": False, "proxy_headers": False}
    shown = host if ":" not in host else f"[{host}]"
    where = f"http://{shown}:{port}{normalize_prefix(url_prefix)}/"
    mode = "read-only" if config.read_only else (
        "actions need credentials" if config.has_credentials else
        "no credentials: actions off")
    logger.info("akadze dashboard on %s (%s)", where, mode)
    uvicorn.run(web, **settings)
