"""within_lease: the caller of a step resumes on the loop turn after the step's call ends.

Every claim and outcome write of a worker goes through it, and a loaded worker's loop turns
are long (a batch of runs' task steps each): through the call task's done callbacks, as
``asyncio.wait`` has it, the caller resumed two turns later, each behind everything ready
meanwhile (a claim's answer waited behind the bodies of two batches of runs).
"""

from __future__ import annotations

import asyncio
import time
from typing import Any, cast

import pytest

from akadze_core.store.deadlines import within_lease

NO_CONNECTION = cast(Any, None)  # only an abandoned call touches it (test_slow_claims)


async def turns_after(call_raises: bool) -> int:
    """Loop turns from the call's last step to its caller's resumption."""
    turns = 0
    ended_at: list[int] = []
    done = False

    async def ticker() -> None:
        nonlocal turns
        while not done:
            turns += 1
            await asyncio.sleep(0)

    async def call() -> int:
        await asyncio.sleep(0)
        await asyncio.sleep(0)
        ended_at.append(turns)
        if call_raises:
            raise ValueError("refused")
        return 7

    ticking = asyncio.create_task(ticker())
    await asyncio.sleep(0)
    try:
        result = await within_lease(lambda: time.monotonic() + 60, 60.0, NO_CONNECTION,
                                    call(), "the call")
        assert result == 7
    except ValueError:
        assert call_raises
    resumed = turns
    done = True
    await ticking
    return resumed - ended_at[0]


@pytest.mark.parametrize("raises", [False, True])
async def test_the_caller_resumes_on_the_turn_after_the_call_ends(raises: bool) -> None:
    assert await turns_after(raises) == 1


async def test_a_renewed_lease_keeps_the_call_waited_for() -> None:
    """Renewed when reached, the lease keeps the call going: its answer is returned."""
    start = time.monotonic()

    async def slow() -> str:
        await asyncio.sleep(0.3)
        return "answer"

    # Ends 0.1 s from each read: renewed at each, so the 0.3 s call is waited for.
    assert await within_lease(lambda: time.monotonic() + 0.1, 60.0, NO_CONNECTION, slow(),
                              "the call") == "answer"
    assert time.monotonic() - start < 5
