"""``python -m bench.instructions`` counts a drain's client instructions a job under
callgrind (no figure asserted but that it is a count of a plausible size)."""

from __future__ import annotations

import shutil
import uuid
from pathlib import Path

import pytest

from bench import instructions


def test_the_count_a_job_is_the_difference_over_the_sizes() -> None:
    text = "==1== Events    : Ir\n==1== Collected : 1500\n"
    assert instructions.collected(text) == 1500
    assert instructions.collected(text + "==2== Collected : 2500\n") == 2500
    assert instructions.per_job((1500, 2500), (100, 200)) == 10
    with pytest.raises(RuntimeError, match="Collected"):
        instructions.collected("valgrind: command not found")


def test_bad_arguments_are_refused(capsys: pytest.CaptureFixture[str]) -> None:
    for argv in (["--only", "nothing"], ["--sizes", "500,100"], ["--sizes", "1"]):
        with pytest.raises(SystemExit) as exited:
            instructions.main(argv)
        assert exited.value.code == 2
    assert "--only takes ceiling, worker" in capsys.readouterr().err


@pytest.mark.skipif(shutil.which("valgrind") is None, reason="valgrind is not installed")
def test_the_ceiling_is_counted_on_a_real_drain(admin_url: str, tmp_path: Path) -> None:
    database = f"akadze_bench_test_{uuid.uuid4().hex[:8]}"
    figures = instructions.measure(admin_url, database, ("ceiling",), (64, 448), tmp_path)
    # Claims of 64 and their writes: tens of thousands of instructions a job, not millions.
    assert 10_000 < figures["ceiling"] < 1_000_000, figures
