"""How a run's ending is classified into the outcome the completer writes (seed 003 table).

Pure functions, no database: ``succeeded`` for a body that returned, ``raised`` for one that
raised. The SQL side (attempt accounting, out of attempts, cancel) is tested in
tests/integration/test_outcomes.py.
"""

from __future__ import annotations

import dataclasses
import inspect
import json
import pickle
from datetime import datetime, timedelta
from decimal import Decimal
from typing import Any

import pytest

from akadze_core import App, Cancel, Fail, JobTimeout, Retry, Snooze
from akadze_core.model.outcomes import (
    CANCEL,
    FAIL,
    RETRY,
    SNOOZE,
    SUCCESS,
    Outcome,
    error_entry,
    error_summary,
    parse_error,
    raised,
    succeeded,
)

JOB, RUN = 41, 7


def entry(outcome: Outcome) -> dict[str, Any]:
    """The decoded errors entry an outcome carries."""
    assert outcome.error is not None
    decoded = json.loads(outcome.error)
    # "args" only when the exception was built with more than its message
    assert set(decoded) - {"args"} == {"type", "module", "message", "traceback"}
    return decoded


def raise_and_catch(exc: BaseException) -> BaseException:
    """``exc`` with a real traceback, as the executor sees it."""
    try:
        raise exc
    except BaseException as caught:
        return caught


@pytest.mark.parametrize(
    ("value", "stored"),
    [(None, None), (0, 0), (1.5, 1.5), ("text", "text"), (True, True), ([1, "a", None],
     [1, "a", None]), ({"nested": {"list": [1, 2]}}, {"nested": {"list": [1, 2]}}),
     ("\\u0000", "\\u0000"), ("😀 ünï", "😀 ünï")],
)
def test_json_value_or_none_succeeds_with_the_result(value: Any, stored: Any) -> None:
    outcome = succeeded(JOB, RUN, 1, value, None)
    assert outcome.kind == SUCCESS
    assert (outcome.job_id, outcome.run_count) == (JOB, RUN)
    assert outcome.error is None
    assert outcome.result is not None
    assert json.loads(outcome.result) == stored


@pytest.mark.parametrize(
    "value",
    [datetime(2024, 1, 1), {1, 2}, b"bytes", Decimal("1.5"), object(), float("nan"),
     float("inf"), {"when": datetime(2024, 1, 1)}, [timedelta(seconds=1)]],
)
def test_non_json_value_spends_the_attempt_with_result_not_json(value: Any) -> None:
    outcome = succeeded(JOB, RUN, 2, value, None)
    assert outcome.kind == RETRY
    assert outcome.result is None
    # The default curve after attempt 2: 2 s with jitter in [50 %, 100 %].
    assert 1.0 <= outcome.delay <= 2.0
    error = entry(outcome)
    assert error["type"] == "ResultNotJson"
    assert "not JSON" in error["message"]
    assert "ResultNotJson" in error["traceback"]


def test_non_json_value_follows_the_task_policy() -> None:
    outcome = succeeded(JOB, RUN, 3, datetime(2024, 1, 1), lambda attempt: timedelta(
        minutes=attempt))
    assert outcome.kind == RETRY
    assert outcome.delay == 180.0


def test_custom_dumps_failure_is_result_not_json() -> None:
    def dumps(value: Any) -> str:
        raise TypeError("not for me")

    outcome = succeeded(JOB, RUN, 1, {"a": 1}, None, dumps)
    assert outcome.kind == RETRY
    assert entry(outcome)["type"] == "ResultNotJson"


def test_any_encoder_error_is_result_not_json() -> None:
    """A custom encoder (kombu's, say) may raise its own error type; a structure too deep to
    encode raises RecursionError. Either way the body returned something that is not JSON."""

    class EncodeError(Exception):
        pass

    def dumps(value: Any) -> str:
        raise EncodeError("cannot encode")

    outcome = succeeded(JOB, RUN, 1, {"a": 1}, None, dumps)
    assert outcome.kind == RETRY
    assert entry(outcome)["type"] == "ResultNotJson"

    deep: list[Any] = []
    for _ in range(100_000):
        deep = [deep]
    outcome = succeeded(JOB, RUN, 1, deep, None)
    assert outcome.kind == RETRY
    assert entry(outcome)["type"] == "ResultNotJson"


@pytest.mark.parametrize("value", ["a\x00b", {"k": "\x00"}, {"\x00": 1}, ["x", ["\x00"]]])
def test_nul_in_result_fails_the_job_as_unstorable(value: Any) -> None:
    outcome = succeeded(JOB, RUN, 1, value, None)
    assert outcome.kind == FAIL
    assert outcome.result is None
    error = entry(outcome)
    assert error["type"] == "UnstorableOutcome"
    assert "NUL" in error["message"]


