"""The table judges the speed targets against the peers of the same run: the facade's
prefork drain against Celery's on each broker, its threads drain against the reference
drain, the core drain against the SQL ceiling (no database: made-up figures)."""

from __future__ import annotations

from bench import ceiling, table
from bench import run as bench_run
from bench.drain import DrainResult
from bench.report import Row


def _drain(rate: float) -> DrainResult:
    return DrainResult(jobs=1000, succeeded=1000, seconds=1000 / rate, rate=rate)


def _by_label(rows: list[Row]) -> dict[str, Row]:
    return {row.workload: row for row in rows}


def test_the_compat_rows_judge_the_speed_targets() -> None:
    options = bench_run.parse(["--only", "compat,celery", "--prefork", "2"])
    results = {
        "compat": {"threads": _drain(9_000), "threads wide": _drain(13_000),
                   "prefork": _drain(8_500)},
        "celery": {"Redis prefork": _drain(1_000), "Redis threads": _drain(1_500),
                   "RabbitMQ prefork": _drain(3_000), "RabbitMQ threads": _drain(2_000)},
    }
    rows = _by_label(table.rows(results, options.sizes, options))

    redis = rows["compat prefork vs Celery 5.7 + Redis, `-P prefork -c 2`, the same pool"]
    assert (redis.target, redis.ratio, redis.verdict) == ("≥ 8x", "8.50x", "pass")
    rabbit = rows["compat prefork vs Celery 5.7 + RabbitMQ, `-P prefork -c 2`, the same pool"]
    assert (rabbit.target, rabbit.ratio, rabbit.verdict) == ("≥ 3x", "2.83x", "FAIL")
    threads = rows["compat threads, the faster of `-c 10` and `-c 50`, vs Celery 5.7 + Redis "
                   "`-P prefork -c 2` (the issue's reference drain)"]
    assert threads.akadze == "13,000 jobs/s (threads -c 50)"
    assert (threads.target, threads.ratio, threads.verdict) == ("≥ 12x", "13.00x", "pass")
    same = rows["(info) compat threads vs Celery 5.7 + Redis, `-P threads -c 10`, the same pool"]
    assert (same.ratio, same.target, same.verdict) == ("6.00x", "—", "—")
    best = rows["(info) compat best vs Celery 5.7 + Redis, `-P prefork -c 2`"]
    assert best.verdict == "—"


def test_the_ceiling_rows_judge_the_median_and_the_spread() -> None:
    result = ceiling.CeilingResult(jobs=1000, slots=64, ceilings=[10_000, 12_000, 11_000],
                                   drains=[_drain(r) for r in (10_000, 10_500, 6_000, 9_900)])
    median_row, spread_row = ceiling.rows(result, 1000)

    assert (median_row.ratio, median_row.target, median_row.verdict) == ("90%", "≥ 90 %",
                                                                         "pass")
    assert spread_row.ratio == f"{6_000 / 9_950:.2f}x"
    assert (spread_row.target, spread_row.verdict) == ("≥ 0.6x", "pass")
    result.drains.append(_drain(1_000))  # one stalled drain: the median hides it
    assert [row.verdict for row in ceiling.rows(result, 1000)] == ["pass", "FAIL"]
    result.ceilings.append(13_000)
    result.ceilings.append(14_000)  # the ceiling's median 12,000: the drains' 9,900 is 82 %
    assert [row.verdict for row in ceiling.rows(result, 1000)] == ["FAIL", "FAIL"]
