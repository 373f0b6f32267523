"""Turn the run's results into the table's rows and the Markdown document around it."""

from __future__ import annotations

import argparse
import shlex
import statistics
import sys
from typing import Any

from . import ceiling, celery_side, oban_side
from . import metrics as metrics_workload
from .compat import pools
from .dashboard import METRICS_TARGET_MS, TARGET_MS
from .drain import DrainResult
from .report import Row, markdown, mib, ms, rate, times, verdict

CORE_TARGET = 10_000
COMPAT_TARGET = 5_000
BULK_TARGET = 100_000
#: The facade's prefork drain over Celery 5.7's prefork drain, same concurrency, per broker.
SAME_POOL_TARGETS = {"Redis": 8.0, "RabbitMQ": 3.0}
#: The facade's fastest threads drain over Celery 5.7 + Redis prefork (the reference drain).
THREADS_TARGET = 12.0


def _failed(value: Any) -> str | None:
    reason = getattr(value, "reason", None)
    return None if reason is None else str(reason)


def rows(results: dict[str, Any], sizes: Any, options: argparse.Namespace) -> list[Row]:
    """Every row, in the order the table prints them."""
    found: list[Row] = []
    found += _core_rows(results, options)
    found += ceiling.rows(results.get("ceiling"), sizes.ceiling_jobs)
    found += _compat_rows(results, options)
    found += _oban_rows(results, options)
    found += _enqueue_rows(results, sizes)
    found += _latency_rows(results)
    found += _claim_rows(results)
    found += _memory_rows(results, options)
    found += _canvas_rows(results, options)
    found += _schedules_rows(results)
    found += _metrics_rows(results)
    found += _dashboard_rows(results)
    found += _limits_rows(results)
    return found


def _drain_row(label: str, value: Any, target: float | None) -> Row:
    if value is None:
        return Row(label, "not run")
    if (reason := _failed(value)) is not None:
        return Row(label, reason)
    ok = value.rate >= target if target else None
    return Row(label, rate(value.rate), target=f"≥ {target:,} jobs/s" if target else "—",
               verdict=verdict(ok))


#: The core target is one worker's throughput when it is given room to batch: with few slots a
#: drain of no-ops is bound by two round trips (claim, outcome) per handful of jobs, so those
#: rows are shown for information, not judged.
JUDGED_SLOTS = 100


def _core_drain_row(label: str, value: Any, slots: int) -> Row:
    if slots >= JUDGED_SLOTS:
        return _drain_row(label, value, CORE_TARGET)
    return _drain_row(f"(info) {label}", value, None)


def _pgbouncer_row(results: dict[str, Any], options: argparse.Namespace, jobs: int) -> Row:
    """The core drain through PgBouncer (transaction mode), as a ratio to the direct one."""
    label = (f"(info) core drain through PgBouncer, transaction mode, `--slots "
             f"{options.core_slots}`, {jobs:,} jobs, vs direct")
    value, direct = results.get("pgbouncer"), results.get("core")
    if (reason := _failed(value)) is not None:
        return Row(label, reason)
    if not isinstance(value, DrainResult):
        return Row(label, "not run")
    if not isinstance(direct, DrainResult):
        return Row(label, rate(value.rate), "direct: not run")
    return Row(label, rate(value.rate), f"direct: {rate(direct.rate)}",
               times(value.rate / direct.rate))


def _core_rows(results: dict[str, Any], options: argparse.Namespace) -> list[Row]:
    found = []
    core = results.get("core")
    jobs = core.jobs if isinstance(core, DrainResult) else options.sizes.drain_jobs
    if "core" in results:
        found.append(_core_drain_row(f"core drain: async no-op, `akadze worker --slots "
                                     f"{options.core_slots}`, {jobs:,} jobs", core,
                                     options.core_slots))
    if "pgbouncer" in results:
        found.append(_pgbouncer_row(results, options, jobs))
    sweep = results.get("sweep")
    if isinstance(sweep, dict):
        size = options.sizes.sweep_jobs
        for slots in options.sweep:
            found.append(_core_drain_row(f"core drain, `--slots {slots}`, {size:,} jobs",
                                         sweep.get(f"slots {slots}"), slots))
        quiet, loud = sweep.get("quiet"), sweep.get("default")
        row = _drain_row(f"core drain, `--slots {options.core_slots} --log-level WARNING` vs "
                         f"default INFO, {size:,} jobs", quiet, None)
        if isinstance(quiet, DrainResult) and isinstance(loud, DrainResult):
            row.comparison = f"INFO: {rate(loud.rate)}"
            row.ratio = times(quiet.rate / loud.rate)
        found.append(row)
    elif sweep is not None:
        found.append(Row("core drain sweep", _failed(sweep) or "?"))
    return found