@pytest.mark.parametrize(("value", "size"), [
    ("x" * 99, None), ("x" * 98, 100), ("é" * 49, 100), ("é" * 50, 102), ("€" * 40, 122),
    (["x" * 200], None),
])
def test_result_over_max_bytes_fails_at_once_as_result_too_large(
    value: Any, size: int | None
) -> None:
    """At most max_bytes of UTF-8, counted on the JSON text (its quotes included)."""
    outcome = succeeded(JOB, RUN, 1, value, None, max_bytes=100)
    if size == 100:
        assert (outcome.kind, outcome.result) == (SUCCESS, json.dumps(value, ensure_ascii=False))
        return
    assert (outcome.kind, outcome.result) == (FAIL, None)
    error = entry(outcome)
    assert error["type"] == "ResultTooLarge"
    assert "max_result_bytes" in error["message"]
    if size is not None:
        assert f"is {size} bytes as JSON, over the limit of 100 bytes" in error["message"]


def test_max_result_bytes_is_checked_when_the_app_is_made() -> None:
    url = "postgresql://nobody@127.0.0.1:1/unused"
    assert App(url).max_result_bytes == 16 * 1024 * 1024
    assert App(url, max_result_bytes=5).max_result_bytes == 5
    for bad in (0, -1, 256 * 1024 * 1024):
        with pytest.raises(ValueError, match="max_result_bytes"):
            App(url, max_result_bytes=bad)


def test_lone_surrogate_in_result_fails_the_job_as_unstorable() -> None:
    outcome = succeeded(JOB, RUN, 1, {"k": "\ud800"}, None)
    assert outcome.kind == FAIL
    assert entry(outcome)["type"] == "UnstorableOutcome"


def test_plain_exception_retries_after_default_backoff() -> None:
    exc = raise_and_catch(ValueError("bad input"))
    outcome = raised(JOB, RUN, 1, exc, None)
    assert outcome.kind == RETRY
    assert (outcome.job_id, outcome.run_count) == (JOB, RUN)
    assert 0.5 <= outcome.delay <= 1.0
    error = entry(outcome)
    assert error["type"] == "ValueError"
    assert error["message"] == "bad input"
    assert "raise exc" in error["traceback"] and "ValueError: bad input" in error["traceback"]


def test_plain_exception_uses_the_policy_and_falls_back_when_it_is_bad() -> None:
    exc = raise_and_catch(KeyError("k"))
    assert raised(JOB, RUN, 4, exc, lambda attempt: timedelta(seconds=attempt * 10)).delay == 40
    outcome = raised(JOB, RUN, 4, exc, lambda attempt: 1 / 0)  # type: ignore[arg-type,return-value]
    assert 4.0 <= outcome.delay <= 8.0


def test_base_exception_from_a_task_is_a_plain_failure() -> None:
    outcome = raised(JOB, RUN, 1, raise_and_catch(SystemExit(3)), None)
    assert outcome.kind == RETRY
    assert entry(outcome)["type"] == "SystemExit"


def test_an_entry_keeps_the_exception_arguments_it_can_store() -> None:
    class Odd:
        def __repr__(self) -> str:
            return "<odd>"

    plain = entry(raised(JOB, RUN, 1, raise_and_catch(ValueError("just a message")), None))
    assert "args" not in plain  # the message says it all
    rich = entry(raised(JOB, RUN, 1, raise_and_catch(
        ValueError("a\x00b", 3, [1, "x"], Odd(), float("nan"))), None))
    assert rich["args"] == ["a\ufffdb", 3, [1, "x"], "<odd>", "nan"]
    huge = entry(raised(JOB, RUN, 1, raise_and_catch(ValueError("x" * 10, "y" * 9000)), None))
    assert "args" not in huge  # too big: the message and traceback stay
    assert "args" not in entry(raised(JOB, RUN, 1, raise_and_catch(ValueError()), None))


def test_timeout_retries_with_job_timeout() -> None:
    outcome = raised(JOB, RUN, 2, raise_and_catch(JobTimeout("too slow")), None)
    assert outcome.kind == RETRY
    assert 1.0 <= outcome.delay <= 2.0
    error = entry(outcome)
    assert error["type"] == "JobTimeout"
    assert error["message"] == "too slow"


@pytest.mark.parametrize(
    ("delay", "seconds"),
    [(timedelta(seconds=30), 30.0), (12.5, 12.5), (0, 0.0),
     (timedelta(days=400), timedelta(days=400).total_seconds())],
)
def test_retry_keeps_its_delay_unclamped_and_beats_the_policy(
    delay: timedelta | float, seconds: float
) -> None:
    policy_calls: list[int] = []

    def policy(attempt: int) -> timedelta:
        policy_calls.append(attempt)
        return timedelta(hours=1)

    outcome = raised(JOB, RUN, 1, raise_and_catch(Retry(delay)), policy)
    assert outcome.kind == RETRY
    assert outcome.delay == seconds
    assert policy_calls == []
    assert entry(outcome)["type"] == "Retry"


