"""The figures the README and docs/benchmarks.md quote from the last full run are that run's:
each one appears, as printed, in bench/results.md, so a rerun that changes the record and
not the prose (or the other way round) fails here."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.examples.test_readme import section

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "bench" / "results.md"
BENCHMARKS = ROOT / "docs" / "benchmarks.md"

# A figure as the bench prints it: 5,785 jobs/s, 2.44 ms, 4.08x, 94%, 1.90 s, 43.6 MiB.
FIGURE = re.compile(r"(?<![\w.,])\d[\d,]*(?:\.\d+)?\s?(?:jobs/s|ms|x|%|s|MiB)(?![\w])")


def _figures(text: str) -> set[str]:
    return {re.sub(r"\s", "", match) for match in FIGURE.findall(text)}


def _recorded() -> set[str]:
    return _figures(RESULTS.read_text("utf-8"))


def _fast_bullet() -> str:
    text = (ROOT / "README.md").read_text("utf-8")
    match = re.search(r"^- \*\*Fast\.\*\*(.*?)(?=^- |^## |\Z)", text, re.MULTILINE | re.DOTALL)
    assert match, "the README has no **Fast.** bullet"
    return match.group(1)


@pytest.mark.parametrize("where", ["README: Fast", "benchmarks: Against Celery",
                                   "benchmarks: Canvas and workflows"])
def test_quoted_figures_are_the_recorded_ones(where: str) -> None:
    if where == "README: Fast":
        text = _fast_bullet()
    else:
        text = section(where.split(": ", 1)[1], BENCHMARKS)
    quoted = _figures(text)
    assert quoted, f"{where}: no figure found; the pattern no longer matches the prose"
    missing = sorted(quoted - _recorded())
    assert not missing, (f"{where} quotes figures bench/results.md does not hold: {missing}; "
                         "copy them from the run as printed")


def test_dates_agree() -> None:
    """The prose names the run's date."""
    run = re.search(r"full sizes, (\d{4}-\d{2}-\d{2})", RESULTS.read_text("utf-8"))
    assert run, "bench/results.md names no run date"
    assert run.group(1) in _fast_bullet()
    assert run.group(1) in section("Against Celery", BENCHMARKS)