def _compat_rows(results: dict[str, Any], options: argparse.Namespace) -> list[Row]:
    if "compat" not in results and "celery" not in results:
        return []
    found = []
    compat = results.get("compat")
    unavailable = _failed(compat) if compat is not None else "not run"
    best: tuple[str, DrainResult] | None = None
    drains: dict[str, DrainResult] = {}
    for key, pool, concurrency in pools(options):
        label = (f"compat drain: sync no-op, `akadze-compat worker -P {pool} "
                 f"-c {concurrency}`")
        value = compat.get(key) if isinstance(compat, dict) else None
        if unavailable is not None:
            found.append(Row(label, unavailable, target=f"≥ {COMPAT_TARGET:,} jobs/s"))
            continue
        found.append(_drain_row(f"{label}, {options.sizes.compat_jobs:,} jobs", value,
                                COMPAT_TARGET))
        if isinstance(value, DrainResult):
            drains[key] = value
            if best is None or value.rate > best[1].rate:
                best = (f"{pool} -c {concurrency}", value)
    celery = results.get("celery")
    for broker, goal in SAME_POOL_TARGETS.items():
        found += _versus_celery(broker, goal, celery, drains, best, unavailable, options)
    found += _threads_rows(celery, drains, unavailable, options)
    core = results.get("core")
    redis = celery.get("Redis prefork") if isinstance(celery, dict) else None
    if isinstance(core, DrainResult) and isinstance(redis, DrainResult):
        found.append(Row(f"(info) core async drain vs Celery + Redis `-P prefork -c "
                         f"{options.prefork}`", rate(core.rate), rate(redis.rate),
                         times(core.rate / redis.rate)))
    return found


def _celery_reference(celery: Any, broker: str, pool: str) -> tuple[Any, str]:
    """Celery's drain on ``broker`` with ``pool``, and its figure as the comparison's text."""
    reference = celery.get(f"{broker} {pool}") if isinstance(celery, dict) else celery
    if reference is None:
        return None, "not run"
    if (reason := _failed(reference)) is not None:
        return reference, reason
    return reference, rate(reference.rate)


def _versus_celery(broker: str, goal: float, celery: Any, drains: dict[str, DrainResult],
                   best: tuple[str, DrainResult] | None, unavailable: str | None,
                   options: argparse.Namespace) -> list[Row]:
    """Celery's prefork drain on ``broker``: the facade's prefork against it (judged, the
    same pool on both sides), and the facade's best drain (information)."""
    reference, text = _celery_reference(celery, broker, "prefork")
    label = f"Celery 5.7 + {broker}, `-P prefork -c {options.prefork}`"
    same = drains.get("prefork")
    row = Row(f"compat prefork vs {label}, the same pool",
              rate(same.rate) if same else unavailable or "—", text, target=f"≥ {goal:g}x")
    _versus(row, same, reference, goal)
    info = Row(f"(info) compat best vs {label}", unavailable or "—", text)
    if best is not None:
        info.akadze = f"{rate(best[1].rate)} ({best[0]})"
        if isinstance(reference, DrainResult):
            info.ratio = times(best[1].rate / reference.rate)
    return [row, info]


def _threads_rows(celery: Any, drains: dict[str, DrainResult], unavailable: str | None,
                  options: argparse.Namespace) -> list[Row]:
    """The facade's threads pool: its faster drain (normally the wide one) judged against
    the reference drain, Celery + Redis prefork; ``-c --threads`` beside Celery's threads
    drain of the same width on each broker (information)."""
    found = []
    reference, text = _celery_reference(celery, "Redis", "prefork")
    widths = " and ".join(f"`-c {c}`" for key, pool, c in pools(options) if pool == "threads")
    candidates = [(f"threads -c {c}", drains[key]) for key, pool, c in pools(options)
                  if pool == "threads" and key in drains]
    fastest = max(candidates, key=lambda item: item[1].rate) if candidates else None
    row = Row(f"compat threads, the faster of {widths}, vs Celery 5.7 + Redis `-P prefork -c "
              f"{options.prefork}` (the issue's reference drain)",
              f"{rate(fastest[1].rate)} ({fastest[0]})" if fastest else unavailable or "—",
              text, target=f"≥ {THREADS_TARGET:g}x")
    _versus(row, fastest[1] if fastest else None, reference, THREADS_TARGET)
    found.append(row)
    ours = drains.get("threads")
    for broker in SAME_POOL_TARGETS:
        reference, text = _celery_reference(celery, broker, "threads")
        row = Row(f"(info) compat threads vs Celery 5.7 + {broker}, `-P threads -c "
                  f"{options.threads}`, the same pool",
                  rate(ours.rate) if ours else unavailable or "—", text)
        if ours is not None and isinstance(reference, DrainResult):
            row.ratio = times(ours.rate / reference.rate)
        found.append(row)
    return found


