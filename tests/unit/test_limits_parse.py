"""Rate limits in Celery's spelling, parsed without a database, and the checks of per-key
concurrency's options."""

from __future__ import annotations

import pytest

from akadze_core.model.limits import Rate, check_concurrency, parse_rate


@pytest.mark.parametrize(("text", "rate"), [
    ("100/s", Rate(100, 1.0)), ("10/m", Rate(10, 60.0)), ("1000/h", Rate(1000, 3600.0)),
    ("5", Rate(5, 1.0)), (7, Rate(7, 1.0)), (" 3 / m ", Rate(3, 60.0)),
    ("0.5/s", Rate(1, 2.0)), ("2.5/s", Rate(1, 0.4)),
])
def test_celerys_spellings_parse_to_a_count_per_period(text: str | int, rate: Rate) -> None:
    assert parse_rate(text) == rate


@pytest.mark.parametrize("value", [None, "", 0, "0/s", 0.0])
def test_nothing_and_zero_mean_no_limit(value: str | float | None) -> None:
    assert parse_rate(value) is None


@pytest.mark.parametrize("value", ["ten", "10/d", "10/", "/s", "-1/s", "1e3/s", "10 per s"])
def test_bad_spellings_say_what_is_expected(value: str) -> None:
    with pytest.raises(ValueError, match=r"'100/s', '10/m', '1000/h'"):
        parse_rate(value)


@pytest.mark.parametrize("value", [-1, float("inf"), float("nan"), 2**40])
def test_numbers_out_of_range_are_refused(value: float) -> None:
    with pytest.raises(ValueError, match="rate limit"):
        parse_rate(value)


def test_a_rate_limit_is_a_str_or_a_number() -> None:
    with pytest.raises(ValueError, match="a str like '10/m' or a number"):
        parse_rate(True)
    with pytest.raises(ValueError, match="a str like"):
        parse_rate([10])  # type: ignore[arg-type]


def test_max_concurrency_needs_a_key_and_a_positive_int() -> None:
    check_concurrency("key", None)
    check_concurrency("key", 3)
    check_concurrency(None, None)
    with pytest.raises(ValueError, match="needs a concurrency_key"):
        check_concurrency(None, 2)
    with pytest.raises(ValueError, match="at least 1"):
        check_concurrency("key", 0)
    with pytest.raises(ValueError, match="non-empty str"):
        check_concurrency("", 1)
