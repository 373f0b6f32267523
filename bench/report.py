"""The results table: one row per figure, with its comparison, ratio, target and verdict."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


@dataclass
class Row:
    """One line of the table. ``verdict`` is pass, FAIL, or — (no target, or not measured)."""

    workload: str
    akadze: str
    comparison: str = "—"
    ratio: str = "—"
    target: str = "—"
    verdict: str = "—"


HEADERS = ("workload", "akadze", "comparison", "ratio", "target", "pass/fail")


def rate(value: float | None) -> str:
    """``12,345 jobs/s``."""
    return "—" if value is None else f"{value:,.0f} jobs/s"


def ms(value: float | None) -> str:
    """``1.23 ms``."""
    return "—" if value is None else f"{value:.2f} ms"


def mib(value: int | None) -> str:
    """``45.1 MiB``."""
    return "—" if value is None else f"{value / 2**20:.1f} MiB"


def times(value: float | None) -> str:
    """``1.23x``."""
    return "—" if value is None else f"{value:.2f}x"


def verdict(ok: bool | None) -> str:
    """pass / FAIL / — (not measured)."""
    return "—" if ok is None else ("pass" if ok else "FAIL")


def markdown(rows: Sequence[Row]) -> str:
    """The rows as an aligned Markdown table (readable as plain text too)."""
    cells = [HEADERS] + [(r.workload, r.akadze, r.comparison, r.ratio, r.target, r.verdict)
                         for r in rows]
    widths = [max(len(line[i]) for line in cells) for i in range(len(HEADERS))]

    def line(values: Sequence[str]) -> str:
        return "| " + " | ".join(v.ljust(w) for v, w in zip(values, widths, strict=True)) + " |"

    rule = "|" + "|".join("-" * (w + 2) for w in widths) + "|"
    return "\n".join([line(cells[0]), rule, *(line(c) for c in cells[1:])])