def _oban_rows(results: dict[str, Any], options: argparse.Namespace) -> list[Row]:
    """Oban for Python beside akadze's core worker: the same no-ops, the same concurrency,
    taking turns; medians of the rounds."""
    if "oban" not in results:
        return []
    value = results["oban"]
    limit, jobs = options.oban_limit, options.sizes.oban_jobs
    label = (f"core `akadze worker --slots {limit}` vs Oban {oban_side.OBAN_VERSION} (Python) "
             f"`oban start --queues bench:{limit}`, async no-op, {jobs:,} jobs")
    if not isinstance(value, dict):
        return [Row(label, "—", _failed(value) or "?")]

    def drains(side: str) -> list[DrainResult]:
        return [v for k, v in value.items()
                if k.startswith(f"{side} round") and isinstance(v, DrainResult)]

    def failures(side: str) -> str | None:
        reasons = [r for k, v in value.items()
                   if k.startswith(f"{side} round") and (r := _failed(v)) is not None]
        return reasons[0] if reasons else None

    def median_text(found: list[DrainResult]) -> str:
        text = rate(statistics.median(d.rate for d in found))
        if len(found) > 1:
            text += f" (median of {len(found)}: " + ", ".join(
                f"{d.rate:,.0f}" for d in found) + ")"
        return text

    ours, theirs = drains("akadze"), drains("Oban")
    row = Row(label, median_text(ours) if ours else failures("akadze") or "—",
              median_text(theirs) if theirs else failures("Oban") or "—")
    if ours and theirs:
        row.ratio = times(statistics.median(d.rate for d in ours)
                          / statistics.median(d.rate for d in theirs))
    found = [row]
    enqueued = [v for k, v in value.items()
                if k.startswith("Oban enqueue_many") and isinstance(v, float)]
    if enqueued:
        found.append(Row(f"(info) Oban `enqueue_many`, 1,000 per call, {jobs:,} jobs (its "
                         "open-source engine inserts row by row in one transaction)",
                         "—", rate(statistics.median(enqueued))))
    found += _oban_latency_rows(value, limit)
    return found


def _oban_latency_rows(value: dict[str, Any], limit: int) -> list[Row]:
    ours, theirs = value.get("akadze latency"), value.get("Oban latency")
    if ours is None and theirs is None:
        return []
    found = []
    for name in ("p50", "p99"):
        row = Row(f"latency enqueue commit → task start, idle worker: `akadze worker --slots "
                  f"{limit}` vs `oban start --queues bench:{limit}`, {name}",
                  _failed(ours) or ms(getattr(ours, name, None)),
                  _failed(theirs) or ms(getattr(theirs, name, None)))
        if _failed(ours) is None and _failed(theirs) is None and ours and theirs:
            row.ratio = times(getattr(ours, name) / getattr(theirs, name))
            row.comparison += f" ({theirs.samples} samples, max {ms(theirs.max)})"
        found.append(row)
    return found


def _versus(row: Row, ours: DrainResult | None, reference: Any, goal: float) -> None:
    """Fill ``row``'s ratio and verdict when both drains ran."""
    if ours is not None and isinstance(reference, DrainResult):
        ratio = ours.rate / reference.rate
        row.ratio, row.verdict = times(ratio), verdict(ratio >= goal)


def _enqueue_rows(results: dict[str, Any], sizes: Any) -> list[Row]:
    found = []
    single = results.get("enqueue")
    if single is not None:
        label = f"single enqueue, one transaction each ({sizes.single_enqueue:,} jobs)"
        if (reason := _failed(single)) is not None:
            found.append(Row(label, reason))
        else:
            ratio = single.ratio
            found.append(Row(f"{label}: `enqueue()` vs bare psycopg INSERT",
                             rate(single.akadze), f"bare: {rate(single.bare)}",
                             f"{ratio:.0%}", "≥ 90 %", verdict(ratio >= 0.9)))
            if single.compat is not None and single.compat_ratio is not None:
                ratio = single.compat_ratio
                found.append(Row("(info) single `.delay()` (akadze_compat) vs the same bare "
                                 "INSERT as `enqueue()`", rate(single.compat),
                                 f"bare: {rate(single.bare)}", f"{ratio:.0%}", "—", "—"))
                same = single.compat_ratio_same_row
                if same is not None and single.bare_compat_row is not None:
                    found.append(Row(
                        "single `.delay()` vs bare psycopg INSERT of the row it writes "
                        "(Celery's args and meta, its own uuid4 task id)", rate(single.compat),
                        f"bare: {rate(single.bare_compat_row)}", f"{same:.0%}", "≥ 95 %",
                        verdict(same >= 0.95)))
            else:
                found.append(Row("single `.delay()` (akadze_compat)",
                                 f"not available ({single.compat_error})"))
    found += _concurrent_rows(results)
    bulk = results.get("bulk")
    if bulk is not None:
        label = f"bulk `enqueue_many`, {sizes.bulk_batch:,} per call, {sizes.bulk_jobs:,} jobs"
        if (reason := _failed(bulk)) is not None:
            found.append(Row(label, reason))
        else:
            sql_only = (f" (its SQL alone: {rate(bulk.akadze_sql_only)})"
                        if bulk.akadze_sql_only else "")
            found.append(Row(label, rate(bulk.akadze), f"COPY: {rate(bulk.copy)}{sql_only}",
                             times(bulk.akadze / bulk.copy), f"≥ {BULK_TARGET:,} jobs/s",
                             verdict(bulk.akadze >= BULK_TARGET)))
    return found


