"""ThreadRunner: sync bodies on threads, results delivered to the loop in batches."""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

import pytest

from akadze_core.execution.threads import ThreadRunner


async def test_results_and_exceptions_reach_their_own_futures() -> None:
    runner = ThreadRunner(max_threads=4)

    def body(i: int) -> int:
        if i % 7 == 0:
            raise ValueError(i)
        return i * 2

    futures = [runner.submit(body, i) for i in range(200)]
    outcomes = await asyncio.gather(*futures, return_exceptions=True)
    for i, outcome in enumerate(outcomes):
        if i % 7 == 0:
            assert isinstance(outcome, ValueError) and outcome.args == (i,)
        else:
            assert outcome == i * 2
    runner.close()


async def test_system_exit_in_a_body_is_its_outcome() -> None:
    runner = ThreadRunner(max_threads=1)

    def leave() -> None:
        raise SystemExit(3)

    with pytest.raises(SystemExit):
        await runner.submit(leave)
    assert await runner.submit(lambda: "still serving") == "still serving"
    runner.close()


async def test_threads_are_capped_and_reused() -> None:
    runner = ThreadRunner(max_threads=3)
    running = 0
    most = 0
    lock = threading.Lock()

    def body() -> str:
        nonlocal running, most
        with lock:
            running += 1
            most = max(most, running)
        time.sleep(0.01)
        with lock:
            running -= 1
        return threading.current_thread().name

    names = await asyncio.gather(*(runner.submit(body) for _ in range(30)))
    assert most == 3
    assert len(set(names)) == 3
    # Sequential calls reuse an idle thread rather than starting new ones.
    for _ in range(5):
        await runner.submit(body)
    assert len(runner._threads) == 3
    runner.close()


async def test_a_cancelled_future_drops_the_late_result() -> None:
    runner = ThreadRunner(max_threads=2)
    release = threading.Event()
    slow = runner.submit(release.wait, 5)
    with pytest.raises(asyncio.TimeoutError):
        await asyncio.wait_for(slow, 0.05)
    assert slow.cancelled()
    release.set()
    # The late result must not break delivery of the next ones.
    assert await runner.submit(lambda: 42) == 42
    runner.close()


async def test_closed_runner_refuses_work_and_lets_threads_end() -> None:
    runner = ThreadRunner(max_threads=2)
    await asyncio.gather(runner.submit(time.sleep, 0.01), runner.submit(time.sleep, 0.01))
    runner.close()
    with pytest.raises(RuntimeError):
        runner.submit(lambda: None)
    for thread in runner._threads:
        thread.join(2)
        assert not thread.is_alive()
        assert thread.daemon


async def test_once_every_thread_is_started_submit_takes_no_lock() -> None:
    """The loop does not contend for the lock each finished body takes."""
    runner = ThreadRunner(max_threads=4)
    barrier = threading.Barrier(4)
    await asyncio.gather(*(runner.submit(barrier.wait, 5) for _ in range(4)))
    assert len(runner._threads) == 4
    real = runner._lock
    loop_thread = threading.get_ident()
    taken_by_loop = 0

    class Counted:
        def __enter__(self) -> None:
            nonlocal taken_by_loop
            taken_by_loop += threading.get_ident() == loop_thread
            real.acquire()

        def __exit__(self, *exc_info: object) -> None:
            real.release()

    deliveries = 0
    deliver = runner._deliver

    def counted_deliver() -> None:
        nonlocal deliveries
        deliveries += 1
        deliver()

    runner._lock = Counted()  # type: ignore[assignment]
    runner._deliver = counted_deliver  # type: ignore[method-assign]
    assert await asyncio.gather(*(runner.submit(lambda i=i: i) for i in range(50))) == \
        list(range(50))
    # The loop takes the lock once a delivery (a batch of results), never a submit.
    assert taken_by_loop == deliveries and len(runner._threads) == 4
    runner.close()


async def test_call_delivers_key_value_and_error_on_the_loop_and_survives_a_raising_done(
) -> None:
    """``call`` hands ``done(key, value, error)`` the body's end on the loop's thread, with
    no future; a ``done`` that raises is logged, and the results after it still arrive."""
    runner = ThreadRunner(2)
    loop_thread = threading.get_ident()
    got: dict[int, tuple[Any, BaseException | None, bool]] = {}
    finished = asyncio.Event()

    def done(key: int, value: Any, error: BaseException | None) -> None:
        got[key] = (value, error, threading.get_ident() == loop_thread)
        if len(got) == 20:
            finished.set()
        if key == 0:
            raise RuntimeError("a broken callback")

    def body(n: int) -> int:
        if n == 3:
            raise ValueError(n)
        return n * 2

    for n in range(20):
        runner.call(done, n, body, n=n)
    await asyncio.wait_for(finished.wait(), 5)
    assert all(on_loop for _, _, on_loop in got.values())
    assert got[1][:2] == (2, None) and isinstance(got[3][1], ValueError)
    runner.close()


async def test_a_delivery_leaves_results_that_came_during_it_to_the_next_loop_turn() -> None:
    """A done callback that starts the next body (the body gate's hand-over) does not keep
    the delivery going: what the loop has ready meanwhile (a claim's answer, an outcome
    write) runs before the next body's result is delivered."""
    runner = ThreadRunner(1)
    loop = asyncio.get_running_loop()
    order: list[str] = []
    finished = asyncio.Event()

    def second_done(key: str, value: Any, error: BaseException | None) -> None:
        order.append(key)
        finished.set()

    def first_done(key: str, value: Any, error: BaseException | None) -> None:
        order.append(key)
        runner.call(second_done, "second", lambda: None)
        loop.call_soon(order.append, "other callback")
        deadline = time.monotonic() + 5
        while not runner._results and time.monotonic() < deadline:
            time.sleep(0.001)  # until the second body's result is in, during this delivery
        assert runner._results

    runner.call(first_done, "first", lambda: None)
    await asyncio.wait_for(finished.wait(), 5)
    assert order == ["first", "other callback", "second"]
    runner.close()
