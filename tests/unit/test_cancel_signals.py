"""How a terminate request names its signal (Celery's spellings), and how the worker reads
the cancel notification that carries it."""

from __future__ import annotations

import signal

import pytest

from akadze_core.ops.control import signal_number
from akadze_core.store.listener import _cancel_payload


@pytest.mark.parametrize(("given", "number"), [
    ("SIGTERM", signal.SIGTERM), ("TERM", signal.SIGTERM), ("KILL", signal.SIGKILL),
    ("sigkill", signal.SIGKILL), ("SIGUSR1", signal.SIGUSR1), (9, 9), ("9", 9),
    (signal.SIGINT, signal.SIGINT),
])
def test_signal_names_and_numbers(given: object, number: int) -> None:
    assert signal_number(given) == number  # type: ignore[arg-type]


@pytest.mark.parametrize("given", ["SIGNOPE", "", 0, -1, 100_000, True, None, 1.5,
                                   "SIG_DFL", "NSIG"])
def test_what_is_not_a_signal_is_refused(given: object) -> None:
    with pytest.raises(ValueError):
        signal_number(given)  # type: ignore[arg-type]


@pytest.mark.parametrize(("payload", "heard"), [
    ("42", (42, None)), ("42:15", (42, 15)), ("42:", (42, None)),
    ("x", None), ("42:x", None), (":15", None), ("", None), ("-1:9", None),
])
def test_cancel_payloads(payload: str, heard: tuple[int, int | None] | None) -> None:
    assert _cancel_payload(payload) == heard