def _concurrent_rows(results: dict[str, Any]) -> list[Row]:
    value = results.get("concurrent")
    if value is None:
        return []
    label = "(info) concurrent `.delay()`, N client processes, one transaction each"
    if (reason := _failed(value)) is not None:
        return [Row(label, reason)]
    return [Row(f"{label}: N = {clients}", rate(value.delay[clients]),
                f"bare INSERT of its row, no NOTIFY: {rate(value.bare[clients])}",
                f"{value.delay[clients] / value.bare[clients]:.0%}", "—",
                f"{value.notices.get(clients, 0.0):.1%} notified")
            for clients in value.delay]


def _latency_rows(results: dict[str, Any]) -> list[Row]:
    value = results.get("latency")
    if value is None:
        return []
    if (reason := _failed(value)) is not None:
        return [Row("latency, enqueue commit → task start", reason)]
    label = f"latency enqueue commit → task start, idle worker ({value.samples} samples)"
    return [Row(f"{label}, p50", ms(value.p50), target="≤ 3 ms", verdict=verdict(value.p50 <= 3)),
            Row(f"{label}, p99", ms(value.p99), f"max {ms(value.max)}", target="≤ 15 ms",
                verdict=verdict(value.p99 <= 15))]


#: One worker's scheduling with 10,000 runtime schedules, per second of wall time.
SCHEDULES_CPU_TARGET = 50.0
#: "Never delays claims": the probes' p99 with the schedules within this of the one without.
SCHEDULES_CLAIM_SLACK = 5.0


def _schedules_rows(results: dict[str, Any]) -> list[Row]:
    value = results.get("schedules")
    if value is None:
        return []
    if (reason := _failed(value)) is not None:
        return [Row("runtime schedules", reason)]
    count, without, with_ = value.schedules, value.without, value.with_schedules
    label = f"{count:,} runtime schedules (half every 60s, half cron)"
    cpu_ok = value.cpu_cost < SCHEDULES_CPU_TARGET
    worst_ok = value.worst_second_cost < SCHEDULES_CPU_TARGET
    claims_ok = with_.p99 <= without.p99 + SCHEDULES_CLAIM_SLACK
    boundary = with_.boundary_p99
    boundary_ok = None if boundary is None else boundary <= without.p99 + SCHEDULES_CLAIM_SLACK
    slack = f"≤ without + {SCHEDULES_CLAIM_SLACK:g} ms"
    return [
        Row(f"{label}: one worker's scheduling CPU, mean over {with_.seconds:g}s",
            f"{value.cpu_cost:.1f} ms/s",
            f"worker {with_.cpu_per_second:.1f} ms/s vs {without.cpu_per_second:.1f} without",
            target=f"< {SCHEDULES_CPU_TARGET:g} ms/s", verdict=verdict(cpu_ok)),
        Row(f"{label}: its worst second (a minute boundary: {count // 2:,} ticks at once)",
            f"{value.worst_second_cost:.0f} ms/s",
            f"worker {with_.cpu_worst_second:.0f} ms vs median second without "
            f"{without.cpu_median_second:.0f} ms", target=f"< {SCHEDULES_CPU_TARGET:g} ms/s",
            verdict=verdict(worst_ok)),
        Row(f"{label}: claim latency (probe every 50 ms, commit → start), p99",
            ms(with_.p99), f"without: {ms(without.p99)} (p50 {ms(with_.p50)} vs "
            f"{ms(without.p50)}; max {ms(with_.max)} vs {ms(without.max)})",
            target=slack, verdict=verdict(claims_ok)),
        Row(f"{label}: claim latency of the {with_.boundary_probes} probes sent in the 2 s "
            f"after a minute boundary ({', '.join(value.boundaries)}), p99",
            ms(boundary), f"without, all probes: {ms(without.p99)}; max {ms(with_.boundary_max)}",
            target=slack, verdict=verdict(boundary_ok)),
        Row(f"(info) {label}: the worker's CPU from registering until quiet (the first "
            "load of the timetable)", f"{with_.settle_cpu:.2f} s",
            f"without: {without.settle_cpu:.2f} s"),
        Row(f"{label}: tick jobs enqueued, duplicates", f"{value.tick_jobs:,}, "
            f"{value.duplicate_ticks} duplicate", target="0 duplicates",
            verdict=verdict(value.duplicate_ticks == 0)),
    ]


