"""Run ``celery_probe.py`` under Celery's interpreter and ours, for differential tests.

Celery is not one of our dependencies: it lives in a separate virtualenv whose Python is
``$CELERY_PYTHON`` (default: the one ``.ci/run`` builds, ``/tmp/akadze-celery-venv``). When it is
missing, cannot import Celery, or has a Celery other than 5.7, the differential tests are
skipped with the reason. Each interpreter runs the probe once per test session.
"""

from __future__ import annotations

import functools
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

#: The Celery release the facade is checked against.
CELERY_SERIES = "5.7."
#: The interpreter ``.ci/run`` (and the bench) build for Celery; CELERY_PYTHON overrides it.
DEFAULT_CELERY_PYTHON = "/tmp/akadze-celery-venv/bin/python"
PROBE = Path(__file__).with_name("celery_probe.py")
REPOSITORY = Path(__file__).resolve().parents[2]
TIMEOUT_SECONDS = 60


def celery_python() -> str:
    """The interpreter that has Celery installed."""
    return os.environ.get("CELERY_PYTHON", DEFAULT_CELERY_PYTHON)


def no_celery_reason(python: str) -> str:
    """The skip reason when ``python`` is missing: where it was looked for and how to make it."""
    return (f"no Celery interpreter at {python}: `bash .ci/run` builds it (python3 -m venv "
            f"/tmp/akadze-celery-venv && /tmp/akadze-celery-venv/bin/pip install "
            f"celery==5.7.0), or set CELERY_PYTHON")


def _run(python: str, *arguments: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [python, *arguments],
        capture_output=True,
        text=True,
        timeout=TIMEOUT_SECONDS,
        cwd=REPOSITORY,
        check=False,
    )


def _probe(python: str, package: str) -> dict[str, Any]:
    completed = _run(python, str(PROBE), package)
    if completed.returncode != 0:
        raise AssertionError(
            f"the probe failed under {python} for {package}:\n{completed.stderr[-3000:]}"
        )
    observed: dict[str, Any] = json.loads(completed.stdout)
    return observed


@functools.cache
def _celery_observations() -> tuple[dict[str, Any] | None, str]:
    """Celery's observations, or None and why they are unavailable (cached: one run)."""
    python = celery_python()
    if not Path(python).is_file():
        return None, no_celery_reason(python)
    version = _run(python, "-c", "import celery; print(celery.__version__)")
    if version.returncode != 0:
        return None, f"{python} cannot import celery: {version.stderr.strip()[-500:]}"
    found = version.stdout.strip()
    if not found.startswith(CELERY_SERIES):
        return None, f"{python} has Celery {found}; these tests compare with {CELERY_SERIES}x"
    return _probe(python, "celery"), ""


@functools.cache
def _our_observations() -> dict[str, Any]:
    # A subprocess for ours too: the probe rewires loggers and would leak into other tests.
    return _probe(sys.executable, "akadze_compat")


def observed(section: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """(Celery's, ours) observations of one probe section; skips when Celery is unavailable."""
    celery, reason = _celery_observations()
    if celery is None:
        pytest.skip(reason)
    ours = _our_observations()
    for name, observations in (("celery", celery), ("akadze_compat", ours)):
        error = observations[section].get("probe_error")
        assert error is None, f"probing {name} ({section}) failed:\n{error}"
    return celery[section], ours[section]


def probe_result(proc: subprocess.Popen[str], out: Path, what: str) -> dict[str, Any]:
    """What a probe subprocess wrote to ``out`` (JSON), once it ends (killed after 240 s);
    its stderr in the failure when it failed or wrote nothing."""
    try:
        _, stderr = proc.communicate(timeout=240)
    except subprocess.TimeoutExpired:
        proc.kill()
        _, stderr = proc.communicate()
    if proc.returncode != 0 or not out.exists():
        raise AssertionError(f"the {what} probe failed ({proc.returncode}):\n"
                             f"{stderr[-4000:]}")
    observed: dict[str, Any] = json.loads(out.read_text("utf-8"))
    return observed


def probe_results(*probes: tuple[subprocess.Popen[str], Path, str]) -> list[dict[str, Any]]:
    """``probe_result`` of each (process, output, what), in order: every process is waited
    for before a failure is raised, so a failed side never leaves the other running (its
    unclosed pipes then fail a later test in the same pytest worker)."""
    answers: list[dict[str, Any]] = []
    failures: list[str] = []
    for proc, out, what in probes:
        try:
            answers.append(probe_result(proc, out, what))
        except AssertionError as failure:
            failures.append(str(failure))
    if failures:
        raise AssertionError("\n".join(failures))
    return answers
