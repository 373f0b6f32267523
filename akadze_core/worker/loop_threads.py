"""The default executor of the event loop ``Worker.run_sync`` runs: asyncio's, except that
its shutdown does not wait for a thread stuck in the network.

``asyncio.to_thread`` and ``loop.run_in_executor(None, ...)`` (a task's blocking call,
a sync remote-control command, psycopg's cancel before libpq 17) run in this executor. When
``asyncio.run`` ends it cancels the tasks still pending, then joins the executor's threads,
on Python 3.11 without any timeout. A task cancelled at shutdown leaves its thread running:
one waiting for a reply through a network partition (its query sent, the answer never
coming) kept a worker that had logged its exit alive until the partition healed. Nobody
awaits such a thread any more, so the shutdown gives the threads a moment to end and then
leaves; the process exits without them (``exit_now``), as it does with a sync body's thread.
"""

from __future__ import annotations

import logging
import threading
import time
from concurrent.futures import ThreadPoolExecutor

logger = logging.getLogger("akadze.worker")

#: Seconds the shutdown waits for the threads still running: enough for a call about to
#: return, far less than a call without an answer would take.
JOIN_TIMEOUT = 0.5


class LoopThreads(ThreadPoolExecutor):
    """asyncio's default executor (the same threads, named ``asyncio_N``) whose
    ``shutdown(wait=True)`` waits at most ``join_timeout`` seconds for its threads in all,
    then logs how many it left running."""

    def __init__(self, join_timeout: float = JOIN_TIMEOUT) -> None:
        #: The most seconds ``shutdown`` waits for threads still running.
        self.join_timeout = join_timeout
        self._started: list[threading.Thread] = []
        super().__init__(thread_name_prefix="asyncio", initializer=self._started_one)

    def _started_one(self) -> None:
        # Runs first in each new thread (list.append is atomic).
        self._started.append(threading.current_thread())

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        """Stop taking calls and let idle threads end; with ``wait``, wait for the busy
        ones up to ``join_timeout`` seconds, then return with those still running."""
        super().shutdown(wait=False, cancel_futures=cancel_futures)
        if not wait:
            return
        deadline = time.monotonic() + self.join_timeout
        for thread in self._started:
            thread.join(max(0.0, deadline - time.monotonic()))
        running = [thread.name for thread in self._started if thread.is_alive()]
        if running:
            logger.warning("not waiting for %d thread(s) of asyncio.to_thread or "
                           "run_in_executor still running (%s): the tasks that started "
                           "them have ended", len(running), ", ".join(running))