def _metrics_rows(results: dict[str, Any]) -> list[Row]:
    """render_metrics' server time, and claims with and without scrapes."""
    value = results.get("metrics")
    if value is None:
        return []
    if (reason := _failed(value)) is not None:
        return [Row("metrics", reason)]
    table = f"{value.jobs:,} jobs ({value.failed:,} failed)"
    target_ms = metrics_workload.RENDER_TARGET_MS
    ratio_target = metrics_workload.CLAIM_RATIO_TARGET
    scraped, unscraped = value.rate(True), value.rate(False)
    no_port = value.no_port_rate
    return [
        Row(f"metrics: `render_metrics` (the dashboard's /metrics) server time, {table}, "
            f"median of {value.renders}", ms(value.render_p50),
            f"p99 {ms(value.render_p99)}, max {ms(value.render_max)}; "
            f"{value.body_bytes:,} bytes", target=f"< {target_ms:g} ms",
            verdict=verdict(value.render_p50 < target_ms)),
        Row(f"metrics: CPU of one `render_metrics` (Python + its Postgres backend), {table}",
            ms(value.render_cpu_client + value.render_cpu_postgres),
            f"Python {ms(value.render_cpu_client)}, Postgres "
            f"{ms(value.render_cpu_postgres)}: the server time on an idle core",
            target=f"< {target_ms:g} ms",
            verdict=verdict(value.render_cpu_client + value.render_cpu_postgres < target_ms)),
        Row(f"metrics: claims of one `akadze worker --slots 10 --metrics-port` draining "
            f"{value.drain_jobs:,} no-ops beside {table}, scraped (its /metrics and "
            "`render_metrics`, 1/s) vs not, in turns", rate(scraped),
            f"not scraped: {rate(unscraped)}; worker scrape p50 "
            f"{ms(value.worker_scrape_p50)}", ratio=times(value.ratio),
            target=f"≥ {ratio_target:g}x", verdict=verdict(value.ratio >= ratio_target)),
        Row("(info) metrics: the same drains without --metrics-port (nothing counted)",
            rate(no_port), f"with the port, not scraped: {rate(unscraped)}",
            ratio=times(unscraped / no_port if no_port else None)),
    ]


def _claim_rows(results: dict[str, Any]) -> list[Row]:
    value = results.get("claim")
    if value is None:
        return []
    if (reason := _failed(value)) is not None:
        return [Row("claim latency", reason)]
    small = value.get("small")
    found = []
    for key in ("large", "future", "drained"):
        other = value.get(key)
        if other is None or small is None:
            continue
        target = "≤ 1.5x"
        if key == "large":
            label = (f"claim_jobs(limit {other.limit}) p50: {other.backlog:,} queued vs "
                     f"{small.backlog:,}")
        elif key == "future":
            label = (f"claim_jobs(limit {other.limit}) p50: {other.backlog:,} due + "
                     f"{other.future:,} future vs {small.backlog:,} due")
        else:  # not one of the targets: what a long drain without VACUUM does
            label = (f"(info) claim_jobs(limit {other.limit}) p50: {other.backlog:,} queued "
                     f"behind {other.finished:,} just finished, not vacuumed, vs "
                     f"{small.backlog:,}")
            target = "—"
        ratio = other.p50 / small.p50
        found.append(Row(label, ms(other.p50), ms(small.p50), times(ratio), target,
                         verdict(ratio <= 1.5) if target != "—" else "—"))
    return found


def _memory_rows(results: dict[str, Any], options: argparse.Namespace) -> list[Row]:
    # The long drain of the "memory" workload; without it, the core drain's worker.
    value, slots = results.get("memory"), options.memory_slots
    if value is None:
        value, slots = results.get("core"), options.core_slots
    if value is None:
        return []
    label = "worker RSS over a long core drain"
    if (reason := _failed(value)) is not None:
        return [Row(label, reason, target="flat (≤ 1.10x)")]
    if not isinstance(value, DrainResult) or not value.rss_start or not value.rss_end:
        return [Row(label, "not measured", target="flat (≤ 1.10x)")]
    ratio = value.rss_end / value.rss_start
    speed = f"{value.rate:,.0f} jobs/s"
    if value.rate_first is not None and value.rate_last is not None:
        speed += f" (first 10 % {value.rate_first:,.0f}, last 10 % {value.rate_last:,.0f})"
    rows = [Row(f"worker RSS over the {value.jobs:,}-job drain, `--slots {slots}`: at 10 % → "
                f"end", f"{mib(value.rss_start)} → {mib(value.rss_end)}",
                f"first {mib(value.rss_first)}, peak {mib(value.rss_peak)}; {speed}",
                times(ratio), "flat (≤ 1.10x)", verdict(ratio <= 1.10))]
    if value is results.get("memory"):  # the long drain's rate is a core drain figure too
        rows.insert(0, _core_drain_row(f"core drain: async no-op, `akadze worker --slots "
                                       f"{slots}`, {value.jobs:,} jobs", value, slots))
    return rows


