"""``python -m bench.worker_path`` runs the worker's own path per job without a database and
prints its pieces (no speed asserted: only that every run was logged as the worker logs it)."""

from __future__ import annotations

import io
import re
import sys

import pytest

from akadze_core.cli.base import SECRETS, stderr_logging
from bench import worker_path


def test_every_job_of_the_path_ends_with_the_workers_success_line(
        monkeypatch: pytest.MonkeyPatch) -> None:
    redactors = list(SECRETS.redactors)
    stderr = io.StringIO()
    monkeypatch.setattr(sys, "stderr", stderr)
    with stderr_logging("INFO"):
        figures = worker_path.measure(2 * worker_path.SLOTS)
    assert set(figures) == {"start", "run", "line"}
    assert all(value >= 0 for value in figures.values())
    lines = stderr.getvalue().splitlines()
    assert len(lines) == 2 * worker_path.SLOTS
    for job_id, line in enumerate(lines, 1):
        assert re.fullmatch(rf".* INFO akadze\.worker: job {job_id} bench\.noop succeeded "
                            r"in \d+\.\d{6}s \(attempt 1, success\)", line), line
    # The CLI's scrubbers are left as they were found.
    assert SECRETS.redactors == redactors


def test_the_command_prints_each_piece_per_job(capsys: pytest.CaptureFixture[str]) -> None:
    worker_path.main(["--jobs", "128", "--repeat", "1"])
    out = capsys.readouterr().out
    assert re.search(r"start [\d.]+ · run [\d.]+ · line [\d.]+ · total", out), out
