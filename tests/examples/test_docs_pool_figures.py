"""The prefork pool's figures the reference pages state are the pool's own constants."""

from __future__ import annotations

from pathlib import Path

from akadze_core.execution.processes import AHEAD, AHEAD_BUDGET, DEPTH, SHORT, SHORT_RUNS

DOCS = Path(__file__).resolve().parents[2] / "docs" / "reference"
_WORDS = {1: "one", 2: "two", 3: "three", 4: "four", 5: "five", 6: "six", 7: "seven",
          8: "eight", 9: "nine", 10: "ten", 11: "eleven", 12: "twelve"}


def _text(name: str) -> str:
    return " ".join((DOCS / name).read_text("utf-8").split())


def test_claimed_ahead_figures() -> None:
    text = _text("choices.md")
    assert (f"({SHORT_RUNS} per process, each under {SHORT * 1000:g} ms) and no body has been "
            f"running for {SHORT * 1000:g} ms") in text
    assert (f"as many more as its processes run in about {AHEAD_BUDGET * 1000:g} ms at their "
            f"recent pace, at most {AHEAD} per process") in text


def test_jobs_sent_behind_a_running_one() -> None:
    assert (f"behind a running one (short tasks only, at most {_WORDS[DEPTH - 1]}) counts as "
            "started") in _text("jobs.md")
