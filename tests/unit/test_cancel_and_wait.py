"""cancel_and_wait: a task that swallows a cancellation is cancelled again until it ends.

Python 3.11's ``asyncio.wait_for`` swallows a cancellation that lands while its own timeout
fires; psycopg before 3.3 waits on its socket in ``wait_for(..., 0.1)``, so a worker's stop
hung on its LISTEN task (CI, the lower-bound pass, psycopg 3.2.1). ``Swallower`` does what
that ``wait_for`` did, deterministically.
"""

from __future__ import annotations

import asyncio

from akadze_core.store.deadlines import cancel_and_wait


async def swallower(swallow: int, ended: list[str]) -> None:
    """Waits forever; the first ``swallow`` cancellations are caught and ignored."""
    while True:
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            if swallow == 0:
                ended.append("cancelled")
                raise
            swallow -= 1
            current = asyncio.current_task()
            if hasattr(current, "uncancel"):  # 3.11+: as wait_for's TimeoutError path leaves it
                current.uncancel()


async def test_a_single_cancel_is_not_enough_for_a_swallowing_task() -> None:
    # The old stop (cancel once, then gather) against the same task: it is still running.
    ended: list[str] = []
    task = asyncio.create_task(swallower(1, ended))
    await asyncio.sleep(0)
    task.cancel()
    done, _ = await asyncio.wait({task}, timeout=0.3)
    assert not done and ended == []
    await cancel_and_wait(task, every=0.05)


async def test_cancel_and_wait_ends_tasks_that_swallow_cancellations() -> None:
    ended: list[str] = []
    tasks = [asyncio.create_task(swallower(n, ended)) for n in (0, 1, 3)]
    await asyncio.sleep(0)
    await asyncio.wait_for(cancel_and_wait(*tasks, every=0.05), 5)
    assert all(task.cancelled() for task in tasks)
    assert ended == ["cancelled"] * 3


async def test_cancel_and_wait_retrieves_what_a_task_raised_on_its_way_out() -> None:
    async def fails_when_cancelled() -> None:
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            raise RuntimeError("while stopping") from None

    done_already = asyncio.create_task(asyncio.sleep(0))
    failing = asyncio.create_task(fails_when_cancelled())
    await asyncio.sleep(0.01)
    await cancel_and_wait(done_already, failing)
    assert isinstance(failing.exception(), RuntimeError)
