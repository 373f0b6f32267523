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


async def test_callback_waiters_share_the_line_with_awaiting_ones() -> None:
    """``wait`` (a run driven by callbacks) queues behind ``enter``'s awaiting runs in claim
    order, is called back with True when handed a slot and False when dropped, and
    ``leave`` takes it out of line without a call."""
    gate = BodyGate(1)
    assert gate.try_enter()
    assert not gate.try_enter()  # no free slot: the gate is unchanged
    told: list[tuple[int, bool]] = []

    def tell(job_id: int, slot: bool) -> None:
        told.append((job_id, slot))

    awaiting = asyncio.create_task(gate.enter(2))
    await asyncio.sleep(0)
    for job_id in (3, 4, 5):
        gate.wait(job_id, tell, job_id)
    assert all(gate.waiting(job_id) for job_id in (2, 3, 4, 5))
    assert not gate.try_enter()  # others wait: no jumping the line
    assert gate.drop(4) is True and told == [(4, False)]
    assert gate.leave(5) is True and not gate.waiting(5) and gate.leave(5) is False
    assert gate.leave(2) is False  # an awaiting run leaves by its cancellation
    gate.release()
    assert await awaiting is True
    gate.release()
    assert told == [(4, False), (3, True)]
    gate.release()
    assert told == [(4, False), (3, True)]  # 5 left the line: the slot came back
    assert gate.try_enter() and not gate.try_enter()


async def test_resize_hands_new_slots_to_callback_waiters() -> None:
    gate = BodyGate(1)
    assert gate.try_enter()
    told: list[int] = []
    for job_id in (1, 2, 3):
        gate.wait(job_id, lambda key, slot: told.append(key), job_id)
    gate.resize(3)
    assert told == [1, 2] and gate.waiting(3)


async def test_a_full_gate_lines_up_arrivals_in_order_and_a_dropped_one_never_enters() -> None:
    gate = BodyGate(2)
    assert gate.try_enter() and gate.try_enter()
    assert gate.try_enter() is False  # no free slot
    handed: list[tuple[int, bool]] = []
    gate.wait(1, lambda key, slot: handed.append((key, slot)), 1)
    entered = asyncio.create_task(gate.enter(2))
    late = asyncio.create_task(gate.enter(3))
    await asyncio.sleep(0)
    assert all(gate.waiting(job_id) for job_id in (1, 2, 3))
    assert gate.drop(3) is True
    gate.release()
    gate.release()  # two free slots: the first two in line, in order
    assert handed == [(1, True)]
    assert await entered is True and await late is False
    assert gate.try_enter() is False  # both slots taken again
    gate.release()
    assert gate.try_enter() is True  # no line, a free slot
