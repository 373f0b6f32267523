"""``python -m bench.ab`` runs end to end at a tiny size: HEAD built into its own virtualenv
against the working tree (no speed asserted: only that both builds drain and the summary
parses)."""

from __future__ import annotations

import json
import re
import statistics
import subprocess
import sys
from pathlib import Path

import psycopg
import pytest

from bench import ab

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

REPO = Path(__file__).resolve().parents[2]


def test_head_against_the_working_tree_drains_both_and_prints_ratios(
        admin_url: str, tmp_path: Path) -> None:
    figures = tmp_path / "ab.json"
    done = subprocess.run(
        [sys.executable, "-m", "bench.ab", "HEAD", "--rounds", "1", "--jobs", "60",
         "--threshold", "0", "--admin-url", admin_url, "--run-dir", str(tmp_path / "run"),
         "--json", str(figures)],
        cwd=REPO, capture_output=True, text=True, timeout=880, check=False)

    assert done.returncode == 0, done.stdout + done.stderr
    for kind in ("core", "compat"):
        assert re.search(rf"^round 1 {kind} +base HEAD +[\d,]+ jobs/s", done.stdout, re.M)
        assert re.search(rf"^round 1 {kind} +work +[\d,]+ jobs/s", done.stdout, re.M)
        assert re.search(rf"^{kind} +[\d,]+ +[\d,]+ +\d+\.\d{{3}}", done.stdout, re.M)
    saved = json.loads(figures.read_text())
    for kind in ("core", "compat"):
        for side in ("base HEAD", "work"):
            assert [r["succeeded"] for r in saved["figures"][kind][side]] == [60]


def test_a_drain_behind_a_backlog_counts_only_its_own_jobs(
        admin_url: str, tmp_path: Path) -> None:
    figures = tmp_path / "ab.json"
    with subprocess.Popen(
            [sys.executable, "-m", "bench.ab", "HEAD", "--rounds", "1", "--jobs", "60",
             "--backlog", "500", "--threshold", "0", "--admin-url", admin_url,
             "--run-dir", str(tmp_path / "run"), "--json", str(figures)],
            cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) as process:
        stdout, stderr = process.communicate(timeout=880)

    assert process.returncode == 0, stdout + stderr
    assert "behind 500 due jobs" in stdout
    assert len(re.findall(r"^bench\.ab: backlog of 500 \w+ jobs for", stdout, re.M)) == 4
    saved = json.loads(figures.read_text())
    for kind in ("core", "compat"):
        for side in ("base HEAD", "work"):
            assert [r["succeeded"] for r in saved["figures"][kind][side]] == [60]
    with psycopg.connect(admin_url, autocommit=True) as connection:
        left = connection.execute("SELECT count(*) FROM pg_database WHERE datname LIKE %s",
                                  (f"akadze_bench_ab_{process.pid}_tpl%",)).fetchone()
    assert left == (0,)  # the templates are dropped


def test_the_latency_mode_alternates_the_builds(admin_url: str, tmp_path: Path) -> None:
    figures = tmp_path / "ab.json"
    done = subprocess.run(
        [sys.executable, "-m", "bench.ab", "HEAD", "--rounds", "2", "--latency", "5",
         "--threshold", "0.01", "--admin-url", admin_url, "--run-dir", str(tmp_path / "run"),
         "--json", str(figures)],
        cwd=REPO, capture_output=True, text=True, timeout=880, check=False)

    assert done.returncode == 0, done.stdout + done.stderr
    # A p50 may be below zero on a loaded machine: it counts from the moment enqueue()
    # returned to the client, and the worker may start the body before the client runs on.
    for side in ("base HEAD", "work"):
        assert len(re.findall(rf"^round \d latency {side} +p50 +-?[\d.]+ ms", done.stdout,
                              re.M)) == 2
    assert re.search(r"^p50 +-?[\d.]+ +-?[\d.]+ +-?\d+\.\d{3}", done.stdout, re.M)
    saved = json.loads(figures.read_text())["latency"]
    assert [len(saved[side]) for side in ("base HEAD", "work")] == [2, 2]


def test_a_ratio_below_the_threshold_fails_the_run() -> None:
    def result(rate: float) -> ab.DrainResult:
        return ab.DrainResult(jobs=10, succeeded=10, seconds=10 / rate, rate=rate)

    figures = {"core": {"base": [result(100), result(110), result(90)],
                        "work": [result(95), result(100), result(80)]}}
    lines, held = ab.summarize(figures, ("base", "work"), 0.95)
    assert held is True  # 95 / 100
    lines, held = ab.summarize(figures, ("base", "work"), 0.96)
    assert held is False and "REGRESSION" in lines[-1]
    # The ratio's 95 % interval is printed beside it.
    assert "95 % interval" in lines[0]
    low, high = ab.interval([100, 110, 90], [95, 100, 80])
    assert f" {low:.3f}-{high:.3f} " in lines[-1]


def test_the_interval_of_the_ratio_holds_it_and_widens_with_the_noise() -> None:
    steady = [100.0, 102.0, 98.0, 101.0, 99.0, 100.0]
    assert ab.interval(steady, steady) == (1.0, 1.0)
    slower = [rate * 0.8 for rate in steady]
    low, high = ab.interval(steady, slower)
    assert low == pytest.approx(0.8) and high == pytest.approx(0.8)
    noisy = [rate * factor for rate, factor in zip(steady, [0.7, 1.3, 0.9, 1.2, 0.8, 1.1],
                                                    strict=True)]
    low, high = ab.interval(steady, noisy)
    ratio = statistics.median(noisy) / statistics.median(steady)
    assert low < ratio < high and high - low > 0.1
    assert ab.interval(steady, noisy) == (low, high)  # seeded: the same rounds, the same


def test_an_unknown_ref_is_refused() -> None:
    with pytest.raises(SystemExit, match="not a commit"):
        ab.resolve("no-such-ref-anywhere")


def test_the_suspects_measure_each_side(admin_url: str,
                                        capsys: pytest.CaptureFixture[str]) -> None:
    from bench import suspects

    suspects.main(["--blocks", "2", "--admin-url", admin_url])

    out = capsys.readouterr().out
    assert re.search(r"^convert: with comments \(\d+ chars\): \d+ us; sent today", out, re.M)
    assert re.search(r"^lock: plain: wall \d+ us, client CPU \d+ us per claim; lock bound",
                     out, re.M)
    assert re.search(r"^task-id: with task id: backend CPU \d+ us per job; without", out, re.M)


def test_the_harness_migrates_a_build_from_before_the_subpackages(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A base from before akadze_core's subpackages has its migrate in
    ``akadze_core.migrations``: the harness's ``db.migrate`` finds it there, and a module
    that exists but fails on an import of its own still fails."""
    import importlib
    import types

    from bench import db

    calls: list[object] = []
    old = types.SimpleNamespace(migrate=calls.append)
    real = importlib.import_module

    def older_build(name: str) -> object:
        if name == "akadze_core.store.migrations":
            raise ModuleNotFoundError("no akadze_core.store", name="akadze_core.store")
        if name == "akadze_core.migrations":
            return old
        return real(name)

    monkeypatch.setattr(importlib, "import_module", older_build)
    db.migrate("the connection")  # type: ignore[arg-type]
    assert calls == ["the connection"]

    def broken(name: str) -> object:
        raise ModuleNotFoundError("no croniter", name="croniter")

    monkeypatch.setattr(importlib, "import_module", broken)
    with pytest.raises(ModuleNotFoundError, match="croniter"):
        db.migrate("the connection")  # type: ignore[arg-type]
