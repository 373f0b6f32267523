"""Run sync task bodies on threads and hand their results back to the event loop in batches.

``loop.run_in_executor`` costs one ``concurrent.futures.Future``, a chained asyncio future
and one ``call_soon_threadsafe`` (a write to the loop's wake-up pipe) per call. A busy
worker running thousands of short sync bodies a second spent a sixth of its time there.
Here a body's result goes into a deque, and only the first result after the loop last
looked schedules a wake-up: under load, one wake-up delivers many results.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import threading
from collections.abc import Callable
from queue import SimpleQueue
from typing import Any

logger = logging.getLogger("akadze.worker")

#: Called on the loop with (key, value, error) once a body ended.
Done = Callable[[Any, Any, "BaseException | None"], None]
_Item = tuple[Done, Any, Callable[..., Any], tuple[Any, ...], dict[str, Any]]


class ThreadRunner:
    """Up to ``max_threads`` threads, started as needed and reused, like ThreadPoolExecutor.

    Threads are daemons: a body that never returns (its timeout fired, the worker is
    stopping) cannot keep the process alive, since nothing can stop a thread anyway.
    """

    def __init__(self, max_threads: int, name: str = "akadze-task") -> None:
        if max_threads < 1:
            raise ValueError("max_threads must be at least 1")
        self._max_threads = max_threads
        self._name = name
        self._work: SimpleQueue[_Item | None] = SimpleQueue()
        self._results: collections.deque[tuple[Done, Any, Any, BaseException | None]]
        self._results = collections.deque()
        # Threads done with a body and about to take the next item (ThreadPoolExecutor's
        # idle semaphore as a count under ``_lock``, which a result takes anyway: the
        # Semaphore's Python-level Condition cost a few µs a job). Read only until every
        # thread is started.
        self._idle = 0
        self._lock = threading.Lock()
        self._threads: list[threading.Thread] = []
        self._delivery_scheduled = False
        self._loop: asyncio.AbstractEventLoop | None = None
        self._closed = False

    def submit(self, func: Callable[..., Any], /, *args: Any, **kwargs: Any) -> asyncio.Future[Any]:
        """Run ``func(*args, **kwargs)`` on a thread; the returned future resolves on the
        running loop. Cancelling the future does not stop the body, its result is dropped."""
        if self._loop is None:
            self._loop = asyncio.get_running_loop()
        future = self._loop.create_future()
        self.call(_settle, future, func, *args, **kwargs)
        return future

    def call(self, done: Done, key: Any, func: Callable[..., Any], /, *args: Any,
             **kwargs: Any) -> None:
        """Run ``func(*args, **kwargs)`` on a thread; ``done(key, value, error)`` is called
        on the running loop once it ended (``error``: what it raised, else None). No future:
        a caller that keeps its own record of the run saves one per call. ``done`` must not
        raise (what it raises is logged)."""
        if self._closed:
            raise RuntimeError("the thread runner is closed")
        if self._loop is None:
            self._loop = asyncio.get_running_loop()
        self._work.put((done, key, func, args, kwargs))
        if len(self._threads) >= self._max_threads:
            # Every thread is started: nothing to decide. Not taking ``_lock`` here keeps
            # the loop off the lock each finished body takes (a contended acquire drops
            # and retakes the GIL).
            return
        # Like ThreadPoolExecutor: reuse an idle thread when there is one, else start one.
        with self._lock:
            idle = self._idle > 0
            if idle:
                self._idle -= 1
        if not idle:
            thread = threading.Thread(target=self._serve, daemon=True,
                                      name=f"{self._name}-{len(self._threads)}")
            self._threads.append(thread)
            thread.start()

    def close(self) -> None:
        """Let idle threads end; bodies still running finish on their own (not waited for)."""
        self._closed = True
        for _ in self._threads:
            self._work.put(None)

    def _serve(self) -> None:
        while True:
            item = self._work.get()
            if item is None:
                return
            done, key, func, args, kwargs = item
            outcome: tuple[Done, Any, Any, BaseException | None]
            try:
                outcome = (done, key, func(*args, **kwargs), None)
            except BaseException as exc:  # SystemExit from a body is its outcome, not ours
                outcome = (done, key, None, exc)
            del item, func, args, kwargs
            self._results.append(outcome)
            del outcome, done, key
            with self._lock:
                wake = not self._delivery_scheduled
                self._delivery_scheduled = True
                self._idle += 1
            if wake and self._loop is not None:
                # A closed loop raises RuntimeError: nobody waits for this result then.
                with contextlib.suppress(RuntimeError):
                    self._loop.call_soon_threadsafe(self._deliver)

    def _deliver(self) -> None:
        # Clear the flag before draining: a result appended after this point schedules the
        # next delivery itself (or is drained below, when it comes before the count).
        with self._lock:
            self._delivery_scheduled = False
        results = self._results
        # Only the results here now, not those appended while these are delivered: a done
        # callback that starts the next body (the body gate's hand-over) would otherwise
        # keep this callback going for as long as the threads keep up, and the claim and
        # the outcome writes waiting for their turn of the loop would wait with it.
        for _ in range(len(results)):
            done, key, value, error = results.popleft()
            try:
                done(key, value, error)
            except Exception:  # the results after it must still be delivered
                logger.exception("a thread body's result could not be delivered")


def _settle(future: asyncio.Future[Any], value: Any, error: BaseException | None) -> None:
    """``submit``'s ``done``: the body's result or exception to its future."""
    if future.done():  # cancelled by a timeout or a stop: the result is dropped
        return
    if error is None:
        future.set_result(value)
    else:
        future.set_exception(error)
