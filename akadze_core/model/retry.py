"""The one rule for how a run that raised goes on: retry, when, or fail (pure, no database).

``decide_retry`` is called by the core's worker (through ``outcomes.raised``) and by the
Celery facade (through ``akadze_core.integration``): what ``Retry``/``Fail``/``Snooze``/
``Cancel`` and any other exception mean, the delay before the next attempt (the task's
backoff policy, else the default curve) and whether an attempt is left
(``attempts_left``). Two places in SQL apply the same rule to rows, because only the
database can: ``job_complete_many`` writes the decision on the row it locks, where a cancel
request or an expiry that landed while the body ran still turns it into ``cancelled``, and
out of attempts (``attempts_left``'s comparison, on the row's counts, which the claim's
fence keeps equal to the run's) a retry into ``failed``; ``job_rescue`` retries the runs of
a dead worker, for which no Python runs, on the default curve (``DEFAULT_BACKOFF_CAP``).
"""

from __future__ import annotations

import logging
import random
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta

from .errors import Cancel, Fail, Retry, Snooze

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


#: What a run that raised becomes (the outcome kinds ``akadze_core.model.outcomes`` writes).
RETRY, SNOOZE, FAIL, CANCEL = "retry", "snooze", "fail", "cancel"


def attempt_budget(max_attempts: int, raised: int | None = None) -> int:
    """The attempts a job may spend: its own ``max_attempts``, raised (never lowered) to
    ``raised`` when a ``Retry(max_attempts=...)`` asks for more."""
    return max(max_attempts, raised or 0)


def attempts_left(attempt: int, max_attempts: int, raised: int | None = None) -> bool:
    """Whether a run that is attempt number ``attempt`` (1 for the first) may be retried:
    fewer attempts spent than the budget (``attempt_budget``). ``job_complete_many`` applies
    the same comparison to the row."""
    return attempt < attempt_budget(max_attempts, raised)


@dataclass(frozen=True, slots=True)
class RetryDecision:
    """How a run that raised goes on.

    ``kind``: retry (spends the attempt), snooze (gives it back), fail or cancel; ``delay``:
    seconds before the next run (retry, snooze); ``max_attempts``: the budget a ``Retry``
    raises the job's to (None: unchanged); ``exhausted``: a retry with no attempt left,
    which the job's row turns into a failure when it is written (None: the attempt counts
    were not given).
    """

    kind: str
    delay: float = 0.0
    max_attempts: int | None = None
    exhausted: bool | None = None


def decide_retry(
    exc: BaseException, attempt: int, max_attempts: int | None = None,
    policy: BackoffPolicy | None = None, rand: Callable[[], float] = random.random,
) -> RetryDecision:
    """Retry, when, or fail, for a run (attempt number ``attempt`` of ``max_attempts``) that
    raised ``exc``: ``Snooze`` waits its delay without spending the attempt, ``Retry`` waits
    its own delay (raising the budget to its ``max_attempts``), ``Fail`` and ``Cancel`` end
    the job, any other exception is retried after the task's backoff ``policy``."""
    if isinstance(exc, Snooze):
        return RetryDecision(SNOOZE, exc.delay)
    if isinstance(exc, Retry):
        delay, raised = exc.delay, exc.max_attempts
    elif isinstance(exc, Fail):
        return RetryDecision(FAIL)
    elif isinstance(exc, Cancel):
        return RetryDecision(CANCEL)
    else:
        delay, raised = backoff_delay(policy, attempt, rand), None
    exhausted = None if max_attempts is None else not attempts_left(attempt, max_attempts,
                                                                    raised)
    return RetryDecision(RETRY, delay, raised, exhausted)
