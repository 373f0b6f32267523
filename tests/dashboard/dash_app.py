"""The tasks the dashboard tests run in a real worker: ``tests.dashboard.dash_app:app``."""

from __future__ import annotations

import asyncio
import os
from typing import Any

from akadze_core import App, Every, current


def build_app(url: str | None) -> App:
    """The App with the test tasks (the tests enqueue with it, the worker runs it)."""
    app = App(url)

    @app.task("echo")
    async def echo(payload: Any) -> Any:
        """Record progress in meta, then return ``payload`` (the result shows it back)."""
        await current().update_meta({"progress": {"done": 1, "of": 1, "note": payload}})
        return {"echo": payload}

    @app.task("boom", max_attempts=1)
    async def boom(payload: Any) -> None:
        """Fail with ``payload`` in the message (and so in the traceback)."""
        raise ValueError(f"bad payload {payload}")

    @app.task("slow")
    async def slow(seconds: float) -> str:
        """Sleep ``seconds``: a running job for the workers page and cancel."""
        await asyncio.sleep(seconds)
        return "slept"

    app.add_schedule("nightly-report", "echo", trigger=Every(3600),
                     args={"payload": "report"})
    return app


app = build_app(os.environ.get("AKADZE_DATABASE_URL"))
