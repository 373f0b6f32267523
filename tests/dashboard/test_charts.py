"""The SVG charts escape every text they draw and survive empty or gappy series."""

from __future__ import annotations

from akadze_core.dashboard.charts import Series, bars, lines

HOSTILE = '"><img src=x onerror=alert(1)><script>alert(2)</script>'


def test_chart_texts_are_escaped() -> None:
    for chart in (bars(HOSTILE, [Series(HOSTILE, HOSTILE, [1, 2, None, 3])], unit=HOSTILE),
                  lines(HOSTILE, [Series(HOSTILE, HOSTILE, [1, None, 2, 3])], unit=HOSTILE)):
        assert "<img" not in chart and "<script" not in chart
        assert "&lt;script&gt;" in chart and chart.startswith("<svg")
        assert chart.count("<svg") == 1 and chart.endswith("</svg>")


def test_empty_and_gappy_series_draw() -> None:
    assert bars("none", [Series("a", "red", [])]).endswith("</svg>")
    drawn = lines("gaps", [Series("a", "red", [None, 1.0, None, 2.0, 3.0])])
    assert drawn.count("<circle") == 1 and drawn.count("<polyline") == 1
    stacked = bars("stack", [Series("a", "red", [1, 0]), Series("b", "blue", [1, 2])])
    assert stacked.count("<rect") == 2 + 3  # two legend boxes, three non-zero bars
