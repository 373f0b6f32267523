"""The app of tests/workers/test_metrics_port.py: tasks that succeed, fail, retry and take
a known time, so the worker's counters and histograms have known values."""

from __future__ import annotations

import asyncio
from datetime import timedelta

from akadze_core import App, Fail

app = App()


@app.task("metrics.ok")
async def ok() -> None:
    """Succeed at once."""


@app.task("metrics.refuse")
async def refuse() -> None:
    """Fail at once, without further attempts."""
    raise Fail("no")


@app.task("metrics.flaky", max_attempts=2, backoff=lambda attempt: timedelta(seconds=0.1))
async def flaky() -> None:
    """Fail both attempts: one retry, then failed for good."""
    raise ValueError("flaky")


@app.task("metrics.slow")
async def slow(seconds: float) -> None:
    """Take ``seconds``."""
    await asyncio.sleep(seconds)