def _tenths(drain: DrainResult) -> str:
    """``12,000 → 9,000`` (jobs/s over the first and the last tenth of the jobs)."""
    if drain.rate_first is None or drain.rate_last is None:
        return "—"
    return f"{drain.rate_first:,.0f} → {drain.rate_last:,.0f}"


def _drains(results: dict[str, Any]) -> list[tuple[str, DrainResult]]:
    found = []
    for key, value in results.items():
        if isinstance(value, DrainResult):
            found.append((key, value))
        elif isinstance(value, dict):
            found += [(f"{key} {name}", item) for name, item in value.items()
                      if isinstance(item, DrainResult)]
    return found


def document(table_rows: list[Row], results: dict[str, Any], facts: dict[str, str],
             loads: list[tuple[str, float, str, str]], load_before: str, load_after: str,
             options: argparse.Namespace) -> str:
    """The Markdown written to bench/results.md (and printed)."""
    command = "python -m bench " + shlex.join(sys.argv[1:]) if sys.argv[1:] else \
        "python -m bench"
    lines = ["# akadze benchmark results", "",
             f"`{command}` — {'quick' if options.quick else 'full'} sizes, "
             f"{facts.get('date', '')}.", "",
             markdown(table_rows), "",
             "## Machine", ""]
    lines += [f"- {key}: {value}" for key, value in facts.items() if key != "date"]
    lines += [f"- Celery: {celery_side.CELERY_VERSION} in its own virtualenv; brokers "
              + ", ".join(f"{name} {url}" for name, url in celery_side.BROKERS.items()),
              *([f"- Oban: {oban_side.OBAN_VERSION} (Python) in its own virtualenv, "
                 "`oban start` with the CLI's defaults (INFO log, pool of 10), its own "
                 "database per drain"] if "oban" in results else []),
              f"- load average (1, 5, 15 min) at start: {load_before}; at end: {load_after}",
              "", "## Per workload", "",
              "| workload | took | load before | load after |", "|---|---|---|---|"]
    lines += [f"| {name} | {took:.0f} s | {before} | {after} |"
              for name, took, before, after in loads]
    drains = _drains(results)
    if drains:
        lines += ["", "## Drains: where the CPU went", "",
                  "Worker CPU is the worker process (tree) during the drain window; Postgres "
                  "CPU is the backends serving it, over their lifetime (Celery: not "
                  "measured).", "",
                  "| drain | jobs | seconds | jobs/s | jobs/s, first → last 10 % "
                  "| worker CPU µs/job | Postgres CPU µs/job | log |",
                  "|---|---|---|---|---|---|---|---|"]
        for name, drain in drains:
            worker = (f"{drain.worker_cpu / drain.succeeded * 1e6:,.0f}"
                      if drain.worker_cpu is not None and drain.succeeded else "—")
            postgres = (f"{drain.postgres_cpu / drain.succeeded * 1e6:,.0f}"
                        if drain.postgres_cpu is not None and drain.succeeded else "—")
            lines.append(f"| {name} | {drain.succeeded:,} | {drain.seconds:.1f} | "
                         f"{drain.rate:,.0f} | {_tenths(drain)} | {worker} | {postgres} | "
                         f"`{drain.log}` |")
    lines.append("")
    return "\n".join(lines)


GROUP_TARGET = 100_000
FAN_IN_TARGET = 1.2
CHORD_VS_CELERY = 5.0


