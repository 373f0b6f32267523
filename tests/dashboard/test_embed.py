"""The dashboard mounted in a parent ASGI app under a prefix, with the parent's own
authentication (as a FastAPI or Django project mounts it; migration_guide/django.md)."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import PlainTextResponse
from starlette.routing import Mount, Route

from akadze_core import App
from akadze_core.dashboard import create_app
from tests.dashboard.support import Client, free_port

pytestmark = pytest.mark.slow


class ParentAuth:
    """The parent's authentication: sets ``scope["user"]`` (here from a header; a real
    project reads its session), as Starlette's AuthenticationMiddleware does."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "http":
            headers = dict(scope["headers"])
            scope["user"] = headers.get(b"x-user", b"").decode() or None
        await self.app(scope, receive, send)


@pytest.fixture
def parent(database_url: str) -> Iterator[str]:
    """A parent app with its own route and the dashboard at /ops/akadze, served by uvicorn
    in a thread; yields its base URL."""
    app = App(database_url)
    dashboard = create_app(app, authorize=lambda request: request.scope.get("user") == "alice")

    async def home(request: Request) -> PlainTextResponse:
        return PlainTextResponse("the parent's own page")

    web = ParentAuth(Starlette(routes=[Route("/", home), Mount("/ops/akadze", app=dashboard)]))
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(web, host="127.0.0.1", port=port, log_config=None,
                                           lifespan="off"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 20
    while not server.started:
        assert time.monotonic() < deadline and thread.is_alive(), "uvicorn did not start"
        time.sleep(0.05)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(10)
        dashboard.state.dashboard.close()
        app.close()


def test_mounted_under_a_prefix_with_the_parents_auth(
        parent: str, db: psycopg.Connection, tmp_path: Path) -> None:
    db.execute("INSERT INTO akadze.jobs (task, queue) SELECT 'noop', 'mounted' "
               "FROM generate_series(1, 3)")
    assert Client().get(parent + "/").text == "the parent's own page"
    assert Client().get(parent + "/ops/akadze/").status == 403
    assert Client({"X-User": "mallory"}).get(parent + "/ops/akadze/jobs").status == 403
    client = Client({"X-User": "alice"})
    page = client.get(parent + "/ops/akadze/")
    assert page.status == 200
    for link in ('href="/ops/akadze/jobs"', 'href="/ops/akadze/workers"',
                 'action="/ops/akadze/queues/purge"', 'href="/ops/akadze/jobs?queue=mounted"'):
        assert link in page.text, link
    assert "Set-Cookie" in page.headers or client.csrf()
    assert "Path=/ops/akadze" in page.headers.get("set-cookie", "")
    done = client.post(parent + "/ops/akadze/queues/purge",
                       {"csrf": client.csrf(), "queue": "mounted", "next": "/ops/akadze/"})
    assert done.status == 200 and "3 queued jobs deleted" in done.text
    assert done.url.startswith(parent + "/ops/akadze/?")
    assert db.execute("SELECT count(*) FROM akadze.jobs WHERE queue = 'mounted'"
                      ).fetchone()[0] == 0
    jobs = client.get(parent + "/ops/akadze/jobs")
    assert jobs.status == 200 and 'action="/ops/akadze/jobs"' in jobs.text
