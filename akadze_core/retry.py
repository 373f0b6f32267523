"""Backoff policies: pure functions from an attempt number to a delay."""

from __future__ import annotations

import logging
import random
from collections.abc import Callable
from datetime import timedelta

logger = logging.getLogger("akadze.retry")

BackoffPolicy = Callable[[int], timedelta]
"""A task's retry policy: attempt number (1 for the first run) -> delay before the next run."""

DEFAULT_BACKOFF_CAP = 300.0
MAX_POLICY_DELAY = timedelta(days=365)


def default_backoff(attempt: int, rand: Callable[[], float] = random.random) -> float:
    """2^(attempt-1) seconds, capped at 300 s, with jitter in [50 %, 100 %].

    The jitter keeps a batch that failed together from hitting its vendor again in one wave.
    The rescue query (``job_rescue``) applies the same curve in SQL with ``DEFAULT_BACKOFF_CAP``.
    """
    # The exponent is bounded first: 2.0 ** 1024 overflows, and a job may well have a large
    # max_attempts (2^63 is far above any cap anyway).
    base = min(2.0 ** min(max(attempt - 1, 0), 63), DEFAULT_BACKOFF_CAP)
    return base * (0.5 + 0.5 * rand())


def backoff_delay(
    policy: BackoffPolicy | None, attempt: int, rand: Callable[[], float] = random.random
) -> float:
    """Seconds to wait before retrying after ``attempt``, using the task's policy if it has one.

    A policy that raises or returns something other than a timedelta falls back to the
    default curve (a broken policy must not lose the job); its delays are clamped to
    [0, 365 days].
    """
    if policy is None:
        return default_backoff(attempt, rand)
    try:
        delay = policy(attempt)
    except Exception:
        logger.warning("backoff policy raised; using the default curve", exc_info=True)
        return default_backoff(attempt, rand)
    if not isinstance(delay, timedelta):
        logger.warning("backoff policy returned %r, not a timedelta; using the default curve",
                       type(delay).__name__)
        return default_backoff(attempt, rand)
    return min(max(delay, timedelta(0)), MAX_POLICY_DELAY).total_seconds()
