"""bench.hotpath runs each of its three cells at a tiny size, each on a private cluster of
its own, and computes every figure (the targets are for the real sizes: not asserted)."""

from __future__ import annotations

import tempfile
from pathlib import Path

import pytest

from bench import hotpath

pytestmark = pytest.mark.slow


def test_every_cell_runs_and_computes_its_figures(tmp_path: Path) -> None:
    if not (hotpath.DEFAULT_PG_BIN / "initdb").exists():
        pytest.skip(f"no Postgres 15 binaries in {hotpath.DEFAULT_PG_BIN}")
    results = tmp_path / "hotpath_results.md"
    options = hotpath.parse([
        "--drain-jobs", "3000", "--idle-rate", "100", "--idle-warmup", "4",
        "--idle-seconds", "8", "--idle-after", "4", "--window", "4",
        "--claim-history", "2000", "--claim-due", "600", "--claims", "40", "--slots", "16",
        "--results", str(results), "--run-dir", str(tmp_path / "run")])

    clusters_before = set(Path(tempfile.gettempdir()).glob("akadze-hotpath-pg-*"))
    code, figures = hotpath.run(options)

    assert code == 0, figures["errors"]
    drain = figures["drain"]
    assert drain.succeeded == 3000
    assert drain.first_rate > 0 and drain.last_rate > 0 and drain.ratio > 0
    assert drain.series and sum(rate for _, rate in drain.series) > 0
    assert any(s["tables"].get("jobs") for s in drain.stats)
    idle = figures["idle"]
    assert [w.phase for w in idle.windows] == ["warm-up", "held", "held", "after"]
    held = [w for w in idle.windows if w.phase == "held"]
    assert all(w.offered > 0 and w.completed > 0 and w.claims > 0 for w in held)
    assert all(w.claim_p99 is not None and w.pickup_p99 is not None for w in held)
    assert all(w.lag_p99 is not None for w in held)
    assert idle.held_claim_p99_worst is not None and idle.held_ratio > 0
    assert idle.horizon_xid > 0
    claim = figures["claim"]
    assert set(claim.results) == {"empty", "history", "unvacuumed"}
    assert all(r["claims"] == 40 and r["p50"] > 0 for r in claim.results.values())
    assert claim.history_drain is not None and claim.history_drain["succeeded"] == 2000
    assert claim.ratio_p50 > 0
    text = results.read_text()
    for figure in ("drain: last / first", "idle: worst claim p99 of a held window",
                   "claim: history / empty, p50", "Load average (1 min) during each cell"):
        assert figure in text
    assert (tmp_path / "run" / "hotpath.json").exists()
    # The private clusters are gone.
    assert set(Path(tempfile.gettempdir()).glob("akadze-hotpath-pg-*")) <= clusters_before
