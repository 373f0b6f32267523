"""BodyGate: N bodies at once, the rest waiting in claim order, and a waiting run dropped."""

from __future__ import annotations

import asyncio

import pytest

from akadze_core.execution.gate import BodyGate


async def test_waiting_runs_enter_in_order_and_a_dropped_one_never_does() -> None:
    gate = BodyGate(1)
    assert await gate.enter(1)
    entered: list[tuple[int, bool]] = []

    async def wait(job_id: int) -> None:
        entered.append((job_id, await gate.enter(job_id)))

    waiters = [asyncio.create_task(wait(job_id)) for job_id in (2, 3, 4)]
    await asyncio.sleep(0)
    assert all(gate.waiting(job_id) for job_id in (2, 3, 4)) and not gate.waiting(1)
    assert gate.drop(3) is True
    assert gate.drop(3) is False and gate.drop(1) is False  # gone, or holding a slot
    await asyncio.sleep(0)
    assert entered == [(3, False)]  # turned away at once, holding no slot
    gate.release()
    await asyncio.sleep(0)
    gate.release()
    await asyncio.gather(*waiters)
    assert entered == [(3, False), (2, True), (4, True)]
    gate.release()
    assert await gate.enter(5)  # the slot came back: nothing leaked


async def test_a_waiter_cancelled_after_being_handed_a_slot_passes_it_on() -> None:
    gate = BodyGate(1)
    assert await gate.enter(1)
    first = asyncio.create_task(gate.enter(2))
    second = asyncio.create_task(gate.enter(3))
    await asyncio.sleep(0)
    gate.release()  # hands the slot to 2 ...
    first.cancel()  # ... which is cancelled before it resumes (a stopping worker)
    with pytest.raises(asyncio.CancelledError):
        await first
    assert await asyncio.wait_for(second, 1) is True
    with pytest.raises(ValueError):
        BodyGate(0)


async def test_resize_hands_new_slots_to_waiters_and_takes_slots_back_as_bodies_end() -> None:
    gate = BodyGate(1)
    assert await gate.enter(1)
    waiters = [asyncio.create_task(gate.enter(job_id)) for job_id in (2, 3, 4)]
    await asyncio.sleep(0)
    gate.resize(3)  # two more: the first two waiting runs start at once
    await asyncio.sleep(0)
    assert [waiter.done() for waiter in waiters] == [True, True, False]
    gate.resize(1)  # three bodies hold slots; the next two that end pay the shrink back
    gate.release()
    gate.release()
    await asyncio.sleep(0)
    assert not waiters[2].done()
    gate.release()  # now one slot is free again: the last waiter gets it
    await asyncio.sleep(0)
    assert waiters[2].done() and await waiters[2]
    with pytest.raises(ValueError):
        gate.resize(0)