def _canvas_rows(results: dict[str, Any], options: argparse.Namespace) -> list[Row]:
    """A group's enqueue, a chord against a group's drain and against
    Celery's chord, a chain's step latency, the statements of a chord's completion path."""
    value = results.get("canvas")
    if value is None:
        return []
    if (reason := _failed(value)) is not None:
        return [Row("canvas", reason)]
    core = value.get("core")
    errors = getattr(core, "errors", {})
    sizes = options.sizes
    found: list[Row] = []

    def missing(label: str, part: str) -> Row:
        return Row(label, errors.get(part, "not run"))

    label = (f"canvas: `Workflow` of {sizes.canvas_members:,} no-op nodes (`add_many`), one "
             "statement")
    figures = getattr(core, "enqueue", None)
    if figures is None:
        found.append(missing(label, "enqueue"))
    else:
        found.append(Row(label, rate(figures.workflow),
                         f"`enqueue_many`, one call: {rate(figures.enqueue_many)}",
                         times(figures.workflow / figures.enqueue_many),
                         f"≥ {GROUP_TARGET:,} jobs/s", verdict(figures.workflow >= GROUP_TARGET)))
        found.append(Row(f"(info) canvas: the {figures.jobs:,}-node workflow's time: "
                         "add_many() → params() → the statement",
                         f"{figures.add_seconds * 1000:.0f} → {figures.params_seconds * 1000:.0f}"
                         f" → {figures.statement_seconds * 1000:.0f} ms"))
        if figures.add_loop:
            found.append(Row(f"(info) canvas: the same {figures.jobs:,}-node workflow built "
                             "with one `add()` per node", rate(figures.add_loop),
                             f"`add_many`: {rate(figures.workflow)}",
                             times(figures.add_loop / figures.workflow)))
    slots = options.canvas_slots
    label = (f"canvas: fan-in of {sizes.canvas_members:,} no-op members → body start, idle "
             f"`akadze worker --slots {slots}`")
    fan_in = getattr(core, "fan_in", None)
    if fan_in is None:
        found.append(missing(label, "fan_in"))
    else:
        found.append(Row(label, f"{fan_in.chord:.2f} s",
                         f"the same without a body, drained: {fan_in.plain:.2f} s",
                         times(fan_in.ratio), f"≤ {FAN_IN_TARGET:g}x",
                         verdict(fan_in.ratio <= FAN_IN_TARGET)))
    chain = getattr(core, "chain", None)
    label = f"canvas: chain of {sizes.canvas_steps:,} no-op steps, step → next step start"
    if chain is None:
        found.append(missing(label, "chain"))
    else:
        for name, ours, single in (("p50", chain.p50, chain.single_p50),
                                   ("p99", chain.p99, chain.single_p99)):
            found.append(Row(f"{label}, {name}", ms(ours),
                             f"single enqueue → start {name}: {ms(single)} "
                             f"({chain.single_samples} samples, database clock)",
                             f"{ours - single:+.2f} ms", "≤ single + 1 ms",
                             verdict(ours <= single + 1.0)))
    found += _statement_rows(core, errors, sizes)
    found += _chord_rows(value, core, sizes, options)
    return found


