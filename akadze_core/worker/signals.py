"""What the worker's rooms share: the stop and wake-up events, and why the worker stopped.

The lifecycle (``Worker``), the lease, the producer and the runs in flight each own their
state; these few events are the only state they share, so each room is handed this object
rather than the worker.
"""

from __future__ import annotations

import asyncio


class Signals:
    """The worker's shared events (``asyncio.Event`` binds to a loop only when first
    awaited, so they can exist before the worker runs and a stop works from any point)."""

    def __init__(self) -> None:
        #: Set to stop gracefully: no new claims.
        self.stop = asyncio.Event()
        #: Set to stop at once: running jobs go back to the queue.
        self.stop_now = asyncio.Event()
        #: Wakes the claim loop (a slot freed, a job enqueued, health restored).
        self.wake = asyncio.Event()
        #: Why the worker stopped on an error retrying cannot fix (redacted), else None.
        self.fatal: str | None = None
        #: 1 once the database was lost for longer than the heartbeat TTL.
        self.exit_code = 0

    def fail(self, message: str) -> None:
        """Stop on an error retrying cannot fix: ``message`` (redacted) says what to do."""
        self.fatal = message
        self.stop.set()
        self.wake.set()


__all__ = ["Signals"]
