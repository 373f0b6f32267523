"""Tasks whose first step runs where they are made: Python 3.12's ``eager_start``.

A run's task normally takes its first step on a later turn of the loop: ``Task()`` hands
that step to ``loop.call_soon``, which wraps it in a ``Handle`` for the ready queue, and
the loop pops and runs it. A short body (a no-op, a cache hit, a body that only enqueues)
then pays a handle, a push and a pop, and a pass of the loop's dispatch on top of its task.
An eager task takes its first step at once, inside the call that made it, as the task
itself: ``asyncio.current_task()`` in the body is its own task (what ``asyncio.timeout``,
``TaskGroup`` and anyio rely on). A body that ends in that step never waits for the loop;
one that awaits goes on as any task.

Python 3.12 makes such tasks itself (``Task(eager_start=True)``). On 3.11 the worker runs
on ``EagerLoop`` (``run``), asyncio's selector loop whose ``call_soon`` can hold back the
one call a new task makes for its first step; that step is then run here, with the task
that was current (the claim loop's) set aside meanwhile, as the loop would run it.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import sys
from asyncio import tasks as _tasks
from collections.abc import Callable, Coroutine, Iterator
from typing import Any, TypeVar

T = TypeVar("T")

#: ``make(coroutine, name)``: a task of ``coroutine`` named ``name``, its first step taken.
MakeTask = Callable[[Coroutine[Any, Any, Any], str], "asyncio.Task[Any]"]

# The step handed to call_soon: (callback, its args, its context).
_Step = tuple[Callable[..., Any], tuple[Any, ...], Any]

_call_soon = asyncio.BaseEventLoop.call_soon


class EagerLoop(asyncio.SelectorEventLoop):
    """asyncio's selector loop (the default on Unix), able to make eager tasks on Python
    3.11 (``eager_tasks``). Every other call is asyncio's own."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # Set while an eager task is made: its first step goes here, not to the queue.
        # Made here, not on first use, so the instance's attributes keep their layout.
        self._held_step: list[_Step] | None = None

    def call_soon(self, callback: Callable[..., Any], *args: Any,  # type: ignore[override]
                  context: contextvars.Context | None = None) -> asyncio.Handle:
        held = self._held_step
        if held is not None and context is not None:  # a Task passes its own context
            self._held_step = None  # only the task's own step; anything after is queued
            held.append((callback, args, context))
            # The task drops what call_soon returns; nothing else asks while it is made.
            return None  # type: ignore[return-value]
        return _call_soon(self, callback, *args, context=context)


def run(main: Coroutine[Any, Any, T]) -> T:
    """``asyncio.run(main)``, on an ``EagerLoop`` where asyncio's default loop would run
    it on Python 3.11 (Unix, no event loop policy of the user's, such as uvloop's)."""
    if (sys.version_info[:2] != (3, 11) or sys.platform == "win32"
            or type(asyncio.get_event_loop_policy()) is not asyncio.DefaultEventLoopPolicy):
        return asyncio.run(main)
    with asyncio.Runner(loop_factory=EagerLoop) as runner:
        # As asyncio.run does with the loop it makes: the thread's loop while it runs.
        asyncio.set_event_loop(runner.get_loop())
        try:
            return runner.run(main)
        finally:
            asyncio.set_event_loop(None)


@contextlib.contextmanager
def eager_tasks(loop: asyncio.AbstractEventLoop) -> Iterator[MakeTask | None]:
    """A maker of eager tasks on ``loop`` for the block, or None where tasks are made by
    ``loop.create_task`` as usual: a loop that is not asyncio's own or an ``EagerLoop``
    (uvloop's, a framework's), a task factory (it may make something other than a
    ``Task``), or debug mode (it tracks where each step was scheduled).

    On Python 3.11 the task current when the block starts (the claim loop's, when rows
    are started from it) is set aside for the whole block and is current again when it
    ends: a step sets its own task current, and only one may be. Once a block, not once a
    task: a claim's rows are made in one block. The block must not await."""
    if loop.get_task_factory() is not None or loop.get_debug():
        yield None
        return
    if sys.version_info >= (3, 12):
        if type(loop).create_task is not asyncio.BaseEventLoop.create_task:
            yield None
            return
        task = asyncio.Task

        def made_here(coro: Coroutine[Any, Any, Any], name: str) -> asyncio.Task[Any]:
            return task(coro, loop=loop, name=name, eager_start=True)  # type: ignore[call-arg]

        yield made_here
        return
    if not isinstance(loop, EagerLoop):
        yield None
        return
    yield from _held_steps(loop)


def _held_steps(loop: EagerLoop) -> Iterator[MakeTask]:
    """``eager_tasks`` on Python 3.11: each new task's first step is held back from the
    ready queue by ``EagerLoop.call_soon`` and run at once, as the loop's Handle would run
    it, with no task current around it."""
    task = asyncio.Task
    holder = _tasks._current_tasks.get(loop)  # type: ignore[attr-defined]
    if holder is not None:
        _tasks._leave_task(loop, holder)  # type: ignore[attr-defined]

    def made(coro: Coroutine[Any, Any, Any], name: str) -> asyncio.Task[Any]:
        held: list[_Step] = []
        loop._held_step = held
        try:
            new = task(coro, loop=loop, name=name)
        finally:
            loop._held_step = None
        if held:
            callback, args, context = held[0]
            try:
                context.run(callback, *args)
            except (SystemExit, KeyboardInterrupt):
                raise
            except BaseException as exc:  # what Handle._run does with what escapes a step
                loop.call_exception_handler({"message": f"Exception in callback {callback!r}",
                                             "exception": exc})
        return new

    try:
        yield made
    finally:
        if holder is not None:
            _tasks._enter_task(loop, holder)  # type: ignore[attr-defined]


__all__ = ["EagerLoop", "MakeTask", "eager_tasks", "run"]
