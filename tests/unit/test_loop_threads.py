"""LoopThreads: the default executor of a worker's loop, whose shutdown does not wait for a
thread stuck in a call."""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Iterator

import pytest

from akadze_core.worker.loop_threads import LoopThreads


@pytest.fixture
def release() -> Iterator[threading.Event]:
    """Set at teardown: a thread a test leaves blocked ends, so the process can exit."""
    event = threading.Event()
    yield event
    event.set()


def test_shutdown_stops_waiting_for_a_blocked_thread_after_its_timeout(
    release: threading.Event, caplog: pytest.LogCaptureFixture,
) -> None:
    executor = LoopThreads(join_timeout=0.3)
    blocked = executor.submit(release.wait)
    started = time.monotonic()
    executor.shutdown(wait=True)
    took = time.monotonic() - started
    assert 0.25 <= took < 2.0, took
    assert not blocked.done()
    assert "not waiting for 1 thread(s) of asyncio.to_thread" in caplog.text
    assert "asyncio_0" in caplog.text


def test_shutdown_waits_for_a_call_that_ends_within_its_timeout(
    caplog: pytest.LogCaptureFixture,
) -> None:
    executor = LoopThreads(join_timeout=10.0)
    ended: list[str] = []
    executor.submit(lambda: (time.sleep(0.2), ended.append("yes")))
    idle = executor.submit(lambda: None)
    idle.result()
    started = time.monotonic()
    executor.shutdown(wait=True)
    assert ended == ["yes"]
    assert time.monotonic() - started < 5.0
    assert "not waiting" not in caplog.text


def test_shutdown_without_wait_returns_at_once(release: threading.Event) -> None:
    executor = LoopThreads(join_timeout=10.0)
    executor.submit(release.wait)
    started = time.monotonic()
    executor.shutdown(wait=False)
    assert time.monotonic() - started < 1.0


def test_asyncio_run_ends_though_a_cancelled_task_left_its_thread_blocked(
    release: threading.Event, caplog: pytest.LogCaptureFixture,
) -> None:
    """asyncio.run cancels the leftover task, then shuts the executor down: with asyncio's
    own executor that join has no timeout (it would wait for ``release``)."""

    async def main() -> None:
        asyncio.get_running_loop().set_default_executor(LoopThreads(join_timeout=0.3))
        task = asyncio.create_task(asyncio.to_thread(release.wait))
        await asyncio.sleep(0.05)  # the call is running in its thread
        assert not task.done()  # left for asyncio.run to cancel

    caplog.set_level(logging.WARNING, logger="akadze.worker")
    started = time.monotonic()
    asyncio.run(main())
    assert time.monotonic() - started < 3.0
    assert "not waiting for 1 thread(s)" in caplog.text
