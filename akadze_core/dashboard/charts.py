"""Inline SVG charts, drawn on the server: no JavaScript, nothing to build.

Every piece of text that reaches the SVG (labels, titles) goes through ``markupsafe.escape``;
the numbers are formatted by us. The result is ``Markup``, placed as is by the templates.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from markupsafe import Markup, escape

WIDTH = 600
HEIGHT = 160
PAD_LEFT = 44
PAD_BOTTOM = 20
PAD_TOP = 10


@dataclass(frozen=True)
class Series:
    """One line or bar stack of a chart: a label, a CSS colour and one value per slot
    (None: no data in that slot)."""

    label: str
    colour: str
    values: Sequence[float | None]


def _number(value: float) -> str:
    if value >= 100 or value == int(value):
        return f"{value:,.0f}"
    return f"{value:.2g}" if value < 1 else f"{value:.1f}"


def _frame(title: str, top: float, unit: str, slots: int, series: Sequence[Series]) -> list[str]:
    plot_h = HEIGHT - PAD_BOTTOM - PAD_TOP
    parts = [
        f'<svg class="chart" role="img" viewBox="0 0 {WIDTH} {HEIGHT + 18}" '
        f'width="{WIDTH}" height="{HEIGHT + 18}" xmlns="http://www.w3.org/2000/svg">',
        f"<title>{escape(title)}</title>",
        f'<line x1="{PAD_LEFT}" y1="{PAD_TOP}" x2="{PAD_LEFT}" y2="{PAD_TOP + plot_h}" '
        'stroke="#999"/>',
        f'<line x1="{PAD_LEFT}" y1="{PAD_TOP + plot_h}" x2="{WIDTH}" y2="{PAD_TOP + plot_h}" '
        'stroke="#999"/>',
        f'<text x="{PAD_LEFT - 4}" y="{PAD_TOP + 8}" text-anchor="end" font-size="10">'
        f"{escape(_number(top))}{escape(unit)}</text>",
        f'<text x="{PAD_LEFT - 4}" y="{PAD_TOP + plot_h}" text-anchor="end" font-size="10">0'
        "</text>",
        f'<text x="{PAD_LEFT}" y="{HEIGHT - 4}" font-size="10">-{slots} min</text>',
        f'<text x="{WIDTH}" y="{HEIGHT - 4}" text-anchor="end" font-size="10">now</text>',
    ]
    x = PAD_LEFT
    for one in series:
        parts.append(f'<rect x="{x}" y="{HEIGHT + 6}" width="10" height="10" '
                     f'fill="{escape(one.colour)}"/>')
        parts.append(f'<text x="{x + 14}" y="{HEIGHT + 15}" font-size="11">'
                     f"{escape(one.label)}</text>")
        x += 24 + 7 * len(one.label)
    return parts


def bars(title: str, series: Sequence[Series], unit: str = "") -> Markup:
    """Stacked bars, one per slot (oldest first), series stacked in order."""
    slots = max((len(one.values) for one in series), default=0)
    totals = [sum(one.values[i] or 0 for one in series if i < len(one.values))
              for i in range(slots)]
    top = max(totals, default=0) or 1
    plot_w = WIDTH - PAD_LEFT
    plot_h = HEIGHT - PAD_BOTTOM - PAD_TOP
    step = plot_w / max(slots, 1)
    parts = _frame(title, top, unit, slots, series)
    for i in range(slots):
        base = 0.0
        for one in series:
            value = (one.values[i] or 0) if i < len(one.values) else 0
            if value <= 0:
                continue
            height = plot_h * value / top
            y = PAD_TOP + plot_h - plot_h * base / top - height
            parts.append(f'<rect x="{PAD_LEFT + i * step + 0.5:.1f}" y="{y:.1f}" '
                         f'width="{max(step - 1, 1):.1f}" height="{height:.1f}" '
                         f'fill="{escape(one.colour)}"><title>{escape(one.label)}: '
                         f"{escape(_number(value))}{escape(unit)}</title></rect>")
            base += value
    parts.append("</svg>")
    return Markup("".join(parts))


def lines(title: str, series: Sequence[Series], unit: str = "") -> Markup:
    """One polyline per series over the slots (oldest first); gaps where a value is None."""
    slots = max((len(one.values) for one in series), default=0)
    top = max((value for one in series for value in one.values if value is not None),
              default=0) or 1
    plot_w = WIDTH - PAD_LEFT
    plot_h = HEIGHT - PAD_BOTTOM - PAD_TOP
    step = plot_w / max(slots - 1, 1)
    parts = _frame(title, top, unit, slots, series)
    for one in series:
        run: list[str] = []
        for i, value in enumerate(one.values):
            if value is None:
                if run:
                    parts.append(_polyline(run, one.colour))
                run = []
                continue
            run.append(f"{PAD_LEFT + i * step:.1f},{PAD_TOP + plot_h - plot_h * value / top:.1f}")
        if run:
            parts.append(_polyline(run, one.colour))
    parts.append("</svg>")
    return Markup("".join(parts))


def _polyline(points: list[str], colour: str) -> str:
    if len(points) == 1:
        x, y = points[0].split(",")
        return f'<circle cx="{x}" cy="{y}" r="2" fill="{escape(colour)}"/>'
    return (f'<polyline fill="none" stroke="{escape(colour)}" stroke-width="1.5" '
            f'points="{" ".join(points)}"/>')