def test_snooze_gives_the_attempt_back_and_writes_no_error() -> None:
    outcome = raised(JOB, RUN, 2, raise_and_catch(Snooze(timedelta(seconds=30))),
                     lambda attempt: timedelta(hours=1))
    assert outcome.kind == SNOOZE
    assert outcome.delay == 30.0
    assert outcome.error is None


def test_fail_fails_at_once_with_the_reason() -> None:
    outcome = raised(JOB, RUN, 1, raise_and_catch(Fail("vendor rejected the export")), None)
    assert outcome.kind == FAIL
    error = entry(outcome)
    assert error["type"] == "Fail"
    assert error["message"] == "vendor rejected the export"


def test_cancel_cancels_at_once() -> None:
    outcome = raised(JOB, RUN, 1, raise_and_catch(Cancel()), None)
    assert outcome.kind == CANCEL
    assert entry(outcome)["type"] == "Cancel"


def test_subclasses_keep_their_meaning() -> None:
    class PollAgain(Snooze):
        pass

    class VendorGone(Fail):
        pass

    assert raised(JOB, RUN, 1, PollAgain(5), None).kind == SNOOZE
    outcome = raised(JOB, RUN, 1, VendorGone("gone"), None)
    assert outcome.kind == FAIL
    assert entry(outcome)["type"] == "VendorGone"


def test_error_entry_is_storable_whatever_the_message() -> None:
    exc = raise_and_catch(RuntimeError("nul \x00 and lone \ud800 surrogate"))
    text = error_entry(exc)
    assert "\\u0000" not in text
    text.encode("utf-8")  # no lone surrogate left
    assert json.loads(text)["message"] == "nul \ufffd and lone \ufffd surrogate"


def test_error_entry_type_override() -> None:
    assert json.loads(error_entry(ValueError("x"), "Custom"))["type"] == "Custom"


def test_error_summary_is_type_and_message_with_the_reason_of_fail_from() -> None:
    try:
        try:
            raise KeyError("sku-9")
        except KeyError as error:
            raise Fail("the catalog has no such item") from error
    except Fail as exc:
        entry = parse_error(error_entry(exc))
    assert error_summary(entry) == "KeyError: 'sku-9' (the catalog has no such item)"
    assert error_summary(parse_error(error_entry(ValueError()))) == "ValueError"
    assert error_summary({"type": "X", "message": "a\n\tb  c"}, limit=7) == "X: a b\u2026"
    assert error_summary({"type": "X", "message": "pw=1"}, lambda text: text.upper()) == "X: PW=1"
    assert parse_error(None) == {} and parse_error("not json") == {"message": "not json"}


def test_a_body_returning_none_succeeds_with_null_as_the_dumps_would_say() -> None:
    fast = succeeded(1, 1, 1, None, None, claim_token=5)
    assert fast == Outcome(1, 1, SUCCESS, result="null", claim_token=5)
    # A limit below "null"'s four bytes still refuses it, as for any other result.
    assert succeeded(1, 1, 1, None, None, max_bytes=3).kind == FAIL


def test_an_outcome_is_a_frozen_dataclass_made_from_its_fields_in_order() -> None:
    """Its ``__init__`` is written by hand (sets the slots directly): the same parameters,
    order and defaults as the fields, and the instance as frozen as the dataclass's."""
    names = [item.name for item in dataclasses.fields(Outcome)]
    assert names == ["job_id", "run_count", "kind", "result", "delay", "error",
                     "max_attempts", "claim_token"]
    parameters = list(inspect.signature(Outcome).parameters.values())
    assert [parameter.name for parameter in parameters] == names
    assert [parameter.default for parameter in parameters] == [
        inspect.Parameter.empty if item.default is dataclasses.MISSING else item.default
        for item in dataclasses.fields(Outcome)]
    outcome = Outcome(7, 2, RETRY, delay=1.5, error="{}", max_attempts=4, claim_token=9)
    assert dataclasses.astuple(outcome) == (7, 2, RETRY, None, 1.5, "{}", 4, 9)
    assert outcome == Outcome(*dataclasses.astuple(outcome))
    assert hash(outcome) == hash(Outcome(7, 2, RETRY, None, 1.5, "{}", 4, 9))
    assert repr(outcome) == ("Outcome(job_id=7, run_count=2, kind='retry', result=None, "
                             "delay=1.5, error='{}', max_attempts=4, claim_token=9)")
    with pytest.raises(dataclasses.FrozenInstanceError):
        outcome.kind = FAIL  # type: ignore[misc]
    assert dataclasses.replace(outcome, kind=FAIL).kind == FAIL
    assert pickle.loads(pickle.dumps(outcome)) == outcome
