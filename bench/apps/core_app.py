"""The core app the benchmark's ``akadze worker`` runs: an async no-op and a timestamp task.

The worker gets its database from ``akadze --database-url``; ``make_app(url)`` builds the same
tasks on an explicit URL for the enqueuing side.
"""

from __future__ import annotations

import time

from akadze_core import App

NOOP = "bench.noop"
STAMP = "bench.stamp"


def make_app(database_url: str | None = None) -> App:
    """An App with the benchmark's tasks (no URL: ``--database-url`` / the environment)."""
    app = App(database_url)

    @app.task(NOOP)
    async def noop(n: int = 0) -> None:
        """Does nothing: the drain measures akadze, not the task."""

    @app.task(STAMP)
    async def stamp() -> float:
        """Returns the wall-clock time at which the body started (for the latency
        workload; the enqueuer, on the same host, reads the same clock)."""
        return time.time()

    return app


app = make_app()
