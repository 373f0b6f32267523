"""Backoff policies (seed 003): the default curve and the rules for a task's own policy.

Default: 2^(attempt-1) s, capped at 300 s, jitter in [50 %, 100 %]. A policy that raises or
returns something other than a timedelta falls back to the default curve; a policy's delays
are clamped to [0, 365 days].
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from datetime import timedelta

import pytest

from akadze_core import BackoffPolicy, Cancel, Fail, Retry, Snooze, default_backoff
from akadze_core.model.retry import (
    DEFAULT_BACKOFF_CAP,
    MAX_POLICY_DELAY,
    RetryDecision,
    attempts_left,
    backoff_delay,
    decide_retry,
)

YEAR = timedelta(days=365).total_seconds()


def fixed(value: float) -> Callable[[], float]:
    """A ``rand`` that always returns ``value``."""
    return lambda: value


@pytest.mark.parametrize(
    ("attempt", "base"),
    [(1, 1.0), (2, 2.0), (3, 4.0), (4, 8.0), (9, 256.0), (10, 300.0), (11, 300.0),
     (50, 300.0), (10_000, 300.0)],
)
def test_default_curve_doubles_and_caps_at_300(attempt: int, base: float) -> None:
    # rand() == 1.0 is the top of the jitter range: the full base delay.
    assert default_backoff(attempt, fixed(1.0)) == pytest.approx(base)
    # rand() == 0.0 is the bottom: half of it.
    assert default_backoff(attempt, fixed(0.0)) == pytest.approx(base / 2)


def test_default_cap_is_300_seconds() -> None:
    assert DEFAULT_BACKOFF_CAP == 300.0
    assert max(default_backoff(n, fixed(1.0)) for n in range(1, 200)) == 300.0


@pytest.mark.parametrize("rand", [0.0, 0.1, 0.25, 0.5, 0.75, 0.999999])
def test_jitter_stays_within_half_and_full(rand: float) -> None:
    for attempt in range(1, 15):
        base = min(2.0 ** (attempt - 1), 300.0)
        delay = default_backoff(attempt, fixed(rand))
        assert base * 0.5 <= delay <= base
        assert delay == pytest.approx(base * (0.5 + 0.5 * rand))


def test_jitter_uses_the_random_source_by_default() -> None:
    delays = {default_backoff(8) for _ in range(50)}
    assert len(delays) > 1, "no jitter: a failed batch would retry in one wave"
    assert all(64.0 <= delay <= 128.0 for delay in delays)


def test_attempt_zero_or_negative_is_treated_as_the_first() -> None:
    assert default_backoff(0, fixed(1.0)) == 1.0
    assert default_backoff(-3, fixed(1.0)) == 1.0


def test_no_policy_means_the_default_curve() -> None:
    assert backoff_delay(None, 4, fixed(1.0)) == 8.0
    assert backoff_delay(None, 4, fixed(0.0)) == 4.0


def test_custom_policy_is_used_without_jitter() -> None:
    calls: list[int] = []

    def policy(attempt: int) -> timedelta:
        calls.append(attempt)
        return timedelta(minutes=attempt)

    typed: BackoffPolicy = policy
    assert backoff_delay(typed, 1, fixed(0.0)) == 60.0
    assert backoff_delay(typed, 7, fixed(0.0)) == 420.0
    assert calls == [1, 7]


def test_policy_that_raises_falls_back_to_the_default_curve(
    caplog: pytest.LogCaptureFixture,
) -> None:
    def broken(attempt: int) -> timedelta:
        raise RuntimeError("boom")

    with caplog.at_level(logging.WARNING, logger="akadze.retry"):
        assert backoff_delay(broken, 3, fixed(1.0)) == 4.0
        assert backoff_delay(broken, 3, fixed(0.0)) == 2.0
    assert "default curve" in caplog.text


@pytest.mark.parametrize("bad", [5, 5.0, "5", None, timedelta, [timedelta(seconds=5)]])
def test_policy_returning_a_non_timedelta_falls_back(bad: object) -> None:
    assert backoff_delay(lambda attempt: bad, 2, fixed(1.0)) == 2.0  # type: ignore[arg-type,return-value]


def test_policy_delay_is_clamped_to_zero_and_365_days() -> None:
    assert timedelta(days=365) == MAX_POLICY_DELAY
    assert backoff_delay(lambda attempt: timedelta(seconds=-30), 1) == 0.0
    assert backoff_delay(lambda attempt: timedelta(days=-400), 1) == 0.0
    assert backoff_delay(lambda attempt: timedelta(days=366), 1) == YEAR
    assert backoff_delay(lambda attempt: timedelta.max, 1) == YEAR
    assert backoff_delay(lambda attempt: timedelta(days=365), 1) == YEAR
    assert backoff_delay(lambda attempt: timedelta(0), 1) == 0.0
    # Inside the range the policy's value is kept exactly (no jitter, no cap of 300 s).
    assert backoff_delay(lambda attempt: timedelta(hours=2), 1) == 7200.0


def test_one_rule_decides_retry_when_or_fail() -> None:
    """``decide_retry``: what each exception means, the delay, and whether an attempt is
    left (``attempts_left``: fewer attempts spent than the budget, which a ``Retry`` may
    raise but never lower)."""
    assert decide_retry(Snooze(5), 3, 3) == RetryDecision("snooze", 5.0)
    assert decide_retry(Fail("no"), 1, 3) == RetryDecision("fail")
    assert decide_retry(Cancel("no"), 1, 3) == RetryDecision("cancel")
    assert decide_retry(Retry(7), 1, 3) == RetryDecision("retry", 7.0, None, False)
    assert decide_retry(Retry(7), 3, 3).exhausted is True
    assert decide_retry(Retry(7, max_attempts=5), 3, 3) == RetryDecision("retry", 7.0, 5, False)
    assert decide_retry(Retry(7, max_attempts=1), 2, 3).exhausted is False  # never lowered
    # Any other exception: the task's policy (else the default curve) gives the delay.
    decision = decide_retry(ValueError("x"), 2, 3, lambda attempt: timedelta(seconds=attempt))
    assert decision == RetryDecision("retry", 2.0, None, False)
    assert decide_retry(ValueError("x"), 4, 4, None, fixed(1.0)) == RetryDecision(
        "retry", 8.0, None, True)
    assert decide_retry(ValueError("x"), 4, None).exhausted is None  # counts not given
    assert [attempts_left(a, 3) for a in (1, 2, 3, 4)] == [True, True, False, False]
    assert attempts_left(3, 3, raised=4) and not attempts_left(3, 3, raised=2)