def _statement_rows(core: Any, errors: dict[str, str], sizes: Any) -> list[Row]:
    label = (f"canvas: worker transactions, chord drain vs plain drain of "
             f"{sizes.canvas_members:,} members")
    figures = getattr(core, "statements", None)
    if figures is None:
        return [Row(label, errors.get("statements", "not run"))]
    info = [
        Row("(info) canvas: `akadze.settle` calls (one per outcome flush) and rows updated, "
            "chord vs plain", f"settle {figures.chord_settles:,}; updates "
            f"{figures.chord_updates:,}", f"settle {figures.plain_settles:,}; updates "
            f"{figures.plain_updates:,}",
            f"+{figures.chord_updates - figures.plain_updates:,} rows"),
    ]
    if figures.chord_calls is None:
        # No per-statement counts: the difference is batching noise plus the body's own
        # claim and outcome, far from one per member.
        allowed = max(10, 0.05 * figures.plain_xacts)
        extra = figures.chord_xacts - figures.plain_xacts
        return [Row(label, f"{figures.chord_xacts:,}", f"plain: {figures.plain_xacts:,}",
                    f"{figures.extra_per_member:+.3f} per member",
                    f"no extra per member (≤ plain + {allowed:,.0f})",
                    verdict(extra <= allowed)), *info]
    # pg_stat_statements: one statement more per member would add ``members`` calls; a
    # twentieth of that is what batching and the body's own claim cannot reach.
    members = figures.members
    allowed = max(10, members // 20)
    text, grown = figures.most_grown()
    plain_writes, chord_writes = figures.outcome_writes()
    return [
        Row(f"canvas: statements per member beyond the batched outcome write, chord drain vs "
            f"plain drain of {members:,} members (pg_stat_statements)",
            f"{grown / members:+.3f} per member", f"most grown: `{text[:60]}` {grown:+,}",
            "—", f"0 (≤ +{allowed:,} calls of any statement)", verdict(grown <= allowed)),
        Row("(info) canvas: batched outcome writes (job_complete_many), chord vs plain",
            f"{chord_writes:,} ({chord_writes / members:.3f} per member)",
            f"{plain_writes:,} ({plain_writes / members:.3f} per member)",
            "batching, not statements per member"),
        Row(f"(info) {label}", f"{figures.chord_xacts:,}", f"plain: {figures.plain_xacts:,}",
            f"{figures.extra_per_member:+.3f} per member"),
        *info,
    ]


def _chord_rows(value: dict[str, Any], core: Any, sizes: Any,
                options: argparse.Namespace) -> list[Row]:
    found = []
    celery, compat = value.get("celery"), value.get("compat")
    members = sizes.canvas_chord
    reference = celery_text = None
    if celery is None:
        celery_text = "not run"
    elif (reason := _failed(celery)) is not None:
        celery_text = reason
    else:
        reference = celery.seconds
        celery_text = f"{celery.seconds:.2f} s (publishing {celery.publish_seconds:.2f} s)"
    label = (f"canvas: compat `chord(group({members:,} noop.s()), body.s())` → body start, "
             f"`-P prefork -c {options.prefork}`, vs Celery 5.7 + Redis")
    row = Row(label, "—", celery_text, target=f"≥ {CHORD_VS_CELERY:g}x faster")
    if compat is None or (reason := _failed(compat)) is not None:
        row.akadze = "not run" if compat is None else str(reason)
    else:
        row.akadze = f"{compat.seconds:.2f} s"
        if reference is not None:
            ratio = reference / compat.seconds
            row.ratio, row.verdict = times(ratio), verdict(ratio >= CHORD_VS_CELERY)
    found.append(row)
    label = f"canvas: compat `group({members:,} noop.s()).apply_async()`"
    group_rate = getattr(compat, "group_rate", None)
    # Beside the core's bulk insert on the same machine in the same run: the target is
    # "like enqueue_many", and what a 2-core machine shared with other work gives varies.
    bulk = getattr(core, "enqueue", None)
    versus = ratio_text = "—"
    if group_rate and bulk is not None:
        versus = f"`enqueue_many` of {bulk.jobs:,}, one call: {rate(bulk.enqueue_many)}"
        ratio_text = times(group_rate / bulk.enqueue_many)
    found.append(Row(label, rate(group_rate) if group_rate else row.akadze, versus, ratio_text,
                     target=f"≥ {GROUP_TARGET:,} jobs/s",
                     verdict=verdict(group_rate >= GROUP_TARGET) if group_rate else "—"))
    fan_in = getattr(core, "fan_in", None)
    if reference is not None and fan_in is not None and fan_in.members == members:
        found.append(Row(f"(info) canvas: core fan-in of {members:,} (`--slots "
                         f"{fan_in.slots}`) vs Celery 5.7 + Redis chord",
                         f"{fan_in.chord:.2f} s", f"{reference:.2f} s",
                         times(reference / fan_in.chord)))
    return found


def _dashboard_rows(results: dict[str, Any]) -> list[Row]:
    """Each dashboard page's server time (worst of its runs)."""
    value = results.get("dashboard")
    if value is None:
        return []
    if (reason := _failed(value)) is not None:
        return [Row("dashboard", reason)]
    found = []
    for page in value.pages:
        label = f"dashboard, {value.jobs:,} jobs ({value.failed:,} failed): {page.name}"
        if page.path == "/metrics" and page.status == 404:
            found.append(Row(label, "not available in this build"))
            continue
        target = METRICS_TARGET_MS if page.path == "/metrics" else TARGET_MS
        ok = page.status in (200, 303) and page.worst < target
        found.append(Row(label, f"{page.worst:.0f} ms (median {page.median:.0f} ms)",
                         target=f"< {target:.0f} ms", verdict=verdict(ok)))
    return found


#: A limit that does not bind costs at most a fifth of the drain's jobs/s.
LIMITS_RATIO_TARGET = 0.8


def _limits_rows(results: dict[str, Any]) -> list[Row]:
    value = results.get("limits")
    if value is None:
        return []
    if (reason := _failed(value)) is not None:
        return [Row("rate limits", reason)]
    first = ", ".join(f"{key} {at:.2f} s" for key, at in value.fair_first_start.items())
    starts = ", ".join(f"{key} {count}" for key, count in value.fair_starts.items())
    return [
        Row("core drain under a rate limit that does not bind / without",
            f"{value.ratio:.2f}x", f"{rate(value.limited_rate)} vs {rate(value.free_rate)}",
            target=f"≥ {LIMITS_RATIO_TARGET:g}x",
            verdict=verdict(value.ratio >= LIMITS_RATIO_TARGET)),
        Row(f"most starts in any 1 s window under {value.exact_rate}/s, 4 workers "
            "(started_at, database clock)", str(value.exact_most),
            f"rate reached {value.exact_reached:.1f}/s", target=f"≤ {value.exact_rate}",
            verdict=verdict(value.exact_most <= value.exact_rate)),
        Row("key fairness, 3 keys at max 2, the deep one ahead: least / most starts while "
            "all waited", f"{value.fair_share:.2f}", f"first starts: {first}; starts: {starts}"),
    ]
