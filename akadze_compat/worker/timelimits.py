"""Soft and hard time limits, raised inside the running task body.

In the prefork pool (``-P prefork``, a child process per body) the limits work as Celery's
billiard delivers them: the worker process sends the child SIGUSR1 at the soft limit, and
this module's handler (``install_child_handler``) raises ``SoftTimeLimitExceeded`` in the
child's main thread, where plain bodies run: a blocking ``time.sleep`` or socket read is
interrupted (PEP 475: the handler's exception ends the call). At the hard limit the worker
kills the child (SIGKILL), replaces it, and fails the task with ``TimeLimitExceeded``
(``akadze_compat.worker.pool``). ``async def`` bodies in a child get the soft limit at their
current ``await`` (below), the hard limit by the kill.

Elsewhere (``-P threads``/``solo``) tasks run in threads of the worker process and on its
event loop, where a signal cannot target one body, so the limits are delivered differently:

* ``async def`` bodies: at the limit the task is interrupted at its current ``await`` and
  ``SoftTimeLimitExceeded`` (or ``TimeLimitExceeded``) is raised there, so ``try/except``
  in the body works as in Celery.
* plain bodies (run in a worker thread): the exception is scheduled in that thread with
  ``PyThreadState_SetAsyncExc``. CPython delivers it at the next bytecode boundary, so a
  thread blocked in C code (``time.sleep``, a socket read, a long C call) only sees it when
  that call returns. A body that catches and ignores ``TimeLimitExceeded`` goes on running;
  the core's task timeout (the hard limit plus a grace period) then ends the attempt.
"""

from __future__ import annotations

import asyncio
import ctypes
import inspect
import signal
import threading
from collections.abc import Awaitable, Coroutine, Generator
from types import TracebackType
from typing import Any

__all__ = ["AsyncLimits", "SignalLimits", "ThreadLimits", "async_limits", "install_child_handler",
           "limits_for", "sync_limits"]

#: Set in a prefork child once its SIGUSR1 handler is installed: the parent delivers the limits.
_signal_delivered = False
#: Whether a plain body runs in the child's main thread now (the handler raises only then:
#: a signal that comes just after a body ended must not hit the child's own loop).
_in_body = False
_soft_exc: type[BaseException] = Exception


def _set_async_exc(thread_id: int, exc_type: type[BaseException] | None) -> int:
    # A NULL exception clears the one pending for that thread.
    return int(ctypes.pythonapi.PyThreadState_SetAsyncExc(
        ctypes.c_ulong(thread_id), ctypes.py_object(exc_type) if exc_type else None))


class ThreadLimits:
    """``with ThreadLimits({2.0: SoftTimeLimitExceeded, 5.0: TimeLimitExceeded}):`` raises
    each exception type in the current thread once its delay has passed."""

    def __init__(self, limits: dict[float, type[BaseException]]) -> None:
        self.limits = limits
        self._lock = threading.Lock()
        self._done = False
        self._fired = False
        self._timers: list[threading.Timer] = []

    def _fire(self, exc_type: type[BaseException]) -> None:
        with self._lock:
            if self._done:
                return
            self._fired = True
            _set_async_exc(self._thread_id, exc_type)

    def __enter__(self) -> ThreadLimits:
        self._thread_id = threading.get_ident()
        for delay, exc_type in sorted(self.limits.items()):
            timer = threading.Timer(max(0.0, delay), self._fire, (exc_type,))
            timer.daemon = True
            self._timers.append(timer)
            timer.start()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        with self._lock:
            self._done = True
            if self._fired:
                # Fired too late to be delivered inside the body: drop it, or it would pop
                # up later in whatever this thread runs next.
                _set_async_exc(self._thread_id, None)
        for timer in self._timers:
            timer.cancel()


