"""The benchmark harness runs end to end at a tiny size (no Celery, no speed asserted:
speed targets live in bench/, not in the test suite)."""

from __future__ import annotations

import json
import uuid
from pathlib import Path

import pytest

from bench import run as bench_run

pytestmark = pytest.mark.slow


def test_the_core_drain_runs_and_reports_numbers(admin_url: str, tmp_path: Path) -> None:
    results = tmp_path / "results.md"
    run_dir = tmp_path / "run"
    options = bench_run.parse([
        "--only", "core,memory", "--drain-jobs", "200", "--memory-jobs", "300",
        "--admin-url", admin_url,
        "--database", f"akadze_bench_test_{uuid.uuid4().hex[:8]}",
        "--results", str(results), "--run-dir", str(run_dir)])

    assert bench_run.Bench(options).run() == 0

    figures = json.loads((run_dir / "results.json").read_text())
    core, memory = figures["core"], figures["memory"]
    assert core["succeeded"] == 200
    assert core["rate"] > 0
    assert memory["succeeded"] == 300
    assert memory["rss_start"] > 0 and memory["rss_end"] > 0
    assert "rate_first" in memory and "rate_last" in memory
    table = results.read_text()
    assert "core drain: async no-op, `akadze worker --slots 10`, 200 jobs" in table
    assert "worker RSS over the 300-job drain, `--slots 100`" in table


def test_the_ceiling_workload_runs_beside_the_worker(admin_url: str, tmp_path: Path) -> None:
    from bench import ceiling

    assert "ceiling" in bench_run.parse([]).workloads  # in the default run
    name = f"akadze_bench_test_{uuid.uuid4().hex[:8]}"
    result = ceiling.ceiling_workload(admin_url, name, 300, run_dir=tmp_path, drains=2,
                                      per_ceiling=2)

    assert result.failures == []
    assert len(result.ceilings) == 2 and min(result.ceilings) > 0  # ceiling, 2 drains, ceiling
    assert [drain.succeeded for drain in result.drains] == [300, 300]
    rows = ceiling.rows(result, 300)
    assert [row.target for row in rows] == ["≥ 90 %", "≥ 0.6x"]
    assert all(row.verdict in ("pass", "FAIL") for row in rows)


def test_the_database_name_is_checked() -> None:
    with pytest.raises(ValueError, match="akadze_bench"):
        bench_run.db.recreate("postgresql://nobody@127.0.0.1:1/postgres", "postgres")


def test_the_canvas_workload_runs_and_reports_numbers(admin_url: str, tmp_path: Path) -> None:
    from bench import canvas, db, table

    name = f"akadze_bench_test_{uuid.uuid4().hex[:8]}"
    url = db.recreate(admin_url, name)
    try:
        result = canvas.run_core(url, members=200, steps=20, samples=6, slots=10,
                                 run_dir=tmp_path, attempt=bench_run._attempt)
    finally:
        db.drop(admin_url, name)

    assert result.errors == {}
    assert result.enqueue is not None and result.enqueue.workflow > 0
    assert result.fan_in is not None and result.fan_in.chord > 0 and result.fan_in.plain > 0
    assert result.chain is not None and result.chain.p50 > 0
    statements = result.statements
    assert statements is not None and statements.chord_settles > 0
    if (canvas.DEFAULT_PG_BIN / "initdb").exists():  # counted per statement on its cluster
        plain_writes, chord_writes = statements.outcome_writes()
        assert plain_writes > 0 and chord_writes >= statements.chord_settles
        assert statements.most_grown()[1] < 200  # nothing one more call per member
    options = bench_run.parse(["--only", "canvas", "--canvas-members", "200",
                               "--canvas-steps", "20"])
    rows = table.rows({"canvas": {"core": result}}, options.sizes, options)
    assert any("fan-in of 200 no-op members" in row.workload for row in rows)
    assert any("beyond the batched outcome write" in row.workload or
               "worker transactions" in row.workload for row in rows)


def test_the_dashboard_workload_times_every_page(admin_url: str, tmp_path: Path) -> None:
    results = tmp_path / "results.md"
    run_dir = tmp_path / "run"
    options = bench_run.parse([
        "--only", "dashboard", "--dashboard-jobs", "2000", "--admin-url", admin_url,
        "--database", f"akadze_bench_test_{uuid.uuid4().hex[:8]}",
        "--results", str(results), "--run-dir", str(run_dir)])

    assert bench_run.Bench(options).run() == 0

    pages = json.loads((run_dir / "results.json").read_text())["dashboard"]["pages"]
    assert len(pages) >= 13
    assert all(page["status"] in (200, 303) for page in pages if page["path"] != "/metrics")
    assert all(len(page["times"]) == 10 and min(page["times"]) > 0 for page in pages)
    table = results.read_text()
    assert "dashboard, 2,000 jobs (20 failed): overview" in table
    assert "dashboard, 2,000 jobs (20 failed): a failed job" in table


def test_the_oban_workload_drains_beside_akadze(admin_url: str, tmp_path: Path) -> None:
    from bench import oban_side

    try:
        oban_side.oban_python(tmp_path / "oban-venv.log")
    except oban_side.ObanUnavailable as exc:
        pytest.skip(f"Oban's virtualenv cannot be built here: {exc}")
    results = tmp_path / "results.md"
    run_dir = tmp_path / "run"
    options = bench_run.parse([
        "--only", "oban", "--oban-jobs", "200", "--oban-limit", "8", "--latency-samples", "5",
        "--admin-url", admin_url, "--database", f"akadze_bench_test_{uuid.uuid4().hex[:8]}",
        "--results", str(results), "--run-dir", str(run_dir)])

    assert bench_run.Bench(options).run() == 0

    figures = json.loads((run_dir / "results.json").read_text())["oban"]
    assert figures["Oban round 1"]["succeeded"] == 200
    assert figures["Oban round 1"]["rate"] > 0
    assert figures["akadze round 1"]["succeeded"] == 200
    assert figures["Oban enqueue_many round 1"] > 0
    for side in ("Oban latency", "akadze latency"):
        assert figures[side]["samples"] == 5
        assert 0 < figures[side]["p50"] <= figures[side]["p99"]
    table = results.read_text()
    assert ("core `akadze worker --slots 8` vs Oban 0.7.0 (Python) `oban start --queues "
            "bench:8`, async no-op, 200 jobs") in table
    assert ("latency enqueue commit → task start, idle worker: `akadze worker --slots 8` vs "
            "`oban start --queues bench:8`, p99") in table


def test_celerys_chord_program_finishes_its_rounds(tmp_path: Path) -> None:
    """The Celery side of the canvas workload, at a small size, in Celery's virtualenv when
    it is there: each round's body result comes back and the figures are printed."""
    from bench import canvas, celery_side

    python = celery_side.DEFAULT_VENV / "bin" / "python"
    if not python.exists() or not celery_side.reachable(canvas.CELERY_CANVAS_URL):
        pytest.skip("no Celery virtualenv or no Redis here")
    run = canvas.celery_chord(python, 300, concurrency=2, run_dir=tmp_path, rounds=2,
                              timeout=300)

    assert len(run.runs) == 2 and min(run.runs) > 0
    assert run.publish_seconds > 0
