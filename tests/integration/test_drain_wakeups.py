"""Seed 000's claim rule under short drains: claim again at once after a full claim, and as
soon as a slot frees or the outcome backlog shrinks; never wait a poll interval while jobs are
queued and slots are free ( 1 drain in 4 of 5,000 no-ops slept ~910 ms mid-drain
because claims held back at ``max_pending_outcomes`` were never woken)."""

from __future__ import annotations

import asyncio
import itertools
import time

import pytest

from akadze_core import App, Worker


async def _drain(app: App, jobs: int, stamps: list[float], **settings: object) -> None:
    """Enqueue ``jobs`` no-ops, run one worker until each body has run, then stop it."""
    stamps.clear()
    await app.tasks["drain.noop"].enqueue_many_async([{} for _ in range(jobs)])
    worker = Worker(app, schedules=False, **settings)  # type: ignore[arg-type]
    runner = asyncio.create_task(worker.run())
    deadline = time.monotonic() + 60
    try:
        while len(stamps) < jobs:
            assert not runner.done(), f"the worker stopped: {runner.result()}"
            assert time.monotonic() < deadline, f"{len(stamps)} of {jobs} ran in 60 s"
            await asyncio.sleep(0.005)
    finally:
        worker.request_stop()
        await asyncio.wait_for(runner, 30)


def _register(app: App) -> list[float]:
    stamps: list[float] = []

    @app.task("drain.noop")
    async def noop() -> None:
        stamps.append(time.monotonic())

    return stamps


def _largest_gap(stamps: list[float]) -> tuple[float, int]:
    """The longest pause between two consecutive bodies, and how many had run before it."""
    gaps = [(later - earlier, index + 1)
            for index, (earlier, later) in enumerate(itertools.pairwise(stamps))]
    return max(gaps)


async def test_claims_held_back_by_the_outcome_backlog_resume_when_it_is_written(
        app: App) -> None:
    # A cap as small as the slots makes every claim stop at it: the 16 no-ops finish (all
    # slots free) before their outcomes are written, so only the write can wake the loop.
    # Before the fix each of these drains slept poll_interval (here >= 1 s) per claim.
    stamps = _register(app)
    poll = 2.0  # the loop's timed wait is uniform(poll / 2, poll): a stall is >= 1 s
    for _ in range(5):
        await _drain(app, 300, stamps, slots=16, max_pending_outcomes=16,
                     poll_interval=poll)
        gap, after = _largest_gap(stamps)
        assert gap < poll / 2, (f"the drain stalled {gap:.3f}s after job {after} of "
                                f"{len(stamps)} with jobs queued and slots free")


@pytest.mark.slow
async def test_many_short_drains_at_64_slots_never_wait_a_poll_interval(app: App) -> None:
    # The shape with the default cap (4 x slots = 256): the stall needs the
    # completer to fall 256 outcomes behind, which one drain in 4 did on a loaded 2-core
    # machine (6 of 20 here before the fix): 8 drains catch it about 19 times in 20; the
    # test above catches it every time.
    stamps = _register(app)
    poll = 2.0
    for _ in range(8):
        await _drain(app, 5000, stamps, slots=64, poll_interval=poll)
        gap, after = _largest_gap(stamps)
        assert gap < poll / 2, (f"the drain stalled {gap:.3f}s after job {after} of "
                                f"{len(stamps)} with jobs queued and slots free")
