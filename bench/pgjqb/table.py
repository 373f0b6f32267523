"""The comparison table of a pgjqb run: one row per cell, one column per system.

Every figure is read from the harness's own summary.json of that cell (medians and peaks
over the adapter's samples of a phase; chaos aggregates ``jobs_lost`` and
``chaos_recovery_time_s``; n_dead_tup summed over the adapter's event tables).
"""

from __future__ import annotations

from typing import Any

PASS, FAIL = "pass", "FAIL"


def _phase(row: dict[str, Any], label: str) -> dict[str, Any]:
    summary = row.get("summary") or {}
    systems = summary.get("systems") or {}
    block = systems.get(row["system"]) or {}
    return (block.get("phases") or {}).get(label) or {}


def _metric(row: dict[str, Any], label: str, metric: str, key: str = "median") -> float | None:
    value = ((_phase(row, label).get("metrics") or {}).get(metric) or {}).get(key)
    return float(value) if value is not None else None


def _num(value: float | None, digits: int = 0) -> str:
    if value is None:
        return "—"
    if digits == 0:
        return f"{value:,.0f}"
    return f"{value:,.{digits}f}"


def _ms(value: float | None) -> str:
    if value is None:
        return "—"
    return f"{value:,.0f}" if value >= 100 else f"{value:.1f}"


def _labels(row: dict[str, Any]) -> list[str]:
    return [spec.split("=", 1)[0] for spec in row["phases"]]


def cell_text(row: dict[str, Any]) -> tuple[str, str | None]:
    """The figure of one cell for one system, and its verdict (None: no verdict)."""
    if row["rc"] != 0 and not row.get("summary"):
        return f"did not finish ({row['rc']}): {row.get('error') or ''}".strip(), FAIL
    failed = "timed out" if row["rc"] == "timeout" else "failed"
    status = "" if row["rc"] == 0 else f" — cell {failed}"
    kind = row["kind"]
    labels = _labels(row)
    if kind == "throughput":
        return (f"{_num(_metric(row, 'clean', 'completion_rate'))} jobs/s median "
                f"(peak {_num(_metric(row, 'clean', 'completion_rate', 'peak'))}); "
                f"dead tuples peak {_num(_phase(row, 'clean').get('peak_dead_tup'))}"
                f"{status}", None)
    if kind == "latency":
        return (f"p50 {_ms(_metric(row, 'clean', 'claim_p50_ms'))} / "
                f"p99 {_ms(_metric(row, 'clean', 'claim_p99_ms'))} ms; "
                f"{_num(_metric(row, 'clean', 'completion_rate'))} jobs/s{status}", None)
    if kind == "chaos":
        recovery = _phase(row, "recovery")
        back = recovery.get("chaos_recovery_time_s")
        lost = recovery.get("jobs_lost")
        enq = recovery.get("jobs_enqueued")
        base = recovery.get("baseline_completion_rate_median")
        rec_rate = _metric(row, "recovery", "completion_rate")
        came_back = (f"back to 90 % of baseline in {_num(back)} s" if back is not None
                     else "never back to 90 % of baseline")
        text = (f"{came_back}; baseline {_num(base)} → recovery {_num(rec_rate)} jobs/s; "
                f"enqueued - completed over chaos+recovery {_num(lost)} of {_num(enq)}"
                f"{status}")
        ok = back is not None and row["rc"] == 0
        return text, PASS if ok else FAIL
    # Pressure cells: the phase after the clean baseline is the pressure phase.
    pressure = labels[2] if len(labels) > 2 else labels[-1]
    offered = float(row["rate"]) * (1.5 if pressure.startswith("pressure") else 1.0)
    done = _metric(row, pressure, "completion_rate")
    p99_clean = _metric(row, "clean_1", "claim_p99_ms")
    p99 = _metric(row, pressure, "claim_p99_ms")
    p99_peak = _metric(row, pressure, "claim_p99_ms", "peak")
    depth_peak = _metric(row, pressure, "queue_depth", "peak")
    dead_peak = _phase(row, pressure).get("peak_dead_tup")
    rec = _phase(row, labels[-1])
    rec_depth = _metric(row, labels[-1], "queue_depth")
    extra = ""
    if rec.get("recovery_halflife_s") is not None:
        extra = f"; dead tuples down 90 % {_num(rec['recovery_halflife_s'])} s after release"
    held = done is not None and done >= 0.9 * offered and row["rc"] == 0
    text = (f"{_num(done)} of {_num(offered)} jobs/s offered; claim p99 {_ms(p99_clean)} "
            f"(clean) → {_ms(p99)} median / {_ms(p99_peak)} peak ms; queue depth peak "
            f"{_num(depth_peak)}, recovery median {_num(rec_depth)}; dead tuples peak "
            f"{_num(dead_peak)}{extra}{status}")
    return text, PASS if held else FAIL


def render(results: list[dict[str, Any]], meta: dict[str, Any]) -> str:
    """Markdown: the machine, the table, the cells' phases and loads."""
    systems: list[str] = meta["systems"]
    cells: list[str] = []
    for row in results:
        if row["cell"] not in cells:
            cells.append(row["cell"])
    by_key = {(r["cell"], r["system"]): r for r in results}
    out = ["# pgjqb: akadze in the independent job-queue harness", "",
           f"- Run: {meta['started']}, `{meta['command'].strip()}`",
           f"- Machine: {meta['machine']}",
           f"- Harness: hardbyte/postgresql-job-queue-benchmarking {meta['harness']}, run "
           f"natively (bench/pgjqb/native.py): a fresh private Postgres cluster "
           f"(`{meta['pg']}`, the harness's postgres.conf) per system and cell, no Docker; "
           f"the harness itself pins postgres:18.3-alpine",
           f"- Phase durations x{meta['scale']} "
           + "".join(f"({c} x{x}) " for c, x in meta.get("cell_scale", {}).items())
           + "of bench/pgjqb's cell table (the harness's "
           f"sweep runs 3-6 min phases); adapters sample every {meta['sample_every']} s; "
           "each adapter paces its own producer on real elapsed time "
           "(`PRODUCER_PACING=adapter`)",
           "- Other work shared the 2 cores: the load average before/after each cell is "
           "listed below", "",
           "| cell | " + " | ".join(systems) + " |",
           "|---|" + "---|" * len(systems)]
    for cell in cells:
        texts = []
        for system in systems:
            row = by_key.get((cell, system))
            if row is None:
                texts.append("not run")
                continue
            text, verdict = cell_text(row)
            texts.append(f"**{verdict}**: {text}" if verdict else text)
        out.append(f"| {cell} | " + " | ".join(texts) + " |")
    out += ["", "Verdicts: a chaos cell passes when completions get back to 90 % of the "
            "baseline median within the recovery phase (the harness's "
            "`chaos_recovery_time_s`); a pressure cell passes when the median completion "
            "rate of the pressure phase is at least 90 % of the offered rate. "
            "\"enqueued - completed\" is the harness's `jobs_lost` estimate: it counts "
            "the backlog still queued at the end too, not only lost jobs.", "",
            "## Cells", "", "| cell | system | settings | phases | seconds | load before → "
            "after |", "|---|---|---|---|---:|---|"]
    for row in results:
        settings = (f"{row['mode']} {row['rate']}/s" if row["mode"] == "fixed"
                    else "depth-target 4000") + (
            f", W={row['workers']}, replicas={row['replicas']}")
        out.append(f"| {row['cell']} | {row['system']} | {settings} | "
                   f"{' '.join(row['phases'])} | {row['seconds']} | {row['load_before']} → "
                   f"{row['load_after']} |")
    out.append("")
    return "\n".join(out)