class _Interruptible:
    """Awaits a coroutine; ``interrupt(exc_type)`` raises ``exc_type()`` at its current await.

    It drives the coroutine itself (``send``/``throw``) so that the cancellation used to wake
    the task up is turned into the limit's exception inside the body, where the user's
    ``except SoftTimeLimitExceeded`` can see it.
    """

    def __init__(self, coroutine: Coroutine[Any, Any, Any]) -> None:
        self._coroutine = coroutine
        self._pending: type[BaseException] | None = None

    def interrupt(self, task: asyncio.Task[Any], exc_type: type[BaseException]) -> None:
        """Raise ``exc_type()`` in the coroutine at its current await (from the loop)."""
        self._pending = exc_type
        task.cancel()

    def __await__(self) -> Generator[Any, Any, Any]:
        value: Any = None
        error: BaseException | None = None
        while True:
            try:
                if error is not None:
                    step, error = self._coroutine.throw(error), None
                else:
                    step = self._coroutine.send(value)
            except StopIteration as stop:
                return stop.value
            try:
                value = yield step
            except asyncio.CancelledError as cancelled:
                if self._pending is not None:
                    error, self._pending = self._pending(), None
                    task = asyncio.current_task()
                    if task is not None and hasattr(task, "uncancel"):
                        task.uncancel()  # our cancel, consumed here
                else:
                    error = cancelled
            except BaseException as raised:
                error = raised


class AsyncLimits:
    """Run a coroutine with limits: ``await AsyncLimits(limits).run(coroutine)``."""

    def __init__(self, limits: dict[float, type[BaseException]]) -> None:
        self.limits = limits

    async def run(self, coroutine: Awaitable[Any]) -> Any:
        """Await ``coroutine`` with the limits (other awaitables are awaited as they are)."""
        if not self.limits or not inspect.iscoroutine(coroutine):
            return await coroutine
        wrapper = _Interruptible(coroutine)
        loop = asyncio.get_running_loop()
        task = asyncio.current_task()
        assert task is not None
        handles = [loop.call_later(max(0.0, delay), wrapper.interrupt, task, exc_type)
                   for delay, exc_type in sorted(self.limits.items())]
        try:
            return await _awaitable(wrapper)
        finally:
            for handle in handles:
                handle.cancel()


async def _awaitable(wrapper: _Interruptible) -> Any:
    return await wrapper  # type: ignore[misc]


def limits_for(soft: float | None, hard: float | None,
               soft_exc: type[BaseException], hard_exc: type[BaseException]) \
        -> dict[float, type[BaseException]]:
    """The ``{delay: exception type}`` table for the given limits (None means no limit)."""
    table: dict[float, type[BaseException]] = {}
    if hard:
        table[float(hard)] = hard_exc
    if soft and (not hard or soft < hard):
        table[float(soft)] = soft_exc
    return table




def install_child_handler(soft_exc: type[BaseException],
                          signum: int = signal.SIGUSR1) -> None:
    """In a prefork child: ``signum`` raises ``soft_exc()`` in the main thread while a plain
    body runs there (``SignalLimits``); ignored between bodies. Billiard's child does the
    same (its soft timeout handler); a ``revoke(terminate=True, signal="SIGUSR1")`` lands
    here too, as in Celery."""
    global _signal_delivered, _soft_exc
    _soft_exc = soft_exc

    def soft_limit(received: int, frame: object) -> None:
        if _in_body:
            raise _soft_exc()

    signal.signal(signum, soft_limit)
    _signal_delivered = True


class SignalLimits:
    """Marks a plain body running in a prefork child's main thread: the parent sends the soft
    limit as a signal (raised here by the handler) and kills the child at the hard one."""

    __slots__ = ()

    def __enter__(self) -> SignalLimits:
        global _in_body
        _in_body = True
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        global _in_body
        _in_body = False


_SIGNAL_LIMITS = SignalLimits()


def sync_limits(limits: dict[float, type[BaseException]]) -> SignalLimits | ThreadLimits | None:
    """The context manager that delivers ``limits`` to a plain body run in this thread: the
    signal handler's in a prefork child's main thread, else ``ThreadLimits`` (None: no
    limits to deliver)."""
    if _signal_delivered and threading.current_thread() is threading.main_thread():
        return _SIGNAL_LIMITS
    return ThreadLimits(limits) if limits else None


def async_limits(limits: dict[float, type[BaseException]]) -> dict[float, type[BaseException]]:
    """The limits an ``async def`` body gets at its awaits: in a prefork child only the soft
    one (the parent kills the child at the hard limit), elsewhere all of them."""
    if not _signal_delivered:
        return limits
    return {delay: exc for delay, exc in limits.items() if exc is _soft_exc}
