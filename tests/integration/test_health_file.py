"""``--health-file`` for a liveness probe: created when the worker is ready, touched by every
heartbeat that succeeds (so its age says how long ago the worker last reached the database),
removed when it stops."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

from akadze_core import App, Worker
from tests.integration.lease_support import FAST


async def test_every_good_heartbeat_touches_the_health_file(app: App, tmp_path: Path) -> None:
    health = tmp_path / "healthy"
    worker = Worker(app, health_file=health, schedules=False, **FAST)
    runner = asyncio.create_task(worker.run())
    try:
        for _ in range(200):
            if health.exists():
                break
            await asyncio.sleep(0.02)
        assert health.exists(), "no health file once the worker started"
        # Backdated: only a touch after this makes it recent again.
        os.utime(health, (1_000_000_000, 1_000_000_000))
        await asyncio.sleep(FAST["heartbeat_interval"] * 3)
        assert health.stat().st_mtime > 1_000_000_000, "no heartbeat touched the file"
    finally:
        worker.request_stop()
        assert await asyncio.wait_for(runner, 30) == 0
    assert not health.exists()
