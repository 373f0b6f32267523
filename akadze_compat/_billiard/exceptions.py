"""``billiard.exceptions``: the pool's exceptions, the same classes as ``celery.exceptions``'."""

from __future__ import annotations

from ..exceptions import SoftTimeLimitExceeded, Terminated, TimeLimitExceeded, WorkerLostError

__all__ = ["SoftTimeLimitExceeded", "Terminated", "TimeLimitExceeded", "WorkerLostError"]
