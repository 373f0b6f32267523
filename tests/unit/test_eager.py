"""Eager tasks (``akadze_core.execution.eager``): a run's first step is taken where its task
is made, as its own task, and everything after is an ordinary task's life."""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

import pytest

from akadze_core.execution import eager

T = TypeVar("T")

#: Python 3.10's worker makes its tasks as asyncio does (no eager maker there).
EAGER = sys.version_info >= (3, 11) and sys.platform != "win32"
needs_eager = pytest.mark.skipif(not EAGER, reason="eager tasks need Python 3.11 or later")


def _run(main: Callable[[], Coroutine[Any, Any, T]]) -> T:
    return eager.run(main())


def _make(coro: Coroutine[Any, Any, Any], name: str) -> asyncio.Task[Any]:
    """A task of ``coro`` made eagerly, in a block of its own."""
    with eager.eager_tasks(asyncio.get_running_loop()) as make:
        assert make is not None
        return make(coro, name)


def _maker_of(loop: asyncio.AbstractEventLoop) -> eager.MakeTask | None:
    with eager.eager_tasks(loop) as make:
        return make


@needs_eager
def test_the_first_step_is_taken_inside_the_call_as_the_task_itself() -> None:
    async def main() -> None:
        seen: list[Any] = []
        caller = asyncio.current_task()

        async def body() -> str:
            seen.append(asyncio.current_task())
            return "done"

        task = _make(body(), "job-1")
        assert task.done() and task.result() == "done"
        assert seen == [task] and task.get_name() == "job-1"
        assert asyncio.current_task() is caller  # the caller is current again

    _run(main)


@needs_eager
def test_a_body_that_awaits_goes_on_as_a_task() -> None:
    async def main() -> None:
        order: list[str] = []
        gate = asyncio.Event()

        async def body() -> int:
            order.append("first step")
            await gate.wait()
            order.append("resumed")
            assert asyncio.current_task() is task
            return 7

        task = _make(body(), "job-2")
        order.append("made")
        assert not task.done()
        gate.set()
        assert await task == 7
        assert order == ["first step", "made", "resumed"]

    _run(main)


@needs_eager
def test_a_timeout_in_the_first_step_cancels_the_body_not_its_caller() -> None:
    async def main() -> None:
        async def body() -> str:
            try:
                async with asyncio.timeout(0.01):
                    await asyncio.sleep(5)
            except TimeoutError:
                return "timed out"
            return "slept"

        task = _make(body(), "job-3")
        assert await task == "timed out"
        await asyncio.sleep(0.02)  # the caller was not cancelled in its place
        assert not asyncio.current_task().cancelling()  # type: ignore[union-attr]

    _run(main)


@needs_eager
def test_an_error_stays_in_the_task_and_a_cancel_reaches_a_waiting_one() -> None:
    async def main() -> None:
        async def fails() -> None:
            raise ValueError("bad")

        async def waits() -> None:
            await asyncio.sleep(5)

        failed = _make(fails(), "job-4")
        assert isinstance(failed.exception(), ValueError)
        waiting = _make(waits(), "job-5")
        waiting.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiting

    _run(main)


@needs_eager
def test_made_from_a_plain_callback_with_no_task_current() -> None:
    async def main() -> None:
        loop = asyncio.get_running_loop()
        done: asyncio.Future[Any] = loop.create_future()

        async def body() -> Any:
            return asyncio.current_task()

        def callback() -> None:
            try:
                task = _make(body(), "job-6")
                done.set_result((task, task.result(), asyncio.current_task()))
            except Exception as exc:  # to the test, not to the loop's handler
                done.set_exception(exc)

        loop.call_soon(callback)
        task, current_inside, current_after = await done
        assert current_inside is task and current_after is None

    _run(main)


@needs_eager
def test_later_calls_go_to_the_ready_queue_as_always() -> None:
    async def main() -> None:
        loop = asyncio.get_running_loop()
        calls: list[str] = []

        async def body() -> None:
            loop.call_soon(calls.append, "queued by the body")
            calls.append("body")

        _make(body(), "job-7")
        assert calls == ["body"]
        await asyncio.sleep(0)
        assert calls == ["body", "queued by the body"]

    _run(main)


@needs_eager
def test_the_caller_is_set_aside_for_the_whole_block_and_comes_back_after_it() -> None:
    async def main() -> None:
        caller = asyncio.current_task()
        seen: list[Any] = []

        async def body() -> None:
            seen.append(asyncio.current_task())

        with eager.eager_tasks(asyncio.get_running_loop()) as make:
            assert make is not None
            first, second = make(body(), "job-8"), make(body(), "job-9")
        assert seen == [first, second]
        assert asyncio.current_task() is caller
        with pytest.raises(KeyError), eager.eager_tasks(asyncio.get_running_loop()):
            raise KeyError("a bug while rows start")
        assert asyncio.current_task() is caller  # current again, however the block ended
        await asyncio.sleep(0)  # and the loop can still switch to it and back

    _run(main)


def test_no_maker_where_the_loop_makes_tasks_its_own_way() -> None:
    async def main() -> None:
        loop = asyncio.get_running_loop()
        loop.set_task_factory(lambda loop, coro, **kwargs: asyncio.Task(coro, loop=loop))
        assert _maker_of(loop) is None
        loop.set_task_factory(None)
        loop.set_debug(True)
        assert _maker_of(loop) is None
        loop.set_debug(False)
        assert (_maker_of(loop) is not None) is EAGER

    _run(main)
    if sys.version_info[:2] == (3, 11):
        async def plain() -> Any:
            return _maker_of(asyncio.get_running_loop())

        # asyncio.run's own loop cannot hold a task's step back on 3.11.
        assert asyncio.run(plain()) is None


def test_run_is_asyncio_run_on_the_worker_loop() -> None:
    async def main() -> Any:
        return asyncio.get_running_loop(), asyncio.get_event_loop()

    loop, current = _run(main)
    assert loop is current and loop.is_closed()
    if sys.version_info[:2] == (3, 11) and sys.platform != "win32":
        assert isinstance(loop, eager.EagerLoop)
